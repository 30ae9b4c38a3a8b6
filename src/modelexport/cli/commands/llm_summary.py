"""The `compile` summary of an LLM bundle (graphs, weight sharing, parts, Genie check)."""
from __future__ import annotations

from rich.table import Table

from ..app import console, emit_json


def llm_summary(bundle, json_out: bool) -> None:
    m = bundle.manifest
    llm = m.extra.get("llm", {})
    if json_out:
        emit_json({"bundle": str(bundle.path), "kind": "llm", "targets": m.targets, "htp_arch": m.htp_arch,
                   "precision": m.precision, "qairt_build": m.qairt_build,
                   "graphs": [g.model_dump(exclude_none=True) for g in m.graphs],
                   "files": [f.model_dump() for f in m.files], "llm": llm, "parameters": m.extra.get("parameters"),
                   "cache": m.extra.get("cache"), "timings": m.extra.get("timings")})
        return
    table = Table("graph", "target", "HTP arch", "layers", "QNN graph", "const B", "shared weights B", "est. MB",
                  header_style="bold")
    for g in m.graphs:
        e = g.extra
        table.add_row(g.name, g.target or "-", f"V{g.htp_arch}" if g.htp_arch else "-", f"{e['layers'][0]}-{e['layers'][1] - 1}",
                      str(e.get("qnn_graph_name")), f"{e.get('const_bytes') or 0:,}", f"{e.get('shared_weights_bytes') or 0:,}",
                      str(e.get("memory_estimate", {}).get("total_mb")))
    console.print(table)
    for key, ws in llm.get("weight_sharing", {}).items():
        console.print(f"  {ws['file']}: {len(ws['graphs'])} graphs, weights stored once "
                      f"({ws['shared_weights_bytes']} B shared), {ws['bytes']:,} B vs {ws['unshared_twins_bytes']:,} B unshared")
    if llm.get("split_note"):
        console.print(f"[yellow]note[/]: {llm['split_note']}")
    for t, g in llm.get("genie", {}).items():
        console.print(f"  Genie accepts {g['file']} ({t})")
    console.print(f"  {llm.get('bytes_per_parameter')} bytes per parameter on the device "
                  f"({llm.get('device_bytes', 0):,} B for {m.extra.get('parameters', 0):,} parameters)")
    console.print(f"[bold green]bundle[/] {bundle.path}  (QAIRT {m.qairt_build}, {m.extra.get('timings', {}).get('total_s')} s"
                  f"{', cached' if m.extra.get('cache', {}).get('quantize_hit') else ''})")
