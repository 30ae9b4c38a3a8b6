from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from ...core.atomic import atomic_file, check_output
from ..app import app, console, emit_json, progress


@app.command("run")
def run_cmd(
    bundle: Path = typer.Argument(..., help="A bundle written by `modelexport compile`."),
    input: list[str] | None = typer.Option(None, "--input", "-i", help="x.npy (single input), NAME=x.npy, or inputs.npz (repeatable)."),
    random: bool = typer.Option(False, "--random", help="Random inputs of the compiled shapes."),
    part: str | None = typer.Option(None, "--part", help="Which model of a multi-model bundle."),
    target: str | None = typer.Option(None, "--target", "-t", help="Which target's binary (bundles with several)."),
    perf_profile: str | None = typer.Option(None, "--perf-profile", help="HTP performance mode (htp_performance_mode): burst, "
                                               "sustained_high_performance, high_performance, balanced, power_saver, ... "
                                               "(on the x86 simulator it is accepted but does not change timings). Default: not set (the QNN EP's own 'default' mode)."),
    repeat: int = typer.Option(1, "--repeat", help="Run this many times (timings per run)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Folder to write each output as NAME.npy (atomically)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output folder."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run a compiled graph on the HTP simulator (libQnnHtp.so on x86: real numerics, timings say
    nothing about a phone) and write its outputs."""
    import numpy as np

    from ...api import run as api_run   # deferred: ~8 ms on every CLI start (api loads backends.spec, frontends)
    if output is not None:
        check_output(output, force)
    with progress("running on the HTP simulator", enabled=not json_out):
        result = api_run(bundle, input, random, part, target, perf_profile, repeat)
    written = []
    if output is not None:
        with atomic_file(output, force) as tmp:
            tmp.mkdir()
            for name, arr in result.outputs.items():
                safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
                np.save(tmp / f"{safe}.npy", arr)
                written.append(str(output / f"{safe}.npy"))
    summary = result.summary() | {"written": written, "perf_profile": perf_profile}
    if json_out:
        emit_json(summary)
        return
    table = Table("output", "shape", "dtype", "min", "max", "argmax", header_style="bold")
    for name, o in summary["outputs"].items():
        table.add_row(name, str(o["shape"]), o["dtype"], f"{o['min']:.4g}", f"{o['max']:.4g}", str(o.get("argmax")))
    console.print(table)
    console.print(f"{result.part} on {result.target} (simulator): load {result.load_seconds:.3f} s, run "
                  + ", ".join(f"{t:.3f}" for t in result.run_seconds) + " s")
    for w in written:
        console.print(f"  wrote {w}")
