"""`wide-kernel-as-pieces`: at 16-bit weights, a Conv whose kernel has 9 to 63 taps in a dimension
becomes a sum of Convs of at most 8 taps each.

With 16-bit weights the HTP computes a Conv far from its QDQ model when a kernel dimension has 9 to 63
taps (SM8650, one Conv of 64 channels on 4 random inputs; bench/results/htp_wide_kernel.json): a 1-D
kernel of 8 gives 68.5 dB, of 9 to 63 about 34 dB, of 64 and more 84 dB again; 2-D 7x7 73.6 dB and
9x9 33.0 dB; the QDQ model holds about 86 dB on the CPU, and the same Conv with 8-bit weights about 42.
Audio front ends have such kernels (wav2vec2's first Conv: 10 taps). A Conv is the sum over pieces of
its kernel of the Conv of the input's matching window, so it is written that way: Pad once, then per
piece a Slice and a Conv without padding (the bias in the first), then Adds. Same arithmetic, each Conv
one the HTP computes at 16 bits (66.5 to 71.5 dB).
"""
from __future__ import annotations

import itertools

import numpy as np

from ...core.targets import HTP_16BIT_WEIGHT_MAX_TAPS, HTP_16BIT_WEIGHT_WHOLE_FROM_TAPS
from . import RepairContext, onnx_repair
from .graph_edit import names_read, replace_node, static_shapes, sum_nodes

MAX_TAPS = HTP_16BIT_WEIGHT_MAX_TAPS
WHOLE_FROM = HTP_16BIT_WEIGHT_WHOLE_FROM_TAPS
# A Conv is left whole beyond 16 pieces (a 2-D kernel of 33x33), or when its pieces' outputs, each a
# tensor calibration records, pass 4 M values in all: ONNX Runtime's quantizer slows with every node
# (basic-pitch's 27 Convs of 256 taps in 32 pieces each took quantizing from 2 s past 5 minutes).
MAX_PIECES = 16
MAX_PIECE_VALUES = 1 << 22


def _attrs(n) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _plan(n, inits, shapes) -> dict | None:
    """What the rewrite needs for a Conv it applies to (constant weight, static input, explicit pads), else None."""
    from onnx import numpy_helper
    if n.op_type != "Conv" or n.domain not in ("", "ai.onnx") or len(n.input) < 2 or n.input[1] not in inits:
        return None
    if len(n.input) > 2 and n.input[2] and n.input[2] not in inits:
        return None
    w = numpy_helper.to_array(inits[n.input[1]])
    a = _attrs(n)
    rank = w.ndim - 2
    if rank not in (1, 2) or not MAX_TAPS < max(w.shape[2:]) < WHOLE_FROM or n.input[0] not in shapes:
        return None
    if a.get("auto_pad", b"NOTSET") not in (b"", b"NOTSET"):
        return None
    p = {"w": w, "rank": rank, "size": shapes[n.input[0]][2:], "group": a.get("group", 1),
         "strides": list(a.get("strides", [1] * rank)), "dilations": list(a.get("dilations", [1] * rank)),
         "pads": list(a.get("pads", [0] * 2 * rank))}
    pieces = len(_pieces(list(w.shape[2:])))
    if pieces > MAX_PIECES or pieces * w.shape[0] * int(np.prod(_out_size(p))) > MAX_PIECE_VALUES:
        return None
    return p


def _out_size(p: dict) -> list[int]:
    rank, k, pads, s, d = p["rank"], p["w"].shape[2:], p["pads"], p["strides"], p["dilations"]
    return [(p["size"][i] + pads[i] + pads[i + rank] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(rank)]


def _pieces(kernel: list[int]) -> list[list[tuple[int, int]]]:
    """Every piece of the kernel: per spatial dimension its taps [a, b), at most MAX_TAPS wide."""
    per_dim = [[(a, min(a + MAX_TAPS, k)) for a in range(0, k, MAX_TAPS)] for k in kernel]
    return [list(p) for p in itertools.product(*per_dim)]


def _rewrite(g, n, p: dict) -> None:
    from onnx import helper, numpy_helper
    base, rank, w = n.name or n.output[0], p["rank"], p["w"]
    pads, s, d = p["pads"], p["strides"], p["dilations"]
    out = _out_size(p)
    new, x = [], n.input[0]
    consts = []
    if any(pads):
        consts.append((np.array([0, 0, *pads[:rank], 0, 0, *pads[rank:]], np.int64), f"{base}/pads"))
        new.append(helper.make_node("Pad", [x, f"{base}/pads"], [f"{base}/padded"], name=f"{base}/Pad"))
        x = f"{base}/padded"
    sums = []
    for j, piece in enumerate(_pieces(list(w.shape[2:]))):
        name = f"{base}/piece{j}"
        starts = [a * d[i] for i, (a, _) in enumerate(piece)]
        ends = [starts[i] + (out[i] - 1) * s[i] + (b - a - 1) * d[i] + 1 for i, (a, b) in enumerate(piece)]
        window = (slice(None), slice(None), *(slice(a, b) for a, b in piece))
        consts += [(np.array(starts, np.int64), f"{name}/start"), (np.array(ends, np.int64), f"{name}/end"),
                   (np.arange(2, 2 + rank, dtype=np.int64), f"{name}/axes"), (np.ascontiguousarray(w[window]), f"{name}/w")]
        bias = [n.input[2]] if j == 0 and len(n.input) > 2 and n.input[2] else []
        new += [helper.make_node("Slice", [x, f"{name}/start", f"{name}/end", f"{name}/axes"], [f"{name}/x"],
                                 name=f"{name}/Slice"),
                helper.make_node("Conv", [f"{name}/x", f"{name}/w", *bias], [f"{name}/y"], name=f"{name}/Conv",
                                 group=p["group"], strides=s, dilations=d,
                                 kernel_shape=[b - a for a, b in piece])]
        sums.append(f"{name}/y")
    g.initializer.extend(numpy_helper.from_array(v, k) for v, k in consts)
    replace_node(g, n, new + sum_nodes(sums, n.output[0], base))


@onnx_repair("wide-kernel-as-pieces", 72, f"16-bit weights: a Conv kernel of {MAX_TAPS + 1} to {WHOLE_FROM - 1} taps "
             f"becomes a sum of Convs of at most {MAX_TAPS} taps (the HTP computes those far from the QDQ model)")
def wide_kernel_as_pieces(model, ctx: RepairContext) -> dict | None:
    if ctx.weight_bits != 16:
        return None
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    if not any(n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits
               and MAX_TAPS < max(inits[n.input[1]].dims[2:], default=0) < WHOLE_FROM for n in g.node):
        return None
    shapes = static_shapes(model)             # shape inference: only for a model that has such a Conv
    done = []
    for n in [n for n in g.node if n.op_type == "Conv"]:
        p = _plan(n, inits, shapes)
        if p is not None:
            _rewrite(g, n, p)
            done.append({"node": n.name or n.output[0], "kernel": list(p["w"].shape[2:])})
    if not done:
        return None
    used = names_read(g.node)
    for t in [t for t in g.initializer if t.name not in used]:
        g.initializer.remove(t)
    return {"nodes": done[:20], "count": len(done)}
