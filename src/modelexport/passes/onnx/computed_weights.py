"""`computed-weights`: a weight the graph computes from constants alone is computed once and stored.

torch exports a weight-normalised layer (`weight_norm`, `parametrizations.weight_norm`: every
wav2vec2 / HuBERT / WavLM positional Conv, HiFi-GAN vocoders) with its weight written out as
g · v / ‖v‖ over two initializers (ReduceL2, Div, Mul). onnxscript's constant folder
(`fold-constants`) leaves tensors above 8,192 values alone, so the weight stays an activation: the
quantizer gives it an activation's Q/DQ pair and the QNN EP refuses the Conv once it is moved to
NHWC, and with it the whole graph (wav2vec2-base at 16a16w: `node_Conv_961 ... was not selected by
that EP`). ONNX Runtime computes such a weight when it loads a float model; computed here on its
CPU EP, the weight is an initializer that the quantizer quantizes per channel as a weight.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import GraphEdit, names_read

WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}
MAX_NODES = 64                      # a weight's own computation, not a network folded away
RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def constant_slice(edit: GraphEdit, tensor: str, graph_inputs: set[str]) -> list | None:
    """The nodes that compute `tensor` from initializers alone (in order), or None when it reads a graph
    input, a random op or a non-default domain, or takes more than MAX_NODES nodes."""
    order: list = []
    seen: set[int] = set()

    def visit(t: str) -> bool:
        if not t or edit.const(t) is not None:
            return True
        node = edit.producer(t)
        if t in graph_inputs or node is None or node.op_type in RANDOM_OPS or node.domain not in ("", "ai.onnx"):
            return False
        if id(node) in seen:
            return True
        seen.add(id(node))
        if len(seen) > MAX_NODES or not all(visit(i) for i in node.input):
            return False
        order.append(node)
        return True

    return order if visit(tensor) and order else None


def evaluate(model, nodes: list, tensor: str, edit: GraphEdit) -> np.ndarray:
    """`tensor`'s value: `nodes` run on ONNX Runtime's CPU EP over the initializers they read."""
    import onnxruntime as ort   # deferred: the repairs load without ONNX Runtime's session code
    from onnx import helper, numpy_helper
    leaves = {i for n in nodes for i in n.input if i and edit.const(i) is not None}
    g = helper.make_graph(nodes, "weight", [], [helper.make_empty_tensor_value_info(tensor)],
                          [numpy_helper.from_array(edit.const(t), t) for t in sorted(leaves)])
    m = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])  # noqa: TID251
    return session.run([tensor], {})[0]


def _drop_unread(edit: GraphEdit) -> None:
    """Mark dead every node none of whose outputs is read any more (nor a graph output), an If/Loop
    body's reads of outer tensors included."""
    changed = True
    while changed:
        read = names_read(n for n in edit.nodes if id(n) not in edit.dead)
        idle = [n for n in edit.nodes if id(n) not in edit.dead
                and not any(o in read or o in edit.outputs for o in n.output)]
        edit.dead.update(id(n) for n in idle)
        changed = bool(idle)


@onnx_repair("computed-weights", 46, "a Conv/ConvTranspose/Gemm/MatMul weight the graph computes from constants "
             "alone (weight norm: g * v / ||v||) is computed once and stored as an initializer")
def computed_weights(model, ctx: RepairContext) -> dict | None:
    edit = GraphEdit(model)
    graph_inputs = {i.name for i in model.graph.input}
    done: list[str] = []
    for node in list(edit.nodes):
        idx = WEIGHT_INPUT.get(node.op_type)
        if idx is None or len(node.input) <= idx or node.input[idx] in done:
            continue
        weight = node.input[idx]
        nodes = constant_slice(edit, weight, graph_inputs)
        if nodes is None:
            continue
        try:
            value = evaluate(model, nodes, weight, edit)
        except Exception:           # noqa: BLE001 - an op the CPU EP cannot run here: the weight stays computed
            continue
        edit.dead.add(id(edit.producer(weight)))
        edit.new_inits[weight] = value
        done.append(weight)
    if not done:
        return None
    _drop_unread(edit)
    edit.commit()
    return {"nodes": [n.name for n in model.graph.node if any(i in done for i in n.input)], "weights": len(done)}
