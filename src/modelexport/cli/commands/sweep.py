from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..app import app, console, emit_json, progress


def _fmt(v, spec: str = "{:g}") -> str:
    return "-" if v is None else spec.format(v)


def _summary(results: dict) -> None:
    table = Table("target", "model", "precision", "status", "HTP share", "worst SQNR dB", "numerics", "device bytes",
                  "bytes/param", "compile s", header_style="bold")
    for r in results["cells"]:
        status = ("[green]compiled[/]" + (" (reused)" if r.get("reused") else "")) if r["status"] == "compiled" \
            else f"[red]failed[/]: {escape(r.get('reason') or '')}"
        table.add_row(r["target"], ("★ " if r.get("ship") else "") + r["model"], r["precision"], status,
                      _fmt(r.get("htp_share"), "{:.1%}"), _fmt(r.get("sqnr_db"), "{:.1f}"), r.get("numerics") or "-",
                      _fmt(r.get("bytes"), "{:,}"), _fmt(r.get("bytes_per_param"), "{:.3f}"), _fmt(r.get("compile_s"), "{:.1f}"))
    console.print(table)
    s = results["summary"]
    console.print(f"[bold]{s['compiled']}[/] of {s['cells']} cells compiled ({s['reused']} reused), "
                  + (f"[red]{s['failed']} failed[/]" if s["failed"] else "none failed")
                  + f"; ran on {results['run']['executor']} in {results['run']['wall_s']:.1f} s")
    for target, models in results["ship"].items():
        console.print(f"  ship on {target}: " + ", ".join(f"{m} {p or '[red](nothing passed)[/]'}" for m, p in models.items()))
    console.print(f"[bold green]results[/] {results['output']}/results.json, results.csv, report.html")


@app.command("sweep")
def sweep_cmd(
    matrix: Path = typer.Argument(..., help="The matrix file (.yaml or .json): models, targets, precisions."),
    output: Path = typer.Option(..., "--output", "-o", help="The folder of the sweep: one bundle per cell in "
                                "OUT/<model>/<target>/<precision>/, and results.json, results.csv, report.html."),
    force: bool = typer.Option(False, "--force", help="Compile every cell again (without it a re-run only does the "
                               "missing and failed cells)."),
    workers: int | None = typer.Option(None, "--workers", "-w", help="Cells at a time (local: spawned processes, "
                                          "default the number of cores; Ray: default the cluster's CPUs)."),
    ray: str | None = typer.Option(None, "--ray", help="Run each cell as a Ray task on this cluster: HOST:PORT of "
                                      "its head, ray://HOST:10001, or auto (the cluster `ray start` made on this machine). "
                                      "Every node needs modelexport, the model paths, OUT and the cache "
                                      "(MODELEXPORT_CACHE_DIR) at the same paths. Default: not set, cells run in local processes."),
    json_out: bool = typer.Option(False, "--json", help="Print the results (as in results.json) as JSON."),
) -> None:
    """Compile a matrix of models × SoCs × precisions: one bundle per cell (the same compile as
    `modelexport compile`), then a table sorted so what to ship per SoC is on top (★): status or
    why not, share on the HTP, worst SQNR vs float, device bytes and bytes/param, compile time.

    Matrix file (paths relative to it; every problem in it is listed at once, before any work):

        models:
          - conv.onnx
          - {path: model.py:build, name: tiny, calibration: calib/, options: {strict: true}}
        targets: [SM8650, SM8750]
        precisions: [fp16, 8a8w, {name: 16a4w_block, max_ppl_ratio: 1.05}]
        options: {optimization_level: 3}

    A model entry takes path, name, calibration, overrides, input_shapes, input_values and
    options (any `compile` option by its Python name); max_ppl_ratio applies to LLMs."""
    from ...api import sweep   # deferred: ~8 ms on every CLI start (api loads backends.spec, frontends)
    with progress("sweeping", enabled=not json_out) as bar:
        def report(msg: str, done: float, total: float) -> None:
            bar.update(description=msg, completed=done, total=total)
        results = sweep(matrix, output, force=force, workers=workers, ray=ray, progress=report)
    if json_out:
        emit_json(results)
        return
    _summary(results)
