from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ...core.atomic import check_output
from ..app import app, console, emit_json, progress


@app.command("profile")
def profile_cmd(
    bundle: Path = typer.Argument(..., help="A bundle written by `modelexport compile` (context-binary; .pte: see below)."),
    runs: int = typer.Option(5, "--runs", help="Measured runs (after one warm-up); per op the median is reported."),
    level: str = typer.Option("basic", "--level", help="QNN EP profiling_level: basic (per-graph totals) or detailed "
                              "(cycles per QNN node)."),
    input: list[str] | None = typer.Option(None, "--input", "-i", help="x.npy, NAME=x.npy or inputs.npz (default: the "
                                              "bundle's first stored verify sample)."),
    part: str | None = typer.Option(None, "--part", help="Which model of a multi-model bundle."),
    target: str | None = typer.Option(None, "--target", "-t", help="Which target's binary."),
    trace: Path | None = typer.Option(None, "--trace", help="Write a Chrome/Perfetto trace JSON (ui.perfetto.dev)."),
    keep: Path | None = typer.Option(None, "--keep", help="Keep the raw QNN EP CSV and ORT profile JSON in this folder."),
    top: int = typer.Option(25, "--top", help="Rows to print (all rows in --json).", min=1),
    force: bool = typer.Option(False, "--force", help="Replace an existing --trace file."),
    json_out: bool = typer.Option(False, "--json", help="Print the profile as JSON."),
) -> None:
    """Run the compiled graph on the HTP simulator with QNN profiling on (the QNN EP's
    profiling_level / profiling_file_path, plus ONNX Runtime's own profiler for nodes on the CPU EP)
    and print a per-op table: CPU-fallback ops first, ranked by cost, then HTP ops. Simulator times
    rank ops within one model; they are not phone latencies.

    A .pte bundle is profiled through ExecuTorch's ETDump: delegate calls and CPU kernels are timed,
    ops inside the QNN delegate are not (the pip runtime's ETDump holds no events from inside it)."""
    from ...runtime.runners import profile_bundle   # deferred: ~19 ms on every CLI start (runtime.runners)
    if trace is not None:
        check_output(trace, force)
    with progress(f"profiling on the HTP simulator ({level}, {runs} runs)", enabled=not json_out):
        rep = profile_bundle(bundle, runs, level, part, target, input, trace, keep)
    if json_out:
        emit_json(rep.to_dict())
        return
    table = Table("#", "op (QNN / ORT node)", "op type", "runs on", "time µs", "cycles", "share", header_style="bold")
    table.columns[1].overflow = "fold"
    shown = [r for r in rep.rows if r.time_us > 0 or r.backend != "HTP"]
    for i, r in enumerate(shown[:top], 1):
        style = "red" if r.backend == "CPU fallback" else ("green" if r.backend.startswith("HTP") else "")
        table.add_row(str(i), escape(r.name), escape(r.op_type), f"[{style}]{r.backend}[/]" if style else r.backend,
                      f"{r.time_us:,.1f}", "" if r.cycles is None else f"{r.cycles:,}", f"{100 * r.share:.1f}%")
    console.print(table)
    hidden = len(rep.rows) - min(len(shown), top)
    if hidden > 0:
        console.print(f"  ({hidden} more row(s): --top N or --json; zero-cycle QNN nodes are not printed)")
    t = rep.totals
    fb = rep.cpu_fallbacks
    if rep.level == "etdump":
        console.print(f"  {rep.part}@{rep.target}, ExecuTorch ETDump, {rep.runs} run(s), inputs: {t['inputs']}; "
                      f"Method::execute median {t.get('Method::execute_ms_median')} ms")
    else:
        console.print(f"  {rep.part}@{rep.target}, level {rep.level}, {rep.runs} run(s), inputs: {t['inputs']}; "
                      f"QNN execute median {t['qnn_execute_us_median'] / 1000:.1f} ms"
                      + (f", {t['qnn_accelerator_cycles_median']:,.0f} cycles" if t.get("qnn_accelerator_cycles_median") else ""))
    if fb:
        console.print(f"  [red]{len(fb)} CPU fallback op(s)[/], {100 * t['cpu_fallback_share']:.1f}% of the time; costliest: "
                      + escape(", ".join(f"{r.name} ({r.op_type}, {r.time_us:,.0f} µs)" for r in fb[:3]))
                      + " — `modelexport audit` gives the reason and fix")
    else:
        console.print("  [green]no CPU fallback[/]" + ("" if rep.level == "etdump" else " (graph-IO (de)quantize stays on the CPU by design)"))
    for w in rep.warnings:
        console.print(f"  [yellow]warning[/]: {escape(w)}")
    for k, v in rep.files.items():
        console.print(f"  {k}: {v}")
    console.print(f"  [bold]note[/]: {rep.note}")
