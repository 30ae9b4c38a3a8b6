"""`infinite-bounds`: Max(x, -inf) and Min(x, +inf) are x; the node goes.

JAX's softmax (and so every jax2tf export: magika's classifier among them) computes
`max(-inf, reduce_max(logits))`. ONNX Runtime's quantizer gives the -inf constant an infinite
scale, its DequantizeLinear yields 0, and the quantized softmax subtracts 0 instead of the max:
the QDQ model's output is garbage at every precision (magika: 0.1 dB at 16a16w). Dropping the
identity is exact in float and leaves nothing infinite to quantize.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import GraphEdit, drop_identities

_IDENTITY_BOUND = {"Max": -np.inf, "Min": np.inf}


def _bound_of_the_other(node, consts) -> int | None:
    bound = _IDENTITY_BOUND.get(node.op_type)
    if bound is None:
        return None
    k = next((i for i, c in enumerate(consts) if c is not None and c.size and np.all(c == bound)), None)
    return None if k is None or consts[1 - k] is not None else 1 - k


@onnx_repair("infinite-bounds", 6, "drop Max(x, -inf) / Min(x, +inf) (an identity whose infinite constant breaks quantization)")
def drop_infinite_bounds(model, ctx: RepairContext) -> dict | None:
    g = GraphEdit(model)
    dropped = drop_identities(g, _bound_of_the_other)
    if not dropped:
        return None
    g.commit()
    return {"nodes": dropped[:20], "count": len(dropped)}
