"""Layer-by-layer numerics: the float ONNX model vs its QDQ (fake-quant) twin on ONNX Runtime's CPU EP.

Every node output of the float model that also exists in the QDQ model becomes a graph output of
both. In the QDQ model the value the next layer really sees is the DequantizeLinear output that
follows a QuantizeLinear of that tensor, so that is what is compared. Nodes are grouped into
layers by the exporter's module path (`/features/features.3/conv/conv.0/conv.0.0/Conv` →
`features.3.conv.0.0`); a layer's value is the output of its last node in graph order. SQNR is
over all samples. The first layer below the threshold is named; the override suggested is for the
block of the layer that loses the most dB on the way down to it (the culprit), giving it more bits (`--override 'features\\.3\\.conv=16a8w'`).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..core.errors import InputError
from ..core.numerics import compare
from ..frontends.module_paths import onnx_module_path

SQNR_CAP_DB = 200.0      # identical tensors: reported as this rather than +inf (JSON has no inf)
NEAR_MARK_DB = 10.0      # a culprit is sought among layers within this of the pass mark


@dataclass
class LayerNumerics:
    name: str                 # the module path (or node name when the exporter gave none)
    node: str                 # the node whose output stands for the layer
    op_type: str
    tensor: str
    sqnr_db: float
    cosine: float | None             # None for a single value
    max_abs_error: float
    drop_db: float = 0.0             # the dB lost against the worst measured layer feeding it

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PerLayerReport:
    part: str
    precision: str
    threshold_db: float
    samples: int
    layers: list[LayerNumerics] = field(default_factory=list)
    first_bad_layer: str | None = None
    suggestion: str | None = None
    suggestion_module: str | None = None
    culprit_layer: str | None = None
    worst_drop: dict[str, Any] | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "precision": self.precision, "threshold_db": self.threshold_db, "samples": self.samples,
                "first_bad_layer": self.first_bad_layer, "culprit_layer": self.culprit_layer,
                "suggested_override": self.suggestion,
                "worst_drop": self.worst_drop, "seconds": round(self.seconds, 3),
                "layers": [x.to_dict() for x in self.layers]}


VALUES_BUDGET_BYTES = 1 << 30     # the layer values one pass of per_layer holds, both models, every sample


def _cap(v: float) -> float:
    return float(min(SQNR_CAP_DB, v)) if np.isfinite(v) or v > 0 else float(v)


def _with_outputs(model, names: list[str]):
    from onnx import helper
    have = {o.name for o in model.graph.output}
    for n in names:
        if n not in have:
            model.graph.output.append(helper.make_empty_tensor_value_info(n))
            have.add(n)
    return model


def _session(model):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # fake-quant as written
    so.log_severity_level = 3
    so.enable_cpu_mem_arena = False             # the layer values go back to the host between passes
    return ort.InferenceSession(model.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])


def outputs_session(model, tensors: list[str]):
    """A CPU session of `model` whose outputs are `tensors` alone (the model's own outputs are back
    when it returns): ONNX Runtime holds every graph output until a run ends."""
    keep = list(model.graph.output)
    try:
        del model.graph.output[:]
        return _session(_with_outputs(model, tensors))
    finally:
        del model.graph.output[:]
        model.graph.output.extend(keep)


def float_tensors(model, tensors: list[str]) -> set[str]:
    """Those of `tensors` that are float, as ONNX Runtime types them (a session that is not run)."""
    floats = {"tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)"}
    return {o.name for o in outputs_session(model, tensors).get_outputs() if o.type in floats}


def tensor_bytes(model, tensors: list[str]) -> list[int]:
    """float32 bytes of each tensor by ONNX shape inference; an unknown shape counts as the largest known."""
    import onnx
    try:
        g = onnx.shape_inference.infer_shapes(model).graph
    except Exception:                            # noqa: BLE001 - a model past 2 GB, an op ONNX does not know
        return [0] * len(tensors)
    dims = {v.name: [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            for v in list(g.value_info) + list(g.output)}
    known = [4 * int(np.prod(dims[t])) if t in dims and min(dims[t], default=1) > 0 else None for t in tensors]
    largest = max((b for b in known if b is not None), default=0)
    return [largest if b is None else b for b in known]


def passes(sizes: list[int], budget: int | None = None) -> list[list[int]]:
    """Layer indices in passes whose values fit `budget` (default VALUES_BUDGET_BYTES; a layer larger
    than it is a pass alone)."""
    budget = VALUES_BUDGET_BYTES if budget is None else budget
    out: list[list[int]] = []
    held = budget + 1
    for i, b in enumerate(sizes):
        if held + b > budget:
            out.append([])
            held = 0
        out[-1].append(i)
        held += b
    return out


def layer_plan(float_model, qdq_model, name_of: Callable[[Any], str | None] | None = None) -> list[tuple[str, Any, str]]:
    """[(layer name, float node, qdq tensor name)] in graph order, one per layer; `name_of(node)`
    names a node's layer (default: the exporter's module path)."""
    name_of = name_of or onnx_module_path
    q_consumers: dict[str, list] = {}
    for n in qdq_model.graph.node:
        for i in n.input:
            q_consumers.setdefault(i, []).append(n)
    q_tensors = {o for n in qdq_model.graph.node for o in n.output}
    last: dict[str, tuple[Any, str]] = {}
    order: list[str] = []
    for node in float_model.graph.node:
        if node.op_type == "Constant" or not node.output or node.output[0] not in q_tensors:
            continue
        t = node.output[0]
        # the dequantized value downstream layers see, if the quantizer put a Q/DQ pair after it
        for q in q_consumers.get(t, []):
            if q.op_type == "QuantizeLinear":
                dq = next((d for d in q_consumers.get(q.output[0], []) if d.op_type == "DequantizeLinear"), None)
                if dq is not None:
                    t = dq.output[0]
                    break
        name = name_of(node) or node.name or node.output[0]
        if name not in last:
            order.append(name)
        last[name] = (node, t)
    return [(name, last[name][0], last[name][1]) for name in order]


def upstream_layers(model, layer_nodes: list) -> list[list[str]]:
    """For each layer node, the nearest layer nodes upstream of it (walking producers through the
    nodes that stand for no layer)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    key = lambda n: n.output[0]     # noqa: E731  (node names may be empty; first outputs are unique)
    marked = {key(n) for n in layer_nodes}
    out = []
    for node in layer_nodes:
        found, seen, stack = [], set(), list(node.input)
        while stack:
            t = stack.pop()
            p = producer.get(t)
            if p is None or key(p) in seen:
                continue
            seen.add(key(p))
            if key(p) in marked:
                found.append(key(p))
            else:
                stack.extend(p.input)
        out.append(found)
    return out


def suggest_module(layer: str) -> str:
    """The module to override for a bad layer: its block, not one conv (`features.3.conv.0.0` → `features.3.conv`)."""
    parts = layer.split(".")
    for i, p in enumerate(parts):
        if p in ("conv", "mlp", "attn", "self_attn", "attention", "feed_forward") and i > 0:
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2]) if len(parts) > 2 else layer


def _layer_stats(fm, qm, plan, samples) -> list[dict | None]:
    """compare() of each layer's float and QDQ values over the samples (None: not a float tensor, or
    the shapes differ), in passes that hold at most VALUES_BUDGET_BYTES of values (a 512x416 image
    model's 1,300 layers over 3 samples: 27 GB at once)."""
    f_out = [node.output[0] for _, node, _ in plan]
    q_out = [t for _, _, t in plan]
    sizes = [2 * len(samples) * b for b in tensor_bytes(fm, f_out)]
    out: list[dict | None] = [None] * len(plan)
    for chunk in passes(sizes):
        refs: dict[int, list] = {i: [] for i in chunk}
        gots: dict[int, list] = {i: [] for i in chunk}
        fs = outputs_session(fm, [f_out[i] for i in chunk])
        qs = outputs_session(qm, [q_out[i] for i in chunk])
        for s in samples:
            fr = fs.run([f_out[i] for i in chunk], s)
            qr = qs.run([q_out[i] for i in chunk], s)
            for i, a, b in zip(chunk, fr, qr):
                refs[i].append(np.asarray(a, dtype=np.float32))
                gots[i].append(np.asarray(b, dtype=np.float32))
        for i in chunk:
            r, g = np.stack(refs.pop(i)), np.stack(gots.pop(i))
            if r.shape == g.shape and np.issubdtype(r.dtype, np.floating):
                out[i] = compare(r, g)
    return out


def per_layer(float_path: Path, qdq_path: Path, samples: list[dict[str, np.ndarray]], threshold_db: float,
              precision: str = "?", part: str = "model", override_precision: str = "16a8w",
              name_of: Callable[[Any], str | None] | None = None,
              overridable: Callable[[str], bool] | None = None) -> PerLayerReport:
    import onnx
    t0 = time.perf_counter()
    if not samples:
        raise InputError("no samples to compare layers on", "give --input or recompile so the bundle stores verify inputs")
    fm = onnx.load(str(float_path))
    qm = onnx.load(str(qdq_path))
    plan = layer_plan(fm, qm, name_of)
    if not plan:
        raise InputError(f"no layer of {float_path.name} can be matched in its quantized model", "the quantizer renamed every node")
    stats = _layer_stats(fm, qm, plan, samples)
    rep = PerLayerReport(part, precision, threshold_db, len(samples))
    upstream = upstream_layers(fm, [node for _, node, _ in plan])
    by_node: dict[str, LayerNumerics] = {}
    drops: list[float] = []
    for i, (name, node, t) in enumerate(plan):
        c = stats[i]
        if c is None:
            continue
        lay = LayerNumerics(name, node.name, node.op_type, t, _cap(c["sqnr_db"]), c["cosine"], float(c["max_abs_error"]))
        rep.layers.append(lay)
        by_node[node.output[0]] = lay
        # the dB this layer loses against the worst measured layer feeding it (not against its
        # neighbour in graph order: in a transformer that is often a parallel branch)
        feeding = [by_node[u] for u in upstream[i] if u in by_node]
        drop = min(x.sqnr_db for x in feeding) - lay.sqnr_db if feeding else 0.0
        drops.append(drop)
        lay.drop_db = round(float(drop), 3)
        if feeding and (rep.worst_drop is None or drop > rep.worst_drop["drop_db"]):
            rep.worst_drop = {"layer": name, "drop_db": round(drop, 3), "from_db": round(drop + lay.sqnr_db, 3),
                              "to_db": round(lay.sqnr_db, 3)}
    bad_i = next((i for i, x in enumerate(rep.layers) if x.sqnr_db < threshold_db), None)
    if bad_i is not None:
        rep.first_bad_layer = rep.layers[bad_i].name
        # the culprit: the layer losing the most dB on the way down to the first bad one, among those
        # an override can change (a RoPE table or a reshape has no weights to give more bits)
        can = overridable or (lambda name: True)
        candidates = [i for i in range(bad_i + 1) if can(rep.layers[i].name)]
        # among them, those already near the mark: a first layer's drop from an exact input (a one-hot,
        # the 200 dB cap) is the quantization every layer has, not the loss that brought the mark down
        near = [i for i in candidates if rep.layers[i].sqnr_db < threshold_db + NEAR_MARK_DB]
        candidates = near or candidates
        if candidates:
            culprit = rep.layers[max(candidates, key=lambda i: drops[i])]
            rep.culprit_layer = culprit.name
            mod = suggest_module(culprit.name)
            rep.suggestion_module = mod
            rep.suggestion = f"--override '{re.escape(mod)}={override_precision}'"
    rep.seconds = time.perf_counter() - t0
    return rep
