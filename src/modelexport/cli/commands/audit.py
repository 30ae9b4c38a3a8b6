from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ...core.errors import StrictFallbackError
from ...auditing.report import graph_refused_error
from ..app import STATUS_STYLE, app, console, emit_json, option, progress


def _fmt_macs(n: int) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


INPUT_SHAPE = option("input_shapes", panel=False)     # compile's --input-shape


@app.command()
def audit(
    model: Path = typer.Argument(..., help="The ONNX model, or a PyTorch model: model.py:factory or a .pt2."),
    target: str = typer.Option("SM8650", "--target", "-t", help="SoC to audit for (SM8650, 8gen3, ...; see `modelexport targets`)."),
    precision: str = typer.Option("fp16", "--precision", "-p", help="fp16, 8a8w, 16a8w, 16a16w or 16a4w (quantized precisions are "
                                  "audited on a QDQ model calibrated with random data: placement does not depend on the values)."),
    input_shape: list[str] | None = INPUT_SHAPE,
    input_value: list[str] | None = typer.Option(None, "--input-value", help="ONNX: fix an input to a constant, NAME=VALUE "
                                                    "(folds If on it, e.g. sr=16000; repeatable)."),
    strict: bool = typer.Option(False, "--strict", help="Exit non-zero (3) when any node falls back to the CPU."),
    show_all: bool = typer.Option(False, "--all", help="List every node, not only those off the HTP (also those ONNX Runtime's optimizer folded away)."),
    log: Path | None = typer.Option(None, "--log", help="Keep the QNN EP's verbose log in this file."),
    calibration: str | None = typer.Option(None, "--calibration", "-c", help="PyTorch models: calibration data for a quantized "
                                              "--precision (default random: placement does not depend on the values)."),
    override: list[str] | None = typer.Option(None, "--override", help="PyTorch models: 'REGEX=PRECISION' per-module precision (repeatable)."),
    block_size: int | None = typer.Option(None, "--block-size", help="PyTorch models, 16a4w_block: input channels per scale (default 64)."),
    rewrite: list[str] | None = typer.Option(None, "--rewrite", help="PyTorch models: apply an opt-in rewrite pass first (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print the full report as JSON."),
) -> None:
    """Ask the real QNN EP which nodes the HTP takes: node, op type, module path, HTP/CPU, the
    validator's reason for each CPU node (from the EP's own log) and a suggested fix; totals of
    nodes and MACs on HTP vs CPU."""
    from ...api import audit as run_audit   # deferred: ~8 ms on every CLI start (api loads backends.spec, frontends)
    with progress(f"placing {model.name} on the QNN EP for {target} ({precision})", enabled=not json_out):
        extra = {k: v for k, v in {"overrides": override, "block_size": block_size, "rewrites": rewrite,
                                   "input_values": input_value}.items() if v not in (None, [], ())}
        if calibration is not None:
            extra["calibration"] = calibration
        report = run_audit(model, target=target, precision=precision, input_shapes=input_shape, log_path=log, **extra)
    tot = report.totals()
    if json_out:
        emit_json(report.to_dict())
    else:
        # by default what a user acts on: the nodes off the HTP; not those the optimizer removed (--all lists them)
        rows = [n for n in report.nodes if show_all or n.backend not in ("HTP", "folded")]
        if rows:
            table = Table("node", "op", "module", "runs on", "reason", "fix", "MACs", header_style="bold", show_lines=True)
            for n in rows:
                table.add_row(escape(n.name), n.op_type, escape(n.module_path or ""),
                              f"[{STATUS_STYLE.get(n.backend, 'dim')}]{n.backend}[/]",
                              escape(n.reason or ""), escape(n.fix or ""), _fmt_macs(n.macs))
            console.print(table)
        by = tot["by_backend"]
        macs = tot["macs"]
        console.print(f"[bold]{report.model}[/] on {report.target} (HTP V{report.htp_arch}, {report.precision}, QAIRT {report.qairt_build})")
        if report.refused:
            console.print(f"  nodes: {by.get('blocks', 0)} block the graph (nothing compiles until they are fixed)")
        else:
            console.print(f"  nodes: {by.get('HTP', 0)} on HTP, {by.get('CPU', 0)} on CPU"
                          + (f", {by.get('io', 0)} graph-IO (de)quantize on CPU by design" if by.get("io") else "")
                          + (f", {by.get('folded', 0)} folded by the optimizer" if by.get("folded") else ""))
            console.print(f"  MACs:  {_fmt_macs(macs.get('HTP', 0))} on HTP, {_fmt_macs(macs.get('CPU', 0))} on CPU"
                          + (f" ({100 * tot['htp_mac_share']:.1f}% on HTP)" if tot["htp_mac_share"] is not None else ""))
        for note in report.notes:
            console.print(f"  [yellow]note[/]: {note}")
        if report.refused:
            console.print(f"[bold red]QNN refused to build the graph ({escape(report.refused)})[/]")
        else:
            console.print("[bold green]every compute node runs on the HTP[/]" if report.ok else
                          f"[bold red]{len(report.fallbacks)} node(s) fall back to the CPU[/]")
    if report.refused:
        raise graph_refused_error(report)
    if strict and not report.ok:
        ops = ", ".join(f"{k}×{v}" for k, v in tot["fallback_ops"].items())
        raise StrictFallbackError(f"--strict: {len(report.fallbacks)} node(s) fall back to the CPU ({ops})",
                               "see the reasons and fixes above (or --json), change the model, then audit again")
