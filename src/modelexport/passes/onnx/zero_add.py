"""`add-zero`: Add(x, 0) and Sub(x, 0) with an all-zero constant are x; the node goes.

A GroupNorm or BatchNorm whose shift is zero (every freshly initialised model, the real configs
with random weights users bring up first; BiT-50's 49 GroupNorms) leaves Add(x, 0) in the graph,
and a ReLU after it is folded by ONNX Runtime's quantizer into the Add's output encoding
(zero point 0). The HTP drops the Add but keeps x's encoding, so the ReLU is lost and x's values
are read on the wrong scale: x · γ + 0 → ReLU measured −8 dB at 8a8w, 16a8w and 16a16w (a shift of
1e-6 instead of 0: 85 dB), BiT-50 1.5 dB at 16a16w. Dropping the identity is exact in float.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import GraphEdit, drop_identities, static_shapes


def _zero_kept(shapes):
    def kept(node, consts) -> int | None:
        if node.op_type not in ("Add", "Sub") or node.domain not in ("", "ai.onnx"):
            return None
        ks = [1] if node.op_type == "Sub" else [0, 1]
        k = next((i for i in ks if consts[i] is not None and consts[i].size and not np.any(consts[i])), None)
        if k is None or consts[1 - k] is not None or consts[k].dtype.kind != "f":
            return None
        return 1 - k if _keeps_shape(shapes, node.input[1 - k], consts[k].shape) else None
    return kept


def _keeps_shape(shapes, x: str, zero_shape: tuple) -> bool:
    """x + zeros has x's shape: the zeros broadcast into x without widening it."""
    if len(zero_shape) == 0:
        return True
    x_shape = shapes().get(x)
    if x_shape is None or len(zero_shape) > len(x_shape):
        return False
    try:
        return list(np.broadcast_shapes(tuple(x_shape), tuple(zero_shape))) == list(x_shape)
    except ValueError:
        return False


@onnx_repair("add-zero", 73, "drop Add(x, 0) / Sub(x, 0) with an all-zero constant (the HTP drops it too, but "
             "keeps x's encoding, losing a ReLU folded into the Add)")
def drop_zero_adds(model, ctx: RepairContext) -> dict | None:
    cache: dict = {}

    def shapes() -> dict:
        if "s" not in cache:
            try:
                cache["s"] = static_shapes(model)
            except Exception:                  # noqa: BLE001 - shapes unknown: no Add with a shaped zero goes
                cache["s"] = {}
        return cache["s"]

    g = GraphEdit(model)
    dropped = drop_identities(g, _zero_kept(shapes))
    if not dropped:
        return None
    g.commit()
    return {"nodes": dropped[:20], "count": len(dropped)}
