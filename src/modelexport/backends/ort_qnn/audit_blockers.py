"""A node QNN refused while building the graph (toolchain.ort_qnn_log.Blocker) → an audit row: what the
node is, which op it serves, what in the graph explains the refusal, and the fix for it."""
from __future__ import annotations

from ...auditing.fixes import suggest_fix
from ...auditing.report import BLOCKS, NodeAudit
from ...frontends.module_paths import onnx_module_path
from ...frontends.onnx_graph import QDQ_OPS as _QDQ
from ...frontends.onnx_graph import constant_sizes, qdq_source
from ...toolchain.ort_qnn_log import QNN_ERRORS, Blocker


def blocker_audit(b: Blocker, model, precision) -> NodeAudit:
    graph = model.graph
    by_name = {n.name: n for n in graph.node}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i, t in enumerate(n.input):
            consumers.setdefault(t, []).append((n, i))
    node = by_name.get(b.node)
    if node is None:
        reason = f"QNN refused to build the graph at node {b.node}: {b.error}"
        return NodeAudit(b.node, "?", BLOCKS, None, reason, suggest_fix("?", reason, precision.quantized),
                         details={"located_by": b.how})
    # The op this node serves: itself, or the op consuming a (de)quantize node's output.
    op = node
    if node.op_type in _QDQ:
        users = [n for n, _ in consumers.get(node.output[0], []) if n.op_type not in _QDQ]
        op = users[0] if users else node
    sizes = constant_sizes(graph)
    empty = []
    for n in {id(x): x for x in (node, op)}.values():
        for i, t in enumerate(n.input):
            src = qdq_source(t, producer)
            if t and sizes.get(src) == 0:
                empty.append((src, i))
    if b.tensor and sizes.get(qdq_source(b.tensor, producer)) == 0:   # the tensor QNN could not create
        empty.append((qdq_source(b.tensor, producer), -1))
    what = f"error {b.code}: {QNN_ERRORS[b.code]}" if b.code in QNN_ERRORS else (b.error or "no error line")
    reason = f"QNN refused to build the graph at this node ({what}"
    reason += f", creating tensor {b.tensor})" if b.tensor else ")"
    if empty:
        names = ", ".join(f"`{s}`" for s in dict.fromkeys(s for s, _ in empty))
        reason += (f"; its input {names} is an empty constant (0 elements), which QNN cannot hold as a quantized "
                   f"tensor" if precision.quantized else f"; its input {names} is an empty constant (0 elements)")
    details = {"located_by": b.how, "ep_error": b.error}
    if op is not node:
        details["serves"] = {"node": op.name, "op_type": op.op_type,
                             "input": next((i for n, i in consumers.get(node.output[0], []) if n is op), None)}
        reason += f"; it feeds {op.op_type} `{op.name}`"
    details.update({k: v for k, v in b.details.items() if v})
    return NodeAudit(node.name, node.op_type, BLOCKS, onnx_module_path(op), reason,
                     suggest_fix(op.op_type, reason, precision.quantized), details=details)
