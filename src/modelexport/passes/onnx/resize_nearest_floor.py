"""`resize-nearest-as-floor`: a nearest Resize whose rounding picks the same pixels as `floor` says so.

The HTP runs a 4-D nearest Resize as ResizeNearestNeighbor, which the QNN EP refuses for
`asymmetric` coordinates with `nearest_mode` `round_prefer_floor` (ONNX's default) or `ceil`, so
paddle2onnx's ×2 upsamplings (every PP-OCRv2 DBNet neck) ran on the CPU. With asymmetric
coordinates a source index is `i / scale`: for ×2 the fractions are 0 and 0.5, and
round_prefer_floor rounds 0.5 down, so it picks exactly the pixels floor picks. The repair computes
both index maps from the node's static shapes and rewrites the mode only where every index agrees:
the same arithmetic, decided per node, never assumed.

For ×4 and ×8 (DBNet's top levels) round_prefer_floor is floor's map moved along by one or three
output pixels (`round(i/4)` = `floor((i+1)/4)`): the floor Resize is followed, on each such axis, by
a Slice that drops the first k pixels and a Concat that repeats the last one k times, which is the
clamp at the border that ONNX's rounding applies.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import static_shapes

OTHER_MODES = ("round_prefer_floor", "round_prefer_ceil", "ceil")


def source_indices(out_len: int, in_len: int, scale: float, mode: str) -> np.ndarray:
    """ONNX Resize's nearest source index for each output index, `asymmetric` coordinates."""
    x = np.arange(out_len, dtype=np.float64) / scale
    frac = x - np.floor(x)
    if mode == "floor":
        idx = np.floor(x)
    elif mode == "ceil":
        idx = np.ceil(x)
    elif mode == "round_prefer_floor":
        idx = np.where(frac == 0.5, np.floor(x), np.round(x))
    else:                                                   # round_prefer_ceil
        idx = np.where(frac == 0.5, np.ceil(x), np.round(x))
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def _attr(node, name: str, default: str) -> str:
    a = next((a for a in node.attribute if a.name == name), None)
    return a.s.decode() if a is not None else default


def _constants(g) -> dict[str, np.ndarray]:
    from onnx import numpy_helper
    out = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def shift_of(target: np.ndarray, floor: np.ndarray) -> int | None:
    """The k with target[i] == floor[min(i + k, N - 1)] for every i, or None."""
    n = len(target)
    for k in range(n):
        if np.array_equal(target, floor[np.minimum(np.arange(n) + k, n - 1)]):
            return k
    return None


def floor_shifts(node, dims: dict[str, list[int]], consts: dict[str, np.ndarray]) -> list[int] | None:
    """Per axis, how far floor's index map must move to give this nearest, asymmetric, 4-D Resize's
    map (all 0: the same pixels); None when no shift gives it."""
    src, dst = dims.get(node.input[0]), dims.get(node.output[0])
    if src is None or dst is None or len(src) != 4 or len(dst) != 4:
        return None
    scales = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scales is not None and scales.size != 4:
        scales = None
    mode, shifts = _attr(node, "nearest_mode", "round_prefer_floor"), []
    for axis in range(4):
        scale = float(scales[axis]) if scales is not None else dst[axis] / src[axis]
        k = shift_of(source_indices(dst[axis], src[axis], scale, mode),
                     source_indices(dst[axis], src[axis], scale, "floor"))
        if k is None:
            return None
        shifts.append(k)
    return shifts


def _shift_nodes(node, shifts: list[int], dims: dict[str, list[int]], g) -> list:
    """The floor Resize writes a new tensor; per shifted axis, Slice [k:] then Concat the last pixel k times."""
    from onnx import helper, numpy_helper
    base, out, cur, new = node.name or node.output[0], node.output[0], f"{node.name or node.output[0]}/floor", []
    node.output[0] = cur
    moved = [(a, k) for a, k in enumerate(shifts) if k]
    for j, (axis, k) in enumerate(moved):
        n = dims[out][axis]
        consts = {f"{base}/ax{axis}/{name}": np.array(v, np.int64) for name, v in
                  (("start", [k]), ("end", [n]), ("last", [n - 1]), ("axis", [axis]))}
        g.initializer.extend(numpy_helper.from_array(v, name) for name, v in consts.items())
        p = f"{base}/ax{axis}"
        new.append(helper.make_node("Slice", [cur, f"{p}/start", f"{p}/end", f"{p}/axis"], [f"{p}/body"], name=f"{p}/Slice"))
        new.append(helper.make_node("Slice", [cur, f"{p}/last", f"{p}/end", f"{p}/axis"], [f"{p}/edge"], name=f"{p}/Edge"))
        dest = out if j == len(moved) - 1 else f"{p}/shifted"
        new.append(helper.make_node("Concat", [f"{p}/body"] + [f"{p}/edge"] * k, [dest], name=f"{p}/Concat", axis=axis))
        cur = dest
    return new


@onnx_repair("resize-nearest-as-floor", 51, "a nearest Resize (asymmetric) whose rounding picks the same pixels as "
             "floor gets nearest_mode=floor (the HTP's ResizeNearestNeighbor takes floor only)")
def resize_nearest_as_floor(model, ctx: RepairContext) -> dict | None:
    from onnx import helper
    g = model.graph
    candidates = [n for n in g.node if n.op_type == "Resize" and n.domain in ("", "ai.onnx")
                  and _attr(n, "mode", "nearest") == "nearest"
                  and _attr(n, "coordinate_transformation_mode", "half_pixel") == "asymmetric"
                  and _attr(n, "nearest_mode", "round_prefer_floor") in OTHER_MODES]
    if not candidates:
        return None
    dims, consts = static_shapes(model), _constants(g)
    changed, shifted = [], []
    for n in candidates:
        shifts = floor_shifts(n, dims, consts)
        if shifts is None:
            continue
        kept = [a for a in n.attribute if a.name != "nearest_mode"]
        del n.attribute[:]
        n.attribute.extend(kept + [helper.make_attribute("nearest_mode", "floor")])
        changed.append(n.name or n.output[0])
        if any(shifts):
            at = list(g.node).index(n)
            for j, m in enumerate(_shift_nodes(n, shifts, dims, g)):
                g.node.insert(at + 1 + j, m)
            shifted.append(n.name or n.output[0])
    if not changed:
        return None
    return {"nodes": changed[:20], "count": len(changed), **({"shifted": shifted[:20]} if shifted else {})}
