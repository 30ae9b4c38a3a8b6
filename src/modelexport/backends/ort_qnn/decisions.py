"""Outputs that a model decides: a comparison, a sign or a rounding of its own float values on the
way to them.

Such an output is not a smooth function of the graph's numbers. Where two float values tie to
within the compiled precision, the compiled graph can take the other branch: afis's LEADER
fingerprint model (tf2onnx) computes a minutiae angle through `atan2` (Sign of x: at x ≈ 0 the
angle jumps by 2π) and keeps the local maxima of a blurred map (`Equal(blur, MaxPool(blur))`: two
neighbours equal in float16 are both peaks). In fp16, 26 of 262,144 values took the other branch
and the output's SQNR fell to 20 dB, while the other values held 45 dB and more. `verify` and
compile's own check then count those values (a "flip": off by more than a tenth of the output's
range), and score the others, as long as flips are rare.
"""
from __future__ import annotations

from ...passes.onnx.graph_edit import elem_types

DECISION_OPS = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Sign", "Round", "Floor",
                          "Ceil", "ArgMax", "ArgMin", "TopK", "Mod"})
_FLOAT_TYPES = {1, 10, 11, 16}   # float, float16, double, bfloat16
OURS = "modelexport:"      # doc_string prefix of a repair's comparison that decides nothing (output-sigmoid's Less)
FLIP_SIZE = 0.1            # a value off by more than this share of the output's largest magnitude took the other branch
MAX_FLIP_SHARE = 1e-3      # above this share of an output's values, the flips are the numerics, not ties


def decision_ops(model) -> dict[str, list[str]]:
    """{graph output: sorted op types deciding it}: the ops of DECISION_OPS upstream of each output
    that read a float value computed from a graph input (not a constant)."""
    g = model.graph
    floats = {t for t, kind in elem_types(model).items() if kind in _FLOAT_TYPES}
    producer = {o: n for n in g.node for o in n.output}
    live = _from_inputs(g, producer)
    out: dict[str, list[str]] = {}
    for o in g.output:
        ops = {n.op_type for n in _cone(o.name, producer)
               if n.op_type in DECISION_OPS and not n.doc_string.startswith(OURS)
               and any(t in floats and t in live for t in n.input[:2])}
        if ops:
            out[o.name] = sorted(ops)
    return out


def _from_inputs(g, producer) -> set[str]:
    """The tensors that depend on a graph input."""
    live = {i.name for i in g.input}
    for n in g.node:                                  # graph nodes are in topological order
        if any(t in live for t in n.input):
            live.update(n.output)
    return live


def _cone(name: str, producer) -> list:
    seen, todo, nodes = set(), [name], []
    while todo:
        n = producer.get(todo.pop())
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        nodes.append(n)
        todo += list(n.input)
    return nodes
