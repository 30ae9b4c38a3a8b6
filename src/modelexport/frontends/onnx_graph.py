"""What an ONNX node is, for people: its module path and its multiply-accumulate count."""
from __future__ import annotations

import ast
import math
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


def module_path(node) -> str | None:
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


def _shapes(model) -> dict[str, list[int]]:
    out = {}
    g = model.graph
    for v in list(g.value_info) + list(g.input) + list(g.output):
        tt = v.type.tensor_type
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            out[v.name] = dims
    for t in g.initializer:
        out[t.name] = list(t.dims)
    return out


def _known(shape) -> bool:
    return shape is not None and all(d > 0 for d in shape)


def node_macs(model) -> dict[str, int]:
    """MACs per node name for Conv / ConvTranspose / MatMul / Gemm (0 where shapes are unknown)."""
    shapes = _shapes(model)
    out: dict[str, int] = {}
    for n in model.graph.node:
        macs = 0
        try:
            if n.op_type in ("Conv", "ConvTranspose") and len(n.input) > 1:
                w, y = shapes.get(n.input[1]), shapes.get(n.output[0])
                x = shapes.get(n.input[0])
                if _known(w) and _known(y):
                    if n.op_type == "Conv":      # W: [Cout, Cin/g, k...]; each output element: Cin/g * k
                        macs = math.prod(y) * math.prod(w[1:])
                    elif _known(x):              # W: [Cin, Cout/g, k...]; each input element: Cout/g * k
                        macs = math.prod(x) * math.prod(w[1:])
            elif n.op_type in ("MatMul", "Gemm"):
                a, y = shapes.get(n.input[0]), shapes.get(n.output[0])
                if _known(a) and _known(y):
                    trans_a = any(at.name == "transA" and at.i for at in n.attribute)
                    k = a[-2] if (n.op_type == "Gemm" and trans_a) else a[-1]
                    macs = math.prod(y) * k
        except (IndexError, TypeError):
            macs = 0
        if n.name:
            out[n.name] = int(macs)
    return out
