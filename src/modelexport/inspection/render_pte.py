"""Terminal renderers for the .pte inspectors' dicts (`inspect --json` prints the dict itself)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .render_qnn import render_binary


def _io(ts: list[dict]) -> str:
    return ", ".join(f"{t.get('dtype')}{t.get('shape')}" if t.get("kind") == "Tensor" else t.get("kind", "?") for t in ts)


def render_pte(info: dict, console: Console, title: str | None = None) -> None:
    p = info["pte"] if "pte" in info else info
    h = p.get("header") or {}
    console.print(f"[bold]{title or 'pte'}[/] {info.get('path', '')}  {p['size']:,} B   program {h.get('program_size', p['size']):,} B"
                  f"   segments from {h.get('segment_base_offset', 0):,}   alignment {p.get('segment_alignment')}")
    for m in p["methods"]:
        calls = ", ".join(f"{k}×{v}" for k, v in m["delegate_calls"].items()) or "none"
        kernels = ", ".join(f"{k}×{v}" for k, v in m["kernel_calls"].items()) or "none"
        share = m.get("delegated_instruction_share")
        console.print(f"  [bold]method[/] {m['name']}   in: {_io(m['inputs'])}   out: {_io(m['outputs'])}")
        console.print(f"      delegate calls: {calls}   portable kernel calls: {kernels}"
                      + (f"   ({100 * share:.0f}% of instructions delegated)" if share is not None else ""))
    t = Table("method", "#", "backend", "where", "offset", "bytes", "alignment", header_style="bold")
    for d in p["delegates"]:
        t.add_row(d["method"], str(d["index"]), d["backend_id"], d["location"] + (f" {d['segment']}" if "segment" in d else ""),
                  f"{d.get('offset', ''):,}" if "offset" in d else "", f"{d.get('size', 0):,}", str(d.get("alignment", "")))
    console.print(t)
    for d in p["delegates"]:
        cb = (d.get("qnn") or {}).get("context_binary")
        if cb:
            console.print(f"  [bold]QNN context binary[/] of {d['method']}#{d['index']} ({d['qnn'].get('protocol')} header "
                          f"{d['qnn'].get('header_bytes')} B)")
            render_binary(cb, console)


def render_pte_bundle(info: dict, console: Console) -> None:
    m = info["manifest"]
    console.print(f"[bold]bundle[/] {info['path']}  ({m.get('format')}, {m.get('precision')}, targets "
                  f"{', '.join(m.get('targets', []))}, QAIRT {m.get('qairt_build')})")
    s = info.get("placement_summary") or {}
    if s:
        console.print(f"  placement  {s.get('nodes')} nodes: " + ", ".join(f"{k} {v}" for k, v in s.get("by_runtime", {}).items())
                      + (f"   ({100 * s['htp_share']:.1f}% on the HTP)" if s.get("htp_share") is not None else ""))
    num = m.get("numerics") or {}
    for o in num.get("outputs", []):
        console.print(f"  numerics   {o['name']}: SQNR {o['sqnr_db']:.2f} dB, cosine {o['cosine']:.5f}, max abs err "
                      f"{o['max_abs_error']:.4g} (pass mark {num.get('threshold_db')} dB, {num.get('samples')} sample(s))")
    for rel, p in info.get("ptes", {}).items():
        render_pte({"pte": p, "path": rel}, console, title="pte")
    integ = info["integrity"]
    console.print("[green]integrity OK[/]: every file matches its sha256" if integ["ok"] else
                  "\n".join(f"[bold red]integrity FAIL[/] {x}" for x in integ["problems"]))


RENDERERS = {"pte": render_pte, "pte-bundle": render_pte_bundle}
