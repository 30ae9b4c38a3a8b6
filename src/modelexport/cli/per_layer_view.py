"""How `verify --per-layer` prints (not a verb: a helper of verify.py)."""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from .app import console


def print_per_layer(layers) -> None:
    for pl in layers:
        table = Table("#", "layer (module path)", "op", "SQNR dB", "cosine", "", header_style="bold",
                      title=f"{pl.part} ({pl.precision}): float vs fake-quant, layer by layer, {pl.samples} sample(s)")
        for i, x in enumerate(pl.layers, 1):
            mark = "[red]< pass mark[/]" if x.sqnr_db < pl.threshold_db else ""
            if x.name == pl.first_bad_layer:
                mark = "[bold red]first below[/]"
            if x.name == pl.culprit_layer:
                mark += " [yellow]largest drop[/]"
            table.add_row(str(i), escape(x.name), x.op_type, f"{x.sqnr_db:.2f}", "n/a" if x.cosine is None else f"{x.cosine:.4f}", mark)
        console.print(table)
        if pl.first_bad_layer:
            console.print(f"  first layer below {pl.threshold_db:g} dB: [bold]{escape(pl.first_bad_layer)}[/]; the largest drop "
                          f"before it is at {escape(pl.culprit_layer or '?')}")
            console.print(f"  suggested fix: recompile with [bold]{escape(pl.suggestion)}[/] (then run verify --per-layer again)")
        else:
            console.print(f"  every layer is at or above {pl.threshold_db:g} dB")
        console.print("  per-layer numbers: float ONNX vs its QDQ model on the CPU EP; per-output numbers above: the compiled "
                      "graph on the HTP simulator. Recorded in manifest.numerics and report.html.")
