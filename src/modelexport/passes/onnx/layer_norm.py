"""`fuse-layer-norm`: a LayerNorm (or RMSNorm) written out in elementwise ops becomes one op.

TF and JAX exports (tf2onnx, jax2tf) write LayerNorm as reductions and elementwise ops. Flax's
form, var = mean(x²) − mean(x)², cancels catastrophically in float16 and in 8 bits, and its sum of
squares passes float16's 65,504 on large activations: magika's classifier came back from an fp16
compile at −123 dB (max abs error 131,009 on a softmax) and at −1.5 dB from 8a8w. The HTP's own
LayerNorm op has neither problem: fused, magika verifies at 92 dB in fp16 on the same input.

Matched, with Reshape/Expand/Squeeze/Unsqueeze/Identity between the steps allowed:
  mean(t)   = ReduceMean(t) | ReduceSum(t) · (1/n) | ReduceSum(t) / n    (n: the reduced size)
  var       = [Max(·, 0)] (mean(x·x) − mean(x)·mean(x))  |  mean((x − mean(x))²)
  inv       = Reciprocal(Sqrt(var + ε)) | 1 / Sqrt(var + ε)
  y         = (x − mean(x)) · inv [· γ] [+ β]    |   (x − mean(x)) / Sqrt(var + ε) [· γ] [+ β]
            | x · (inv · γ) + (Neg(mean(x)) · (inv · γ) + β)     (Keras' LayerNormalization, tf2onnx:
              afis's fingerprint model; written out, the HTP's quantized 1/sqrt departs from its QDQ
              model, 8a8w 9.3 dB on such a graph, fused 24.8 dB)
  RMSNorm: var = mean(x²), y = x · inv [· γ] → RMSNormalization (opset 23). T5's sum of squares
  passes 65,504 (x² up to 5.6e5): written out, an fp16 RMSNorm measured -18.7 dB on activations of
  scale 3,000, fused 68.6 dB.
over one axis or the trailing axes (one axis elsewhere gets a Transpose pair; several trailing axes are
reshaped into one around it: the HTP's LayerNorm normalizes over the last axis only, GTCRN's four norms
over [33, 16] fell to the CPU as LayerNormalization(axis=2)). Each rewrite is
checked on the CPU EP against the original on random inputs and dropped if it differs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...frontends.onnx_index_inputs import index_limits
from . import RepairContext, onnx_repair
from .graph_edit import default_opset

_NOOP = {"Reshape", "Expand", "Squeeze", "Unsqueeze", "Identity"}
LN_OPSET = 17
RMS_OPSET = 23                    # RMSNormalization


@dataclass
class _Match:
    x: str
    axes: list[int]
    eps: float
    gamma: np.ndarray | None
    beta: np.ndarray | None
    out: str                      # the tensor the fused op writes
    name: str
    rms: bool = False             # x·rsqrt(mean(x²) + ε): T5's and Llama's RMSNorm, no centering


@onnx_repair("fuse-layer-norm", 45, "a LayerNorm written out in elementwise ops (TF/JAX exports) becomes one LayerNormalization")
def fuse_layer_norm(model, ctx: RepairContext) -> dict | None:
    # RMSNormalization needs opset 23, and at opset 23 qnn_preprocess_model fuses nothing (Qwen2.5-VL's
    # Erf GELU stayed on the CPU). Quantized compiles keep RMSNorm written out: its range is calibrated.
    matches = [m for m in _find(model) if not (m.rms and ctx.quantized)]
    if not matches:
        return None
    have = default_opset(model)
    need = RMS_OPSET if any(m.rms for m in matches) else LN_OPSET
    candidate = _copy(model)
    if have < need:
        from onnx import version_converter
        try:
            candidate = version_converter.convert_version(candidate, need)
        except Exception:          # the converter raises its own C++ errors: leave the model as it is
            return None
        matches = [m for m in _find(candidate) if not (m.rms and ctx.quantized)]
    _rewrite(candidate, matches)
    if not _same_outputs(model, candidate):
        return None
    model.CopyFrom(candidate)
    rms = sum(m.rms for m in matches)
    return {"count": len(matches), "nodes": [m.name for m in matches][:20], **({"rms_norm": rms} if rms else {}),
            **({"opset": {"from": have, "to": need}} if have < need else {})}


class _View:
    def __init__(self, model):
        from onnx import numpy_helper, shape_inference
        g = model.graph
        self.consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        for n in g.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in g.node:
            for t in n.input:
                self.consumers.setdefault(t, []).append(n)
        inferred = shape_inference.infer_shapes(model)
        self.shapes = {}
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
            dims = v.type.tensor_type.shape.dim
            if dims and all(d.HasField("dim_value") for d in dims):
                self.shapes[v.name] = [d.dim_value for d in dims]

    def src(self, t: str) -> str:
        """Walk back through broadcasts and reshapes that only add or drop size-1 dims to the tensor they pass on."""
        while t in self.producer and self.producer[t].op_type in _NOOP and self._passes(self.producer[t]):
            t = self.producer[t].input[0]
        return t

    def _passes(self, n) -> bool:
        if n.op_type in ("Identity", "Expand"):
            return True
        a, b = self.shapes.get(n.input[0]), self.shapes.get(n.output[0])
        return a is not None and b is not None and [d for d in a if d != 1] == [d for d in b if d != 1]

    def node(self, t: str, *ops: str):
        n = self.producer.get(self.src(t))
        return n if n is not None and n.op_type in ops else None

    def scalar(self, t: str) -> float | None:
        c = self.consts.get(self.src(t))
        return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None

    def other(self, n, t: str) -> str:
        return n.input[1] if self.src(n.input[0]) == self.src(t) else n.input[0]

    def mean_of(self, t: str) -> tuple[str, list[int]] | None:
        """t = mean(x) over axes → (x, axes)."""
        n = self.node(t, "ReduceMean", "Mul", "Div")
        if n is None:
            return None
        if n.op_type == "ReduceMean":
            return self._reduced(n)
        s = next((self.node(i, "ReduceSum") for i in n.input if self.node(i, "ReduceSum")), None)
        k = self.scalar(n.input[1])
        if s is None or k is None:
            return None
        got = self._reduced(s)
        if got is None:
            return None
        x, axes = got
        size = int(np.prod([self.shapes[x][a] for a in axes])) if x in self.shapes else None
        if size is None or not np.isclose(k * size if n.op_type == "Mul" else size / k, 1.0, rtol=1e-5):
            return None
        return x, axes

    def _reduced(self, n) -> tuple[str, list[int]] | None:
        x = n.input[0]                        # its own input: the axes count in its rank
        if x not in self.shapes:
            return None
        axes = [a.ints for a in n.attribute if a.name == "axes"]
        axes = list(axes[0]) if axes else (self.consts.get(n.input[1]).tolist() if len(n.input) > 1 and n.input[1] in self.consts else None)
        if not axes:
            return None
        rank = len(self.shapes[x])
        return x, sorted(int(a) % rank for a in axes)


def _find(model) -> list[_Match]:
    v = _View(model)
    out = []
    for n in model.graph.node:
        if n.op_type == "Sqrt":
            m = _match_at(v, n)
            if m is not None and all(m.out != o.out for o in out):
                out.append(m)
    return out


def _match_at(v: _View, sqrt) -> _Match | None:
    add = v.node(sqrt.input[0], "Add")
    if add is None:
        return None
    eps_name = next((i for i in add.input if v.scalar(i) is not None), None)
    if eps_name is None:
        return None
    xa = _variance(v, v.other(add, eps_name))
    if xa is not None:
        return _tail(v, sqrt, *xa, v.scalar(eps_name))
    xa = _mean_square(v, v.other(add, eps_name))
    return _tail(v, sqrt, *xa, v.scalar(eps_name), rms=True) if xa is not None else None


def _mean_square(v: _View, t: str) -> tuple[str, list[int]] | None:
    """t = mean(x²) over axes (RMSNorm's variance, no mean taken out) → (x, axes)."""
    got = v.mean_of(t)
    sq = v.node(got[0], "Mul", "Pow") if got is not None else None
    if sq is None or sq.op_type == "Pow" and v.scalar(sq.input[1]) != 2.0 \
            or sq.op_type == "Mul" and v.src(sq.input[0]) != v.src(sq.input[1]):
        return None
    return v.src(sq.input[0]), got[1]


def _variance(v: _View, t: str) -> tuple[str, list[int]] | None:
    mx = v.node(t, "Max")
    if mx is not None and any(v.scalar(i) == 0.0 for i in mx.input):
        t = next(i for i in mx.input if v.scalar(i) != 0.0)
    sub = v.node(t, "Sub")
    if sub is not None:                       # mean(x·x) − mean(x)²
        m2, sq = v.mean_of(sub.input[0]), v.node(sub.input[1], "Mul")
        if m2 is None or sq is None or v.src(sq.input[0]) != v.src(sq.input[1]):
            return None
        m = v.mean_of(sq.input[0])
        xx = v.node(m2[0], "Mul")
        if m is None or xx is None or {v.src(i) for i in xx.input} != {v.src(m[0])} or m2[1] != m[1]:
            return None
        return m
    got = v.mean_of(t)                        # mean((x − mean(x))²)
    if got is None:
        return None
    d2 = v.node(got[0], "Mul", "Pow")
    if d2 is None:
        return None
    if d2.op_type == "Pow" and v.scalar(d2.input[1]) != 2.0 or d2.op_type == "Mul" and v.src(d2.input[0]) != v.src(d2.input[1]):
        return None
    return _centered(v, d2.input[0], got[1])


def _centered(v: _View, t: str, axes: list[int]) -> tuple[str, list[int]] | None:
    """t = x − mean(x) over axes → (x, axes)."""
    sub = v.node(t, "Sub")
    if sub is None:
        return None
    m = v.mean_of(sub.input[1])
    return m if m is not None and v.src(m[0]) == v.src(sub.input[0]) and m[1] == axes else None


def _single(v: _View, t: str):
    users = v.consumers.get(t, [])
    while len(users) == 1 and users[0].op_type in _NOOP:
        users = v.consumers.get(users[0].output[0], [])
    return users[0] if len(users) == 1 else None


def _tail(v: _View, sqrt, x: str, axes: list[int], eps: float, rms: bool = False) -> _Match | None:
    """From Sqrt to the output: (x − mean)·(1/sqrt) or (x − mean)/sqrt, then γ and β (x alone for RMSNorm)."""
    gamma = beta = None

    def numerator(t: str) -> bool:
        return v.src(t) == x if rms else _centered(v, t, axes) is not None
    nxt = _single(v, sqrt.output[0])
    if nxt is not None and nxt.op_type == "Div" and v.src(nxt.input[1]) == sqrt.output[0] and v.scalar(nxt.input[0]) != 1.0:
        if not numerator(nxt.input[0]):
            return None
        cur = nxt
    else:
        if nxt is not None and nxt.op_type == "Div" and v.scalar(nxt.input[0]) == 1.0 or nxt is not None and nxt.op_type == "Reciprocal":
            inv = nxt.output[0]
        else:
            return None
        cur = _single(v, inv)
        if cur is not None and cur.op_type == "Mul" and v.src(v.other(cur, inv)) in v.consts:
            gamma = v.consts[v.src(v.other(cur, inv))]
            inv, cur = cur.output[0], _single(v, cur.output[0])
            if cur is None and not rms:
                return _keras_tail(v, sqrt, x, axes, eps, inv, gamma)
        if cur is None or cur.op_type != "Mul" or not numerator(v.other(cur, inv)):
            return None
    nxt = _single(v, cur.output[0])
    if gamma is None and nxt is not None and nxt.op_type == "Mul" and v.src(v.other(nxt, cur.output[0])) in v.consts:
        gamma, cur, nxt = v.consts[v.src(v.other(nxt, cur.output[0]))], nxt, _single(v, nxt.output[0])
    if nxt is not None and nxt.op_type == "Add" and v.src(v.other(nxt, cur.output[0])) in v.consts:
        beta, cur = v.consts[v.src(v.other(nxt, cur.output[0]))], nxt
    rank = len(v.shapes[x])
    trailing = axes == list(range(rank - len(axes), rank))
    if not trailing and len(axes) != 1:
        return None
    norm_shape = [v.shapes[x][a] for a in axes]
    g, b = _param(gamma, norm_shape, axes, rank), _param(beta, norm_shape, axes, rank)
    if g is False or b is False:
        return None
    return _Match(x, axes, eps, g, b, cur.output[0], sqrt.name or sqrt.output[0], rms)


def _keras_tail(v: _View, sqrt, x: str, axes: list[int], eps: float, scale: str, gamma) -> _Match | None:
    """Keras' LayerNormalization as tf2onnx writes it, from scale = γ / sqrt(var + ε):
    y = x·scale + (β − mean·scale), the second term as Neg(mean)·scale + β."""
    users = v.consumers.get(scale, [])
    if len(users) != 2 or any(u.op_type != "Mul" for u in users):
        return None
    on_x = next((u for u in users if v.src(v.other(u, scale)) == x), None)
    on_mean = next((u for u in users if u is not on_x), None)
    neg = v.node(v.other(on_mean, scale), "Neg") if on_x is not None and on_mean is not None else None
    m = v.mean_of(neg.input[0]) if neg is not None else None
    if m is None or v.src(m[0]) != x or m[1] != axes:
        return None
    shift, out = _single(v, on_mean.output[0]), _single(v, on_x.output[0])
    if shift is None or out is None or shift.op_type != "Add" or out.op_type != "Add" \
            or v.src(v.other(shift, on_mean.output[0])) not in v.consts or v.other(out, on_x.output[0]) != shift.output[0]:
        return None
    beta = v.consts[v.src(v.other(shift, on_mean.output[0]))]
    rank = len(v.shapes[x])
    if axes != list(range(rank - len(axes), rank)) and len(axes) != 1:
        return None
    norm_shape = [v.shapes[x][a] for a in axes]
    g, b = _param(gamma, norm_shape, axes, rank), _param(beta, norm_shape, axes, rank)
    if g is False or b is False:
        return None
    return _Match(x, axes, eps, g, b, out.output[0], sqrt.name or sqrt.output[0])


def _param(p, norm_shape: list[int], axes: list[int], rank: int):
    """γ or β as the normalized dims' shape; False when it varies along a dim that is not normalized."""
    if p is None:
        return None
    p = np.asarray(p, dtype=np.float32)
    full = p.reshape([1] * (rank - p.ndim) + list(p.shape))
    if any(full.shape[d] != 1 for d in range(rank) if d not in axes):
        return False
    return np.broadcast_to(full.reshape([full.shape[a] for a in axes]), norm_shape).astype(np.float32)


def _rewrite(model, matches: list[_Match]) -> None:
    from onnx import helper, numpy_helper
    g = model.graph
    by_out = {m.out: m for m in matches}
    shapes = _View(model).shapes
    nodes = []
    for n in g.node:
        m = next((by_out[o] for o in n.output if o in by_out), None)
        if m is None:
            nodes.append(n)
            continue
        nodes.extend(_fused(m, shapes[m.x], g, helper, numpy_helper))
    del g.node[:]
    g.node.extend(_live(nodes, {o.name for o in g.output}))
    used = {t for n in g.node for t in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)


def _fused(m: _Match, shape: list[int], g, helper, numpy_helper) -> list:
    pre = f"{m.name}_layernorm"
    norm = [shape[a] for a in m.axes]
    gamma = m.gamma if m.gamma is not None else np.ones(norm, np.float32)
    beta = m.beta if m.beta is not None else np.zeros(norm, np.float32)
    rank = len(shape)
    if len(m.axes) > 1:              # the HTP normalizes over the last axis only: the trailing axes as one
        gamma, beta = gamma.reshape(-1), beta.reshape(-1)
    g.initializer.extend([numpy_helper.from_array(gamma, f"{pre}_gamma"), numpy_helper.from_array(beta, f"{pre}_beta")])
    if len(m.axes) > 1:
        flat, full = f"{pre}_flat_shape", f"{pre}_shape"
        g.initializer.extend([numpy_helper.from_array(np.array(shape[:rank - len(m.axes)] + [-1], np.int64), flat),
                              numpy_helper.from_array(np.array(shape, np.int64), full)])
        return [helper.make_node("Reshape", [m.x, flat], [f"{pre}_in"], name=f"{pre}/flatten"),
                *_norm(m, f"{pre}_in", f"{pre}_out", -1, pre, helper),
                helper.make_node("Reshape", [f"{pre}_out", full], [m.out], name=f"{pre}/unflatten")]
    if m.axes == [rank - 1]:
        return _norm(m, m.x, m.out, m.axes[0], pre, helper)
    a = m.axes[0]
    perm = [d for d in range(rank) if d != a] + [a]
    back = [perm.index(d) for d in range(rank)]
    return [helper.make_node("Transpose", [m.x], [f"{pre}_in"], perm=perm, name=f"{pre}/to_last"),
            *_norm(m, f"{pre}_in", f"{pre}_out", -1, pre, helper),
            helper.make_node("Transpose", [f"{pre}_out"], [m.out], perm=back, name=f"{pre}/back")]


def _norm(m: _Match, x: str, y: str, axis: int, pre: str, helper) -> list:
    """One LayerNormalization, or RMSNormalization (no bias input) with an Add for β when there is one."""
    if not m.rms:
        return [helper.make_node("LayerNormalization", [x, f"{pre}_gamma", f"{pre}_beta"], [y], axis=axis,
                                 epsilon=m.eps, name=pre)]
    if m.beta is None:
        return [helper.make_node("RMSNormalization", [x, f"{pre}_gamma"], [y], axis=axis, epsilon=m.eps, name=pre)]
    return [helper.make_node("RMSNormalization", [x, f"{pre}_gamma"], [f"{pre}_scaled"], axis=axis, epsilon=m.eps, name=pre),
            helper.make_node("Add", [f"{pre}_scaled", f"{pre}_beta"], [y], name=f"{pre}/beta")]


def _live(nodes: list, outputs: set[str]) -> list:
    need, live = set(outputs), []
    for n in reversed(nodes):
        if any(o in need for o in n.output):
            live.append(n)
            need.update(n.input)
    return list(reversed(live))


def _copy(model):
    import onnx
    c = onnx.ModelProto()
    c.CopyFrom(model)
    return c


def _same_outputs(a, b, tol: float = 1e-3) -> bool:
    """The two models agree on the CPU EP on random inputs (integers kept inside the tables they index)."""
    import onnxruntime as ort
    try:
        sa = ort.InferenceSession(a.SerializeToString(), providers=["CPUExecutionProvider"])
        sb = ort.InferenceSession(b.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:                 # a model with dynamic dims or an op the CPU EP lacks: not checked, not fused
        return False
    rng = np.random.default_rng(0)
    limits = index_limits(a)
    feed = {}
    for i in sa.get_inputs():
        if any(not isinstance(d, int) for d in i.shape):
            return False
        if "float" in i.type:
            feed[i.name] = rng.standard_normal(i.shape).astype(np.float16 if "16" in i.type else np.float32)
        elif "bool" in i.type:
            feed[i.name] = rng.integers(0, 2, i.shape).astype(bool)
        else:
            dt = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(uint8)": np.uint8}.get(i.type, np.int64)
            feed[i.name] = rng.integers(0, limits.get(i.name, 100), i.shape).astype(dt)
    try:
        for x, y in zip(sa.run(None, feed), sb.run(None, feed)):
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            if x.shape != y.shape or not np.allclose(x, y, rtol=tol, atol=tol * max(1.0, float(np.nanmax(np.abs(x), initial=0))), equal_nan=True):
                return False
    except Exception:
        return False
    return True
