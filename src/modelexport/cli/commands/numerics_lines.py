"""Compile's own numerics check as the compile summary prints it (ONNX, PyTorch and LLM bundles alike):
a pass line, or a warning with its fix; nothing when the bundle records no check."""
from __future__ import annotations

from rich.markup import escape

from ...core.numerics_advice import numerics_fix_for, numerics_line
from ..app import console


def print_numerics(num: dict, quantized: bool) -> None:
    if num.get("not_checked"):
        console.print(f"numerics: not checked ({escape(num['not_checked'])})")
        return
    if not (num.get("outputs") or num.get("run_error")):
        return
    if num.get("passed") is not False:
        console.print(f"numerics: [green]pass[/] {escape(numerics_line(num))}")
        return
    what = "numerics not checked" if num.get("run_error") else "numerics below the pass mark"
    console.print(f"[yellow]warning[/]: {what}: {escape(numerics_line(num))}; "
                  "the bundle is written (--strict-numerics refuses it, exit 7)")
    console.print(f"  fix: {escape(numerics_fix_for(num, quantized))}")
