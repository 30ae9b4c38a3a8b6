"""Which layers' quantization costs the outputs the most: each layer measured by taking it out.

A layer's drop against the layers feeding it (quant/per_layer.py) says where the numbers fall, not
what fixing it gives back: a LayerNorm or a residual Add can show the drop of the 8-bit tensors it
reads, and giving the Add 16 bits then changes nothing (MiniLM-L3's embedding Add: 13.2 dB at 8a8w,
13.3 dB with it at 16a8w). Here each candidate layer is measured instead, in the QDQ (fake-quant)
model on the CPU EP: its nodes read their activations unquantized and the nodes after them read
its outputs unquantized (the Q/DQ pairs around it bypassed), and the outputs' worst SQNR against the
float model is what 16-bit activations on that layer can give back, at most. This is AIMET's
per-layer sensitivity analysis (QuantAnalyzer), on ONNX Runtime's own QDQ graph.
"""
from __future__ import annotations

import copy
import time
from typing import Any, Callable

import numpy as np

from ..core.numerics import sqnr_db
from ..frontends.onnx_graph import topological_order
from .per_layer import _session
from .weight_split import LO_SUFFIX, SUM_SUFFIX

QDQ = ("QuantizeLinear", "DequantizeLinear")


def _dq_of(model) -> tuple[dict[str, str], dict[str, str]]:
    """({float tensor: the DequantizeLinear output that stands for it}, the reverse), for activations:
    a tensor → QuantizeLinear → DequantizeLinear chain (weights' DequantizeLinears read initializers)."""
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
    fwd: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear":
            continue
        dq = next((d for d in consumers.get(n.output[0], []) if d.op_type == "DequantizeLinear"), None)
        if dq is not None:
            fwd[n.input[0]] = dq.output[0]
    return fwd, {v: k for k, v in fwd.items()}


def _float_weights(model, float_model) -> dict[str, str]:
    """{a weight's DequantizeLinear output: the float initializer it stands for}: ONNX Runtime's
    quantizer names a weight's quantized copy `<name>_quantized`."""
    inits = {t.name for t in model.graph.initializer}
    floats = {t.name for t in float_model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            base = n.input[0].removesuffix("_quantized")
            if base in floats:
                out[n.output[0]] = base
    return out


def bypassed(model, nodes: set[str], fwd: dict[str, str], back: dict[str, str], weights: dict[str, Any] | None = None):
    """A copy of the QDQ `model` in which `nodes` read their activation inputs unquantized, every
    reader of their outputs reads them unquantized and, given `weights` ({DequantizeLinear output:
    float initializer}), they read their weights in float too."""
    m = copy.deepcopy(model)
    outs = {t for n in m.graph.node if n.name in nodes for t in n.output}
    swap = {fwd[t]: t for t in outs if t in fwd}
    graph_outputs = {o.name for o in m.graph.output}
    have = {t.name for t in m.graph.initializer}
    for n in m.graph.node:
        for i, t in enumerate(n.input):
            if n.name in nodes and t in back:
                n.input[i] = back[t]
            elif n.name in nodes and weights and t in weights:
                name = weights[t].name + "__float"      # the QDQ model may use the float name for another tensor
                if name not in have:
                    w = copy.deepcopy(weights[t])
                    w.name = name
                    m.graph.initializer.append(w)
                    have.add(name)
                n.input[i] = name
            elif t in swap and n.op_type not in QDQ:
                n.input[i] = swap[t]
    for dq_out, t in swap.items():            # a graph output read through its Q/DQ: the float value instead
        if dq_out in graph_outputs:
            from onnx import helper
            for n in m.graph.node:
                if dq_out in n.output:
                    n.output[list(n.output).index(dq_out)] = dq_out + "__bypassed"
            m.graph.node.append(helper.make_node("Identity", [t], [dq_out]))
    return m


def layer_gains(float_path, qdq_path, samples: list[dict[str, np.ndarray]], layers: list[str],
                nodes_of: Callable[[Any], list[str]], max_seconds: float | None = None,
                with_weights: bool = False) -> dict[str, float]:
    """{layer: the dB the outputs' worst SQNR (over all samples) gains with that layer taken out of the
    quantization}, layer by layer in the order given until `max_seconds` have passed; `nodes_of(layer)`
    names its nodes in the QDQ model; `with_weights`: their weights in float too (what 16-bit weights
    can give back)."""
    import onnx
    fm, qm = onnx.load(str(float_path)), onnx.load(str(qdq_path))
    names = [o.name for o in fm.graph.output]
    fs = _session(fm)
    refs = [fs.run(names, s) for s in samples]
    fwd, back = _dq_of(qm)
    weights = None
    if with_weights:
        floats = {t.name: t for t in fm.graph.initializer}
        weights = {dq: floats[name] for dq, name in _float_weights(qm, fm).items()}
    qs = _session(qm)
    base = worst_sqnr(refs, [qs.run(names, s) for s in samples])
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    for layer in layers:
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            break
        nodes = set(nodes_of(layer))
        if nodes:
            sess = _session(bypassed(qm, nodes, fwd, back, weights))
            out[layer] = worst_sqnr(refs, [sess.run(names, s) for s in samples]) - base
    return out


def worst_sqnr(refs: list[list], gots: list[list]) -> float:
    """The worst float output's SQNR, each output over all samples."""
    worst = float("inf")
    for i in range(len(refs[0]) if refs else 0):
        r = [np.asarray(x[i]) for x in refs]
        g = [np.asarray(x[i]) for x in gots]
        if np.issubdtype(r[0].dtype, np.floating) and all(a.shape == b.shape for a, b in zip(r, g)):
            worst = min(worst, sqnr_db(np.concatenate([a.ravel() for a in r]), np.concatenate([b.ravel() for b in g])))
    return worst


def demoted(model, layers: list[str], fwd: dict[str, str], back: dict[str, str]):
    """A copy of the 16-bit QDQ `model` in which `layers` compute as they would at 8a8w: their
    activation inputs and outputs read through an 8-bit fake-quant over the same range, and a
    convolution split by --split-weights (quant/weight_split.py) without its low half (8-bit weights).
    A layer whose output is a graph output is left at its precision. → (the copy, the layers demoted)."""
    m = copy.deepcopy(model)
    e = _Edit(m, fwd, back)
    done = [layer for layer in layers if e.demote(layer)]
    m.graph.node.extend(e.added)
    topological_order(m)
    return m, done


class _Edit:
    """The edits `demoted` makes to one copy of a QDQ graph."""

    def __init__(self, m, fwd: dict[str, str], back: dict[str, str]):
        self.m, self.fwd, self.back = m, fwd, back
        self.inits = {t.name: t for t in m.graph.initializer}
        self.producer = {t: n for n in m.graph.node for t in n.output}
        self.qparams = {n.input[0]: n.input[1:3] for n in m.graph.node if n.op_type == "QuantizeLinear" and len(n.input) == 3}
        self.by_name = {n.name: n for n in m.graph.node}
        self.outputs = {o.name for o in m.graph.output}
        self.added: list = []
        self.made: set[str] = set()

    def demote(self, layer: str) -> bool:
        nodes = [self.by_name[n] for n in (layer, layer + LO_SUFFIX, layer + SUM_SUFFIX) if n in self.by_name]
        last = next((n for n in nodes if n.name == layer + SUM_SUFFIX), self.by_name.get(layer))
        if last is None or any(self.fwd.get(t) in self.outputs for t in last.output):
            return False
        for n in nodes:
            if n.name == layer + LO_SUFFIX:             # the low half of split weights: 8-bit weights keep none
                self._zero_weight(n)
            if n.name != layer + SUM_SUFFIX:
                n.input[:] = [self.eight_bit(t) or t if t in self.back else t for t in n.input]
        for t in last.output:
            dq = self.fwd.get(t)
            q = self.eight_bit(dq) if dq else None
            if q is None:
                continue
            for n in self.m.graph.node:
                if n.op_type not in QDQ or (n.input[0] == dq and n.op_type == "QuantizeLinear"):
                    n.input[:] = [q if x == dq else x for x in n.input]
        return True

    def _zero_weight(self, node) -> None:
        from onnx import numpy_helper
        w = self.producer.get(node.input[1])
        if w is not None and w.input[0] in self.inits:
            t = self.inits[w.input[0]]
            t.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name))

    def eight_bit(self, t: str) -> str | None:
        """The DequantizeLinear output `t` (a 16-bit activation) through an 8-bit Q/DQ of the same range."""
        import onnx
        from onnx import helper, numpy_helper
        name = f"{t}__8bit"
        if name in self.made:
            return name
        s, z = (self.inits.get(x) for x in self.qparams.get(self.back.get(t), ("", "")))
        if s is None or z is None or z.data_type != onnx.TensorProto.UINT16:
            return None
        scale = numpy_helper.to_array(s).astype(np.float32) * (65535.0 / 255.0)
        zero = np.round(numpy_helper.to_array(z).astype(np.float64) / 257.0).astype(np.uint8)
        self.made.add(name)
        self.m.graph.initializer.extend([numpy_helper.from_array(scale, name + "_scale"), numpy_helper.from_array(zero, name + "_zp")])
        self.added += [helper.make_node("QuantizeLinear", [t, name + "_scale", name + "_zp"], [name + "_q"]),
                       helper.make_node("DequantizeLinear", [name + "_q", name + "_scale", name + "_zp"], [name])]
        return name


class Demotions:
    """What giving layers of a 16-bit QDQ model back to 8a8w costs its outputs, on the CPU EP: `start`
    is its worst output SQNR over `samples`; `db(layers)` that SQNR with those layers demoted."""

    def __init__(self, float_path, qdq_path, samples: list[dict[str, np.ndarray]]):
        import onnx
        fm = onnx.load(str(float_path))
        self.qm = onnx.load(str(qdq_path))
        self.names = [o.name for o in fm.graph.output]
        fs = _session(fm)
        self.samples = samples
        self.refs = [fs.run(self.names, s) for s in samples]
        self.fwd, self.back = _dq_of(self.qm)
        self.start = self._worst(self.qm)

    def _worst(self, m) -> float:
        sess = _session(m)
        return worst_sqnr(self.refs, [sess.run(self.names, s) for s in self.samples])

    def db(self, layers: list[str]) -> tuple[float, list[str]]:
        """(the worst output SQNR with `layers` demoted, the layers that could be)."""
        m, done = demoted(self.qm, layers, self.fwd, self.back)
        return (self._worst(m) if done else self.start), done

    def layers(self) -> list[str]:
        """The QDQ model's layers in graph order: its nodes but Q/DQ and the halves --split-weights adds."""
        return [n.name for n in self.qm.graph.node if n.op_type not in QDQ and n.name
                and not n.name.endswith((LO_SUFFIX, SUM_SUFFIX))]
