"""`if-as-where`: an `If` on what the model computes from its data becomes both branches and a Where.

The HTP runs static graphs: an `If` whose condition comes from a float data input (a wake-word
head that runs its verifier only when the first score passes 0.5: openWakeWord's models) cannot be
folded by fixing an input's value. Both branches are computed and `Where(cond, then, else)` picks
the outputs; the result is the same for every input (a branch's value is dropped when not taken, so
a NaN or an inf there does not leak), and the cost is the branch not taken. An `If` on a flag or a
rate input is left to `--input-value` (folding computes one branch), and one whose branches hold
their own control flow, or whose outputs differ in rank or type, is left as it is (the load names it).
"""
from __future__ import annotations

from . import RepairContext, onnx_repair
from .control_flow import control_flow_on_inputs, data_inputs
from .graph_edit import topological_order


def _branch(n, name: str):
    return next((a.g for a in n.attribute if a.name == name), None)


def _inlinable(n) -> bool:
    then, other = _branch(n, "then_branch"), _branch(n, "else_branch")
    if then is None or other is None or len(then.output) != len(other.output) or len(then.output) != len(n.output):
        return False
    nested = any(a.type in (5, 10) for g in (then, other) for m in g.node for a in m.attribute)   # GRAPH(S)
    same = all(a.type.tensor_type.elem_type == b.type.tensor_type.elem_type
               and len(a.type.tensor_type.shape.dim) == len(b.type.tensor_type.shape.dim)
               for a, b in zip(then.output, other.output))
    return not nested and same


def _inline(g, prefix: str, main) -> list[str]:
    """Append branch `g`'s nodes and initializers to `main` under new names; its output tensors."""
    inner = {o for m in g.node for o in m.output if o} | {t.name for t in g.initializer}
    name = {t: f"{prefix}/{t}" for t in inner}
    for t in g.initializer:
        copy = main.initializer.add()
        copy.CopyFrom(t)
        copy.name = name[t.name]
    for m in g.node:
        node = main.node.add()
        node.CopyFrom(m)
        node.name = f"{prefix}/{m.name or m.op_type}"
        for i, t in enumerate(m.input):
            node.input[i] = name.get(t, t)
        for i, t in enumerate(m.output):
            node.output[i] = name.get(t, t)
    return [name.get(o.name, o.name) for o in g.output]


def _rewrite(model, n) -> int:
    """Replace If `n` by its two branches and one Where per output; the branch nodes added."""
    from onnx import helper
    g = model.graph
    label = n.name or n.output[0]
    then_out = _inline(_branch(n, "then_branch"), f"{label}/then", g)
    else_out = _inline(_branch(n, "else_branch"), f"{label}/else", g)
    for i, out in enumerate(n.output):
        g.node.append(helper.make_node("Where", [n.input[0], then_out[i], else_out[i]], [out], name=f"{label}/select_{i}"))
    added = len(_branch(n, "then_branch").node) + len(_branch(n, "else_branch").node)
    g.node.remove(n)
    return added


@onnx_repair("if-as-where", 31, "an If on what the model computes from a data input becomes both branches + Where "
             "(the HTP has no If; the branch not taken is computed too)")
def if_as_where(model, ctx: RepairContext) -> dict | None:
    data = data_inputs(model)
    open_on = control_flow_on_inputs(model)
    picked = [n for i, n in enumerate(model.graph.node) if n.op_type == "If" and _inlinable(n)
              and set(open_on.get(n.name or f"If_{i}", ["-"])) <= data]
    if not picked:
        return None
    added = sum(_rewrite(model, n) for n in picked)
    topological_order(model)
    return {"nodes": [n.name for n in picked][:20], "count": len(picked), "branch_nodes": added}
