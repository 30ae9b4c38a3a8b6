from __future__ import annotations

from pathlib import Path

import typer
from rich.pretty import Pretty
from rich.table import Table

from ...errors import IntegrityError
from ...inspection import inspect_path
from ...inspection.render_qnn import RENDERERS as QNN_RENDERERS
from ..app import app, console, emit_json


def _render_bundle(info: dict) -> None:
    m = info["manifest"]
    console.print(f"[bold]bundle[/] {info['path']}  (schema {m.get('schema_version')}, {m.get('kind')})")
    src = m.get("source", {})
    console.print(f"  source     {src.get('path')}  sha256 {str(src.get('sha256'))[:16]}…  ({src.get('format')})")
    console.print(f"  targets    {', '.join(m.get('targets', [])) or '-'}   HTP arch {m.get('htp_arch') or '-'}")
    console.print(f"  precision  {m.get('precision')}   format {m.get('format')}   QAIRT {m.get('qairt_build')}")
    console.print("  versions   " + ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items()))
    for g in m.get("graphs", []):
        console.print(f"  [bold]graph[/] {g['name']}  ({g.get('kind')}, {g.get('file')}, {g.get('target') or ''})")
        for direction in ("inputs", "outputs"):
            for t in g.get(direction, []):
                enc = t.get("encoding") or {}
                q = f"  scale {enc.get('scale')} zp {enc.get('zero_point')}" if enc.get("scale") is not None else ""
                console.print(f"      {direction[:-1]:6} {t['name']}  {t['shape']}  {t['dtype']}{q}")
    table = Table("file", "role", "bytes", "sha256", header_style="bold")
    for f in m.get("files", []):
        table.add_row(f["path"], f.get("role", ""), f"{f['size']:,}", f["sha256"][:16] + "…")
    console.print(table)
    integ = info["integrity"]
    if integ["ok"]:
        console.print("[green]integrity OK[/]: every file matches its sha256")
    else:
        for p in integ["problems"]:
            console.print(f"[bold red]integrity FAIL[/] {p}")


RENDERERS = {"bundle": _render_bundle}
RENDERERS.update({k: (lambda f: lambda info: f(info, console))(f) for k, f in QNN_RENDERERS.items()})


@app.command()
def inspect(
    path: Path = typer.Argument(..., help="A bundle folder, context binary (.bin), EPContext .onnx, .pte or .gguf."),
    json_out: bool = typer.Option(False, "--json", help="Print everything as JSON."),
) -> None:
    """Show what an artifact holds: graphs, inputs and outputs with their encodings, target and
    HTP arch, QAIRT build, sizes. For bundles every file's sha256 is checked (exit 4 on mismatch)."""
    info = inspect_path(path)
    if json_out:
        emit_json(info)
    else:
        RENDERERS.get(info["kind"], lambda i: console.print(Pretty(i)))(info)
    integ = info.get("integrity")
    if integ and not integ["ok"]:
        raise IntegrityError(f"{path} does not match its manifest ({len(integ['problems'])} problem(s))",
                             "rebuild the bundle; do not edit files inside it")
