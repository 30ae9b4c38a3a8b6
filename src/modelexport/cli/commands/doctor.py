from __future__ import annotations

import typer
from rich.table import Table

from ..app import STATUS_STYLE, app, console, emit_json, progress


@app.command()
def doctor(json_out: bool = typer.Option(False, "--json", help="Print the checks as JSON.")) -> None:
    """Check this machine: Python, torch/executorch/onnxruntime versions, QAIRT, a real run on the
    HTP simulator, gcc, and optional on-device tools. Exits non-zero when a required check fails."""
    with progress("checking the toolchain (runs a tiny graph on the HTP simulator)", enabled=not json_out):
        from ... import doctor as doctor_checks   # deferred: ~14 ms on every CLI start (the toolchain's checks)
        results = doctor_checks.run_checks()
    healthy = doctor_checks.healthy(results)
    if json_out:
        emit_json({"ok": healthy, "checks": [c.to_dict() for c in results]})
    else:
        table = Table(show_header=True, header_style="bold")
        for col in ("check", "status", "detail"):
            table.add_column(col)
        for c in results:
            detail = c.detail + (f"\n[bold]fix:[/] {c.fix}" if c.fix and c.status != "OK" else "")
            table.add_row(c.name, f"[{STATUS_STYLE[c.status]}]{c.status}[/]", detail)
        console.print(table)
        console.print("[bold green]ready[/]" if healthy else "[bold red]not ready: fix the FAIL lines above[/]")
    if not healthy:
        raise typer.Exit(1)
