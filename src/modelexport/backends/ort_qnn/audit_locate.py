"""Which node makes QNN refuse a whole graph ("Failed to compose / finalize Qnn graph").

A refused graph gives no placement, only an EP error. The node is found in two ways, both on
the real EP: (1) the EP's verbose log (toolchain.ort_qnn_log.blockers_from_log), which names it
in an error line or as the node being built at the first error; (2) when the log names none (a
finalize failure), bisection over prefixes of the graph (this module): the shortest prefix QNN
refuses ends with the culprit. Bisection runs inside the audit's child
process (audit_probe), one session per step, so a crash ends only that child.
"""
from __future__ import annotations

from pathlib import Path

from ...toolchain.ort_qnn_log import Blocker, error_lines


def cut_points(model) -> list[int]:
    """Prefix lengths worth probing: never between an op and the QuantizeLinear of its output
    (QNN takes an op with its Q/DQ as one unit; a half unit is a different question)."""
    nodes = list(model.graph.node)
    cuts, produced = [], set()
    for k in range(1, len(nodes) + 1):
        produced.update(nodes[k - 1].output)
        nxt = nodes[k] if k < len(nodes) else None
        if nxt is not None and nxt.op_type == "QuantizeLinear" and nxt.input[0] in produced:
            continue
        cuts.append(k)
    return cuts


def prefix_model(model, k: int):
    """The first `k` nodes as a model whose outputs are every tensor they leave unconsumed."""
    import onnx
    from onnx import helper
    nodes = list(model.graph.node)[:k]
    produced = [o for n in nodes for o in n.output if o]
    consumed = {i for n in nodes for i in n.input}
    final = {o.name for o in model.graph.output}
    types = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)}
    outs = []
    for name in produced:
        if name in consumed and name not in final:
            continue
        outs.append(types.get(name) or helper.make_empty_tensor_value_info(name))
    used = consumed | set(produced)
    g = helper.make_graph(nodes, f"{model.graph.name}_prefix{k}",
                          [i for i in model.graph.input if i.name in consumed],
                          outs, [t for t in model.graph.initializer if t.name in used])
    m = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
    return m if outs else onnx.ModelProto()


def bisect(model_path: str, refuses, log_path: str | None = None) -> Blocker | None:
    """The node ending the shortest prefix that `refuses(prefix_path) -> bool` rejects, with the
    log lines of that probe. Assumes a refused prefix stays refused when it grows."""
    import onnx
    model = onnx.shape_inference.infer_shapes(onnx.load(model_path, load_external_data=False))
    cuts = cut_points(model)
    work = Path(model_path).parent
    errors: dict[int, str] = {}

    def probe(k: int) -> bool:
        path = work / f"prefix_{k}.onnx"
        onnx.save(prefix_model(model, k), str(path))
        start = Path(log_path).stat().st_size if log_path else 0
        bad = refuses(str(path))
        if bad and log_path:
            with open(log_path, errors="replace") as f:
                f.seek(start)
                errors[k] = "\n".join(error_lines(f.read()))
        path.unlink(missing_ok=True)
        return bad

    lo, hi = 0, len(cuts) - 1          # invariant: cuts[hi] refused (checked first), prefixes before lo accepted
    if not cuts or not probe(cuts[hi]):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if probe(cuts[mid]):
            hi = mid
        else:
            lo = mid + 1
    k = cuts[hi]
    start = cuts[hi - 1] if hi else 0
    # The unit added by the last step: its first non-Q/DQ node is the op; otherwise its last node.
    unit = list(model.graph.node)[start:k]
    culprit = next((n for n in unit if n.op_type not in ("QuantizeLinear", "DequantizeLinear")), unit[-1])
    return Blocker(culprit.name, "bisect", errors.get(k, ""), details={"prefix_nodes": k, "unit": [n.name for n in unit]})
