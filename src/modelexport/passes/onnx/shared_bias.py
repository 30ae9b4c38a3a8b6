"""`shared-bias-copies`: quantized compiles give each consumer of a shared bias its own copy, named
so that nothing else in the graph can be hit.

ONNX Runtime's QDQ quantizer quantizes a bias (Conv, ConvTranspose, Gemm and the normalizations'
input 2) with its consumer's scales, so a bias shared by several nodes is copied for each further
consumer (`QDQQuantizer._dup_initializer`). The copy is named the bias's name followed by the next
integer suffix among the *initializers* only; a node output already spelled that way is not looked
at. tf2onnx writes exactly such names: basic-pitch's 18 CQT convolutions share the bias
`conv1d_25;conv1d_25`, and one conv's output is `conv1d_25;conv1d_252`, the third copy's name.
The activation's Q/DQ then quantizes the copy instead of the conv's output: the Neg after it reads a
[36] constant, and the QDQ model fails to type-check on every EP ("Transpose ... Invalid attribute
perm {0, 2, 3, 1}, input shape = {36}"). Copies made here, one per consumer, leave the quantizer
nothing to copy; the values are the same tensor, so the float math is unchanged.
"""
from __future__ import annotations

import re

from . import RepairContext, onnx_repair

# the op types whose input 2 ONNX Runtime's QDQ quantizer quantizes as a bias (operators/conv.py,
# gemm.py, norm.py)
_BIAS_OPS = {"Conv", "ConvTranspose", "Gemm", "LayerNormalization", "InstanceNormalization", "BatchNormalization"}
_SUFFIX = re.compile(r"0|[1-9][0-9]*")     # str(int) of a non-negative integer: the quantizer's suffixes


@onnx_repair("shared-bias-copies", 70, "quantized compiles: a bias shared by several nodes whose quantizer copies "
             "would take a tensor's name gets one uniquely named copy per consumer")
def copy_shared_biases(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    users: dict[str, list] = {}
    for n in g.node:
        if n.op_type in _BIAS_OPS and n.domain in ("", "ai.onnx") and len(n.input) > 2 and n.input[2] in inits:
            users.setdefault(n.input[2], []).append(n)
    shared = {b: ns for b, ns in users.items() if len(ns) > 1}
    if not shared:
        return None
    tensors = {o for n in g.node for o in n.output} | {i.name for i in g.input}
    taken = tensors | set(inits) | {i for n in g.node for i in n.input}
    done, clashes = [], []
    for b, ns in shared.items():
        hit = sorted(t for t in tensors - set(inits) if t.startswith(b) and _SUFFIX.fullmatch(t[len(b):]))
        if not hit:
            continue
        clashes.extend(hit)
        for k, n in enumerate(ns[1:], 1):
            name = f"{b}__copy{k}"
            while name in taken:
                name += "_"
            taken.add(name)
            copy = g.initializer.add()
            copy.CopyFrom(inits[b])
            copy.name = name
            n.input[2] = name
        done.append(b)
    if not done:
        return None
    return {"biases": done[:20], "count": len(done), "clashing_tensors": clashes[:20]}
