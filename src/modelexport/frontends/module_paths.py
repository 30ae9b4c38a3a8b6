"""The module a graph node came from (`features.3.conv.0.0`, `model.layers.3.mlp.down_proj`), for
audits, profiles, per-layer reports and `--override` regexes.

One concept, three inputs, so one function each, named by what it reads:
- `onnx_module_path(node)`: an ONNX NodeProto (exporter metadata, else the TorchScript node name);
- `llm_module_path(node_name)`: the node name in an LLM decoder graph we exported → the HF name;
- `fx_module_path(node)` / `fx_module_paths(node)`: a torch.fx node's `nn_module_stack`.
"""
from __future__ import annotations

import ast
import re

# Metadata keys exporters use for the module a node came from (dynamo exporter, onnxscript).
_SCOPE_KEYS = ("pkg.torch.onnx.name_scopes", "namespace", "pkg.torch.onnx.class_hierarchy")


def _collapse(segments: list[str]) -> str | None:
    """`['features', 'features.3', 'conv', 'conv.0', 'conv.0.0']` → `features.3.conv.0.0`.

    The TorchScript exporter names each scope by the child's qualified name within its nearest
    named ancestor, so a segment that extends the previous one replaces it."""
    path: list[str] = []
    for seg in segments:
        seg = seg.strip()
        if not seg:
            continue
        if path and seg.startswith(path[-1] + "."):
            path[-1] = seg
        else:
            path.append(seg)
    return ".".join(path) or None


def onnx_module_path(node) -> str | None:
    """An ONNX node (anything with `name` and `metadata_props`) → its module path, or None."""
    for prop in getattr(node, "metadata_props", []):
        if prop.key in _SCOPE_KEYS[:2] and prop.value:
            v = prop.value
            try:
                parsed = ast.literal_eval(v)
                segs = [str(s) for s in parsed] if isinstance(parsed, (list, tuple)) else [str(parsed)]
            except (ValueError, SyntaxError):
                segs = re.split(r"[/:]", v)
            found = _collapse(segs)
            if found:
                return found
    name = node.name or ""
    if name.startswith("/") and name.count("/") >= 2:
        return _collapse(name.strip("/").split("/")[:-1])
    return None


def llm_module_path(node_name: str) -> str:
    """'/decoder/model/layers.0/mlp/down_proj/MatMul' → 'model.layers.0.mlp.down_proj'."""
    parts = [p for p in node_name.split("/") if p]
    if parts and parts[0] == "decoder":
        parts = parts[1:]
    path = ".".join(parts[:-1])
    # the TorchScript exporter drops the `model` scope of the backbone: put HF's name back
    if path.split(".")[0] in ("layers", "embed_tokens", "norm", "rotary_emb"):
        path = "model." + path
    return path


def fx_module_paths(node) -> list[str]:
    """Every module of the FX node's nn_module_stack, outermost first (what --override regexes search)."""
    stack = node.meta.get("nn_module_stack") or {}
    return [v[0] for v in stack.values() if v and v[0]]


def fx_module_path(node) -> str | None:
    """`layers.3.mlp.act`: the innermost module of the FX node's nn_module_stack."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return path or None
