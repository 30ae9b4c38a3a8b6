"""`log-power-scale`: in an fp16 compile, the power spectrum a Log reads is moved into float16's range.

Audio front ends compute log(power + eps): the power of quiet frames is far below float16's
smallest value (6e-8; Whisper's log-mel front end had 94 % of its Log's input there) and, on
int16-scaled audio, the loud ones pass its largest (65,504). The power is a homogeneous function of
the signal it squares, so the chain from that signal to the Log is scaled by powers of two chosen
from the float model's ranges on the compile's samples: 2**k at its start (each tensor as high as
stays below 2**13), 2**j more in the weight of the op with a constant weight nearest the Log (the
mel MatMul), and log(2**(k+j)) is taken off after the Log. The float model computes the same.
Where the scaled epsilon is still below float16's smallest value, a Log input that comes out 0
(zero-padded audio) gives log(eps), as in float, not the HTP's log(0) of about -16.6.

The chain, walked back from the Log: Add/Clip/Max/Min with constant bounds (the constants are
scaled), ops linear in one input (MatMul/Gemm/Conv with constant weights, Mul/Div by a constant,
sums, transposes, reshapes, zero pads), Add of two chain terms, squares (Pow 2, Mul(x, x),
ReduceSumSquare) and Sqrt. It starts where an op is none of these or a tensor has a reader outside
the chain; a Mul by the scale goes there. Not a table repair: it needs the user's samples
(`backends/ort_qnn/compile.py` calls it for fp16 compiles given --calibration).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .graph_edit import topological_order

FP16_NORMAL = 2.0 ** -14          # the smallest normal float16: below it, fewer bits of precision
FP16_TINY = 2.0 ** -24            # the smallest float16 subnormal: below half of it, 0
HEADROOM_LOG2 = 13                # no chain tensor above 2**13: an Add of two stays below 65,504
_LINEAR = {"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "ReduceSum", "ReduceMean",
           "Slice", "Abs", "Neg", "Relu", "MaxPool", "AveragePool"}
_WEIGHTED = {"MatMul", "Gemm", "Conv", "ConvTranspose"}       # linear in input 0 when the weight is constant
_BOUNDS = {"Add", "Sub", "Clip", "Max", "Min"}                  # constant operands take the scale


@dataclass
class _Chain:
    """A Log's chain. Each tensor's scale is 2**(m*k), times 2**j past the gain: the op with a constant
    weight nearest the Log on its trunk (the mel MatMul), whose weight takes 2**j; k is set by the
    tensors before it, j by those after it, each as high as float16's range allows."""
    log: object
    tensors: dict[str, float] = field(default_factory=dict)      # tensor → m
    after: set[str] = field(default_factory=set)                 # tensors past the gain (or all, with none)
    starts: dict[str, float] = field(default_factory=dict)       # where a Mul by the scale goes → m
    consts: dict[str, tuple[float, int]] = field(default_factory=dict)   # constant → (m, its multiple of j)
    gain: object = None
    broken: bool = False
    stops: set[str] = field(default_factory=set)                 # tensors read outside the chain: starts
    stands_for: dict[str, str] = field(default_factory=dict)     # a tensor added → the model's tensor it computes

    def const(self, name: str, value: tuple[float, int]) -> None:
        self.broken |= self.consts.setdefault(name, value) != value

    def exponent(self, t: str, k: float, j: float) -> float:
        return self.tensors[t] * k + (j if t in self.after else 0.0)


class _Graph:
    def __init__(self, model):
        from onnx import numpy_helper
        g = model.graph
        self.model = model
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.readers: dict[str, list] = {}
        for n in g.node:
            for t in dict.fromkeys(n.input):
                self.readers.setdefault(t, []).append(n)
        self.inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        for n in g.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.inits[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.outputs = {o.name for o in g.output}

    def const(self, t: str):
        return self.inits.get(t)


def _walk(gr: _Graph, chain: _Chain, t: str, m: float, reader, trunk: bool) -> None:
    """Tensor `t`, read by `reader` inside the chain, carries exponent `m`; `trunk`: every op between
    it and the Log has one chain input and the gain is not yet found."""
    if t in chain.tensors:
        chain.broken |= chain.tensors[t] != m or (t in chain.after) != (chain.gain is None)
        return
    chain.tensors[t] = m
    if chain.gain is None:
        chain.after.add(t)
    n = gr.producer.get(t)
    if n is None or t in chain.stops or t in gr.outputs or not _through(gr, chain, n, m, trunk):
        chain.starts[t] = m


def _through(gr: _Graph, chain: _Chain, n, m: float, trunk: bool) -> bool:
    """Walk on through node `n` if it carries the scale; False: its output is a start."""
    op, ins = n.op_type, list(n.input)
    if n.domain not in ("", "ai.onnx") or len(n.output) != 1:
        return False
    j = 1 if chain.gain is None else 0                      # constants past the gain take its 2**j too
    if op == "Pow":
        e = gr.const(ins[1])
        if e is None or e.size != 1 or float(e.reshape(-1)[0]) != 2.0:
            return False
        _walk(gr, chain, ins[0], m / 2, n, False)
    elif (op == "Mul" and ins[0] == ins[1]) or op == "ReduceSumSquare":
        _walk(gr, chain, ins[0], m / 2, n, False)
    elif op == "Pad":
        value = gr.const(ins[2]) if len(ins) > 2 and ins[2] else None
        if (value is not None and np.any(value != 0)) or any(t and gr.const(t) is None for t in ins[1:]):
            return False                                    # a nonzero pad value does not scale
        _walk(gr, chain, ins[0], m, n, trunk)
    elif op == "Sqrt":
        _walk(gr, chain, ins[0], 2 * m, n, False)
    elif op in _BOUNDS or op in ("Mul", "Div"):
        if op == "Clip" and any(a.name in ("min", "max") for a in n.attribute):
            return False                                    # opset < 11: bounds as attributes
        data = [t for t in ins if t and gr.const(t) is None]
        consts = [t for t in ins if t and gr.const(t) is not None]
        if op in ("Mul", "Div", "Sub") and (len(data) != 1 or (op == "Div" and ins[0] != data[0])):
            return False
        if op in ("Add", "Max", "Min") and len(data) not in (1, 2):
            return False
        if op in ("Mul", "Div"):
            _take_gain(chain, n, trunk, {c: (0.0, 1 if op == "Mul" else -1) for c in consts})
        else:
            for c in consts:
                chain.const(c, (m, j))
        for t in data:
            _walk(gr, chain, t, m, n, trunk and len(data) == 1)
    elif op in _WEIGHTED:
        if any(t and gr.const(t) is None for t in ins[1:]):
            return False
        _take_gain(chain, n, trunk, {ins[1]: (0.0, 1)})
        if len(ins) > 2 and ins[2]:
            chain.const(ins[2], (m, 1 if chain.gain is n or j else 0))   # the bias scales with the product
        _walk(gr, chain, ins[0], m, n, trunk)
    elif op == "Concat":
        if any(gr.const(t) is not None for t in ins):
            return False
        for t in ins:
            _walk(gr, chain, t, m, n, False)
    elif op in _LINEAR:
        _walk(gr, chain, ins[0], m, n, trunk)
    else:
        return False
    return True


def _take_gain(chain: _Chain, n, trunk: bool, weights: dict[str, tuple[float, int]]) -> None:
    """The first op with a constant weight on the trunk is the gain; its weight takes 2**j."""
    if trunk and chain.gain is None:
        chain.gain = n
        for c, v in weights.items():
            chain.const(c, v)


def _chains(model) -> list[_Chain]:
    gr = _Graph(model)
    out = []
    for n in model.graph.node:
        if n.op_type == "Log" and n.domain in ("", "ai.onnx"):
            c = _chain(gr, n)
            if c is not None and any(v != 1.0 for v in c.tensors.values()):
                out.append(c)                               # a chain without a square has nothing to gain
    return out


def _chain(gr: _Graph, log) -> _Chain | None:
    """The Log's chain; a tensor or constant also read outside it stops the walk there (walked again)."""
    stops: set[str] = set()
    for _ in range(64):
        c = _Chain(log, stops=set(stops))
        _walk(gr, c, log.input[0], 1.0, log, True)
        if c.broken:
            return None
        inside = {id(r) for t in c.tensors for r in [gr.producer.get(t)] if r is not None and t not in c.starts}
        inside.add(id(log))
        leaks = {t for t in c.tensors if t not in c.starts and any(
            id(r) not in inside and r.op_type != "Shape" for r in gr.readers.get(t, []))}   # shapes do not scale
        if any(id(r) not in inside for k in c.consts for r in gr.readers.get(k, [])):
            return None
        if not leaks:
            return c
        stops |= leaks
    return None


def _ranges(model, chains: list[_Chain], samples: list[dict]) -> dict[str, np.ndarray]:
    """{chain tensor: its absolute nonzero float values over the samples} from the float model."""
    import onnx
    import onnxruntime as ort
    names = sorted({t for c in chains for t in c.tensors})
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in have)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    wanted = [o.name for o in sess.get_outputs()]
    feeds = [{i.name: s[i.name] for i in sess.get_inputs()} for s in samples]
    seen: dict[str, list] = {t: [] for t in names}
    for feed in feeds:
        for name, v in zip(wanted, sess.run(wanted, feed)):
            if name in seen:
                a = np.abs(np.asarray(v, np.float64)).reshape(-1)
                seen[name].append(a[a > 0])
    return {t: np.concatenate(v) if v else np.zeros(0) for t, v in seen.items()}


def _solve(chain: _Chain, ranges: dict[str, np.ndarray]) -> tuple[int, int]:
    """(k, j): each as high as keeps every chain tensor below 2**HEADROOM_LOG2 on the samples; k even
    (a square root of the scale is taken on the way back), j 0 without a gain."""
    room = {t: HEADROOM_LOG2 - math.log2(float(v.max())) for t, v in ranges.items() if t in chain.tensors and v.size}
    before = [room[t] / chain.tensors[t] for t in room if chain.gain is None or t not in chain.after]
    if not before:
        return 0, 0
    k = 2 * math.floor(min(before) / 2)
    if chain.gain is None:
        return k, 0
    after = [room[t] - chain.tensors[t] * k for t in room if t in chain.after]
    return k, math.floor(min(after)) if after else 0


def _out_of_range(chain: _Chain, ranges: dict[str, np.ndarray], k: float, j: float) -> float:
    """The share of the chain's nonzero values outside float16's normal range once scaled."""
    bad = total = 0
    for t in chain.tensors:
        v = ranges.get(t)
        if v is None or not v.size:
            continue
        scaled = v * 2.0 ** chain.exponent(t, k, j)
        bad += int(np.count_nonzero((scaled < FP16_NORMAL) | (scaled > 65504.0)))
        total += v.size
    return bad / total if total else 0.0


def _set_const(g, name: str, factor: float) -> None:
    from onnx import numpy_helper
    t = next((t for t in g.initializer if t.name == name), None)
    if t is None:                                           # a Constant node
        t = next(n for n in g.node if n.op_type == "Constant" and n.output[0] == name).attribute[0].t
    a = numpy_helper.to_array(t)
    t.CopyFrom(numpy_helper.from_array((a * factor).astype(a.dtype), name))


def _apply(model, chain: _Chain, k: int, j: int) -> None:
    from onnx import helper, numpy_helper
    g = model.graph
    for c, (m, jm) in chain.consts.items():
        _set_const(g, c, 2.0 ** (m * k + jm * j))
    label = chain.log.name or chain.log.output[0]
    for t in chain.starts:
        e = chain.exponent(t, k, j)
        if e == 0:
            continue
        scale, scaled = f"{label}/scale_{len(g.initializer)}", f"{t}__scaled_for_{label}"
        g.initializer.append(numpy_helper.from_array(np.array(2.0 ** e, np.float32), scale))
        for n in g.node:
            if n is chain.log or _in_chain(n, chain):
                for i, x in enumerate(n.input):
                    if x == t:
                        n.input[i] = scaled
        g.node.append(helper.make_node("Mul", [t, scale], [scaled], name=f"{label}/scale_in_{len(g.initializer)}"))
    raw, shift = chain.log.output[0], f"{label}/log_shift"
    chain.stands_for = {f"{raw}__scaled": raw, f"{label}/floored": raw}
    chain.log.output[0] = f"{raw}__scaled"
    chain.log.name = f"{label}/scaled"                  # the Log's name goes to what computes its value
    g.initializer.append(numpy_helper.from_array(np.array((k + j) * math.log(2.0), np.float32), shift))
    g.node.append(helper.make_node("Sub", [_floored(g, chain, label), shift], [raw], name=label))


def _floored(g, chain: _Chain, label: str) -> str:
    """The Log's output, with log(eps) where its input comes out 0 in float16 although the model adds
    an epsilon (log(x + 1e-10) of silence: zero-padded audio). The scaled epsilon may still be below
    float16's smallest value, and the HTP's Log of 0 is about -16.6, not log(eps)."""
    from onnx import helper, numpy_helper
    eps = _epsilon(g, chain)
    if eps is None or eps >= FP16_TINY:
        return chain.log.output[0]
    zero, floor, is_zero = f"{label}/zero", f"{label}/log_eps", f"{label}/input_is_zero"
    g.initializer.extend([numpy_helper.from_array(np.array(0.0, np.float32), zero),
                          numpy_helper.from_array(np.array(math.log(eps), np.float32), floor)])
    g.node.extend([helper.make_node("Equal", [chain.log.input[0], zero], [is_zero], name=f"{label}/is_zero"),
                   helper.make_node("Where", [is_zero, floor, chain.log.output[0]], [f"{label}/floored"],
                                    name=f"{label}/floor")])
    return f"{label}/floored"


def _epsilon(g, chain: _Chain) -> float | None:
    """The positive constant the Log's input adds or is floored at (Add, Max, Clip min), as scaled."""
    from onnx import numpy_helper
    node = next((n for n in g.node if chain.log.input[0] in n.output), None)
    if node is None or node.op_type not in ("Add", "Max", "Clip"):
        return None
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    consts |= {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node if n.op_type == "Constant"}
    picks = node.input[1:2] if node.op_type == "Clip" else node.input
    vals = [consts[t] for t in picks if t in consts and consts[t].size == 1]
    if not vals or float(vals[0].reshape(-1)[0]) <= 0:
        return None
    return float(vals[0].reshape(-1)[0])


def _in_chain(n, chain: _Chain) -> bool:
    return any(o in chain.tensors for o in n.output)


def log_power_scale(model, samples: list[dict]) -> dict | None:
    """Rescale each Log's power chain that `samples` show outside float16's range (in place); the
    record for the manifest, or None when no chain needed it."""
    chains = _chains(model)
    if not chains or not samples:
        return None
    ranges = _ranges(model, chains, samples)
    done = []
    for c in chains:
        k, j = _solve(c, ranges)
        before, after = _out_of_range(c, ranges, 0, 0), _out_of_range(c, ranges, k, j)
        if (k or j) and after < before:
            label = c.log.name or c.log.output[0]
            _apply(model, c, k, j)
            done.append({"log": label, "scale_log2": k + j,
                         "out_of_range": [round(before, 4), round(after, 4)]})
    if not done:
        return None
    topological_order(model)
    stands_for = {k: v for c in chains for k, v in c.stands_for.items()}
    return {"nodes": [d["log"] for d in done][:20], "count": len(done), "chains": done[:20], "stands_for": stands_for}
