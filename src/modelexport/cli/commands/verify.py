from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ...core.atomic import atomic_file, check_output
from ...core.errors import VerificationError
from ..app import app, console, emit_json, progress
from ..per_layer_view import print_per_layer


@app.command("verify")
def verify_cmd(
    bundle: Path = typer.Argument(..., help="A bundle written by `modelexport compile`."),
    input: list[str] | None = typer.Option(None, "--input", "-i", help="Inputs to compare on (default: the calibration samples stored in the bundle)."),
    part: str | None = typer.Option(None, "--part", help="Only this model of a multi-model bundle (default: every model)."),
    target: str | None = typer.Option(None, "--target", "-t", help="Only this target (default: every target)."),
    min_sqnr: float | None = typer.Option(None, "--min-sqnr", help="Pass mark in dB (default per precision: fp16 35, 8a8w 15, "
                                             "16a8w 18, 16a16w 25, 16a4w 5)."),
    samples: int | None = typer.Option(None, "--samples", help="Use at most this many stored samples (default: all of them)."),
    report: Path | None = typer.Option(None, "--report", help="Also write the report as JSON (atomically)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --report file."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    per_layer: bool = typer.Option(False, "--per-layer", help="Also compare every layer of the float model with the quantized "
                                   "one (fake-quant on the CPU), name the first layer below --threshold-db and suggest an "
                                   "--override; recorded in the bundle's manifest and report.html."),
    threshold_db: float | None = typer.Option(None, "--threshold-db", help="Per-layer pass mark in dB (default: the "
                                                 "precision's pass mark)."),
) -> None:
    """Run the float model on ONNX Runtime's CPU EP and the compiled graph on the HTP simulator on
    the same inputs; report SQNR (dB), cosine similarity and max abs error per output. Exits 5
    when an output is below the pass mark."""
    from ...api import verify as api_verify   # deferred: ~8 ms on every CLI start (api loads backends.spec, frontends)
    if report is not None:
        check_output(report, force)
    layers = None
    if per_layer:
        from ...runtime.per_layer_verify import per_layer_verify   # deferred: ~18 ms on every CLI start (runtime), for --per-layer alone
        with progress("per layer: float vs fake-quant on CPU; outputs: compiled on the HTP simulator", enabled=not json_out):
            rep, layers = per_layer_verify(bundle, input, part, target, threshold_db, min_sqnr, samples)
    else:
        with progress("float on CPU vs compiled on the HTP simulator", enabled=not json_out):
            rep = api_verify(bundle, input, part, target, min_sqnr, samples)
    data = rep.to_dict()
    if layers is not None:
        data["per_layer"] = [pl.to_dict() for pl in layers]
    if report is not None:
        with atomic_file(report, force) as tmp:
            tmp.write_text(json.dumps(data, indent=2))
    if json_out:
        emit_json(data)
    else:
        table = Table("part", "target", "precision", "output", "SQNR dB", "cosine", "max abs err", "argmax agree", "pass mark", "",
                      header_style="bold")
        for g in rep.graphs:
            for o in g.outputs:
                table.add_row(g.part, g.target, g.precision, o.name, f"{o.sqnr_db:.2f}", "n/a" if o.cosine is None else f"{o.cosine:.5f}", f"{o.max_abs_error:.4g}",
                              "" if o.argmax_agreement is None else f"{100 * o.argmax_agreement:.0f}%", f"{g.threshold_db:g}",
                              "[green]PASS[/]" if o.passed else "[red]FAIL[/]")
        console.print(table)
        for g in rep.graphs:
            console.print(f"  {g.part}@{g.target}: {g.samples} sample(s), inputs: {g.inputs_kind}")
        for w in rep.warnings:
            console.print(f"  [yellow]warning[/]: {escape(w)}")
        if layers is not None:
            print_per_layer(layers)
    if not rep.passed:
        bad = [f"{g.part}@{g.target}:{o.name} {o.sqnr_db:.1f} dB < {g.threshold_db:g}" for g in rep.graphs for o in g.outputs if not o.passed]
        hint = next((pl.suggestion for pl in layers or [] if pl.suggestion), None)
        raise VerificationError("compiled outputs differ from the float model: " + "; ".join(bad), rep.failure_fix(hint))
