"""Terminal renderers for the QNN inspectors' dicts (the `--json` output is the dict itself)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _enc(q: dict | None) -> str:
    if not q:
        return ""
    if q.get("scale") is not None:
        return f"scale {q['scale']:.6g} zp {q.get('zero_point')}"
    if q.get("scales"):
        return f"per-axis {q.get('axis')} ({len(q['scales'])} scales)"
    return q.get("encoding", "")


def render_binary(b: dict, console: Console) -> None:
    console.print(f"  target     {b.get('soc_name') or '?'} (soc_model {b.get('soc_model')})   HTP arch {b.get('htp_arch')}   "
                  f"VTCM {b.get('vtcm_mb')} MB")
    console.print(f"  QAIRT      {b.get('build_id')}  (core API {b.get('core_api_version')}, backend API {b.get('backend_api_version')})"
                  f"   backend {b.get('backend')}")
    console.print(f"  size       {b.get('file_size', 0):,} B   sha256 {str(b.get('sha256'))[:16]}…")
    for g in b.get("graphs", []):
        htp = g.get("htp") or {}
        console.print(f"  [bold]graph[/] {g['name']}   VTCM {htp.get('vtcm_mb')} MB  opt level {htp.get('optimization_level')}  "
                      f"const {htp.get('const_size')} B  spill-fill {htp.get('spill_fill_buffer_size')} B")
        t = Table("dir", "tensor", "shape", "dtype", "quantization", header_style="bold")
        for d in ("inputs", "outputs"):
            for x in g.get(d, []):
                t.add_row(d[:-1], x["name"], str(x["shape"]), x["dtype"], _enc(x.get("quantization")))
        console.print(t)


def render_context_binary(info: dict, console: Console) -> None:
    console.print(f"[bold]context binary[/] {info['path']}")
    render_binary(info["binary"], console)


def render_epcontext(info: dict, console: Console) -> None:
    console.print(f"[bold]EPContext model[/] {info['path']}")
    for n in info.get("epcontext_nodes", []):
        where = n.get("cache_path") if n.get("embed_mode") == 0 else f"embedded ({n.get('embedded_size')} B)"
        console.print(f"  node {n['name']}  embed_mode {n['embed_mode']}  binary {where}  ({n.get('ep_sdk_version') or ''})")
    render_binary(info["binary"], console)


def render_onnx(info: dict, console: Console) -> None:
    console.print(f"[bold]ONNX model[/] {info['path']}  ({info['size']:,} B, {info['nodes']} nodes, opset {info['opset']})")
    for d in ("inputs", "outputs"):
        for x in info[d]:
            console.print(f"  {d[:-1]:6} {x['name']}  {x['shape']}  {x['dtype']}")
    if info.get("dynamic_inputs"):
        console.print(f"  [yellow]dynamic inputs[/]: {', '.join(info['dynamic_inputs'])} (compile needs --input-shape)")
    console.print("  ops: " + ", ".join(f"{k}×{v}" for k, v in info["op_types"].items()))


RENDERERS = {"context-binary": render_context_binary, "epcontext-onnx": render_epcontext, "onnx-model": render_onnx}
