from __future__ import annotations

import json
from pathlib import Path

import typer

from ...contract.bundle import is_bundle, open_bundle, refresh_report
from ...contract.report import build_report
from ...core.atomic import atomic_file
from ...core.errors import InputError
from ..app import app, console, emit_json


@app.command()
def report(
    bundle: Path = typer.Argument(..., help="A bundle folder written by `modelexport compile`, or the folder of a `modelexport sweep`."),
    output: Path = typer.Option(None, "-o", "--output", help="Write the HTML here instead of the bundle's report.html."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --output file."),
    json_out: bool = typer.Option(False, "--json", help="Print where the report went as JSON."),
) -> None:
    """Rebuild the bundle's self-contained report.html (target, placement, audit with fixes,
    numerics, sizes, LLM decode ceiling), or a sweep's report.html from its results.json (what to
    ship per SoC, every cell, the failed ones). Open it in any browser; it needs no network."""
    if (bundle / "results.json").is_file() and not is_bundle(bundle):
        _sweep_page(bundle, output, force, json_out)
        return
    b = open_bundle(bundle)
    if output:
        with atomic_file(output, force=force) as tmp:
            tmp.write_text(build_report(b.manifest, b.path), encoding="utf-8")
        path = output
    else:
        path = refresh_report(b)
    if json_out:
        emit_json({"report": str(path)})
    else:
        console.print(f"report written to [bold]{path}[/]")


def _sweep_page(folder: Path, output: Path | None, force: bool, json_out: bool) -> None:
    from ...sweeping.page import build_page, write_page   # deferred: pydantic, jinja2 (~120 ms) on every CLI start
    try:
        results = json.loads((folder / "results.json").read_text())
        page = build_page(results)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{folder / 'results.json'} is not a sweep's results file ({type(e).__name__}: {e})",
                         "run `modelexport sweep MATRIX -o FOLDER` again to rewrite it") from None
    if output:
        with atomic_file(output, force=force) as tmp:
            tmp.write_text(page, encoding="utf-8")
        path = output
    else:
        path = write_page(folder, results)
    if json_out:
        emit_json({"report": str(path)})
    else:
        console.print(f"report written to [bold]{path}[/]")
