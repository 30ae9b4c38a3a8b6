"""`dequantize`: a model that ships already quantized is taken back to float before anything else.

Three forms are common in models shipped on PyPI: ONNX Runtime's static QDQ format (int8 weights
behind DequantizeLinear, activations through QuantizeLinear → DequantizeLinear pairs), its dynamic
quantization (DynamicQuantizeLinear → MatMulInteger / ConvInteger → Cast → Mul by the scales; the
old `onnx.quantize` tool adds the Conv bias as Floor(bias / scale) in int32) and its
DynamicQuantizeLSTM (com.microsoft: int8 W and R, transposed against ONNX's LSTM). Left as they
are, an fp16 compile runs them as int8 on the HTP or on the CPU (the LSTM: no QNN op) and a
quantized compile re-quantizes the quantizer's own nodes (`two nodes with same node name`,
`'x_scale'`). Here the weights become float initializers (an int8 embedding table read through a
Gather → DequantizeLinear too), the integer ops become MatMul / Conv / LSTM and the activation pairs
go, so the model is compiled at the precision asked for; its own encodings are not kept (the
manifest's repair record says so, with the counts). Quantized ops it does not know (QLinearConv ...)
stay as they are, named in the record; a model in which it folds nothing gets no record (the loader
runs the repairs twice and loads the model again when the second round reports anything).
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import GraphEdit

_KNOWN = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
          "DynamicQuantizeLSTM"}
# ops that move values without changing them (their data input is input 0)
_MOVE = {"Gather", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Expand", "Tile"}
# what a folded integer op leaves behind unread: the quantizer, its scale products, the int32 bias chain
_LEFTOVER = {"DynamicQuantizeLinear", "Mul", "Div", "Floor", "Cast", "Reshape"}
# QNN unrolls an LSTM into one cell per time step and direction: ddddocr's 40 steps compile in 19 s,
# voicefilter's 3 × 80 steps took 337-501 s and lost 8 dB at 8a8w. Above this many steps in the
# whole model the int8 LSTMs stay as shipped (DynamicQuantizeLSTM, on the CPU).
MAX_LSTM_STEPS = 64


@onnx_repair("dequantize", 5, "a model shipped quantized (QDQ or dynamic int8) is taken back to float; its encodings are dropped")
def dequantize(model, ctx: RepairContext) -> dict | None:
    if not {n.op_type for n in model.graph.node} & _KNOWN and not _weight_only(model):
        return None
    g = _Dequantize(model)
    weight_only = g.fold_weight_only()
    dynamic = g.fold_dynamic_matmuls()
    convs = g.fold_dynamic_matmuls(op="ConvInteger")
    steps = _lstm_steps(model)
    lstms = g.fold_dynamic_lstms() if steps is not None and steps <= MAX_LSTM_STEPS else 0
    # unknown steps (the first round, before the input shapes are fixed): decided in the second round
    kept = 0 if lstms or steps is None else sum(n.op_type == "DynamicQuantizeLSTM" for n in model.graph.node)
    g.drop_unread()
    weights = g.fold_weight_dequantize()
    tables = g.fold_table_dequantize()
    pairs = g.drop_activation_pairs()
    folded = weight_only + dynamic + convs + lstms + weights + tables + pairs
    if not folded and not kept:
        return None                     # nothing it knows how to fold (a second round finds nothing new)
    g.commit()
    left = sorted({n.op_type for n in model.graph.node if n.op_type in _KNOWN or n.op_type.startswith(("QLinear", "DynamicQuantize"))
                   or n.op_type.endswith("Integer")})
    extra = {k: v for k, v in (("weight_only_int8", weight_only), ("dynamic_convs", convs), ("dynamic_lstms", lstms),
                               ("tables_dequantized", tables)) if v}
    return {"weights_dequantized": weights, "activation_pairs_dropped": pairs, "dynamic_matmuls": dynamic, **extra,
            **_kept_lstms(kept, steps), **({"left_quantized": left} if left else {}), "note": _note(folded, kept)}


def _note(folded: int, kept: int) -> str:
    lstm = f"its {kept} int8 LSTM(s) stay as shipped, on the CPU" if kept else ""
    if not folded:
        return "the model shipped quantized: " + lstm
    return ("the model shipped quantized: compiled from its float equivalent, its own encodings not kept"
            + (f"; {lstm}" if lstm else ""))


def _kept_lstms(kept: int, steps: int | None) -> dict:
    if not kept:
        return {}
    return {"lstms_kept_int8": kept, "lstm_steps": steps,
            "lstm_why": f"QNN unrolls an LSTM into one cell per time step ({steps} here, more than {MAX_LSTM_STEPS}): "
                        "minutes to compile, and 8-bit state drifts"}


def _lstm_steps(model) -> int | None:
    """Time steps × directions summed over the model's DynamicQuantizeLSTMs; None when a length is
    not known. On the way, each one's outputs get their value_info (ONNX does not infer com.microsoft
    ops): without them nothing after an LSTM kept on the CPU had a type, and the quantizer found no
    range for it (tashkeel: `Unable to get valid quantization scale for input 'gemm_input_reshape_arg'`)."""
    total = 0
    for n in [n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM"]:
        x = _inferred_shape(model, n.input[0])
        hidden = next((a.i for a in n.attribute if a.name == "hidden_size"), 0)
        both = 2 if any(a.name == "direction" and a.s == b"bidirectional" for a in n.attribute) else 1
        if x is None or len(x) != 3 or not all(isinstance(d, int) for d in x[:2]) or not hidden:
            return None
        _add_value_info(model, n.output, [[x[0], both, x[1], hidden], [both, x[1], hidden], [both, x[1], hidden]])
        total += x[0] * both
    return total


def _inferred_shape(model, tensor: str) -> list | None:
    import onnx
    try:
        graph = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    except Exception:              # noqa: BLE001 - shapes are a hint here; unknown keeps the LSTMs as shipped
        return None
    for v in list(graph.value_info) + list(graph.input):
        if v.name == tensor and v.type.tensor_type.HasField("shape"):
            return [d.dim_value or d.dim_param or None for d in v.type.tensor_type.shape.dim]
    return None


def _add_value_info(model, outputs, shapes) -> None:
    """Typed outputs (replacing the exporter's symbolic ones: the input shapes are fixed by now)."""
    from onnx import TensorProto, helper
    names = {o for o in outputs if o} - {o.name for o in model.graph.output}
    for v in [v for v in model.graph.value_info if v.name in names]:
        model.graph.value_info.remove(v)
    for name, shape in zip(outputs, shapes):
        if name in names:
            model.graph.value_info.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))


def _weight_only(model) -> bool:
    """An integer initializer cast to float (weight-only int8: Cast → Mul by its scale)."""
    ints = {t.name for t in model.graph.initializer if t.data_type in (2, 3)}      # uint8, int8
    return any(n.op_type == "Cast" and n.input[0] in ints for n in model.graph.node)


class _Dequantize(GraphEdit):
    """The folds of this repair over the graph's nodes."""

    def fold_weight_only(self) -> int:
        """Weight-only int8 (minilm_l6_int8): int8 initializer → Cast(float) → Mul by a constant scale is
        the float initializer. At a quantized precision the quantizer saw the per-row scale as a tensor
        to quantize per channel (`Expected the same number of zero-points and scales`)."""
        count = 0
        for n in self.nodes:
            if n.op_type != "Mul" or id(n) in self.dead or len(n.input) != 2:
                continue
            sides = [self._cast_int8(i) for i in n.input]
            k = next((i for i, a in enumerate(sides) if a is not None), None)
            scale = self.const(n.input[1 - k]) if k is not None else None
            if scale is None or not np.issubdtype(scale.dtype, np.floating) or scale.size > sides[k].size:
                continue
            self.new_inits[n.output[0]] = (sides[k] * scale.astype(np.float32)).astype(np.float32)
            self.dead.add(id(n))
            count += 1
        return count

    def _cast_int8(self, t: str) -> np.ndarray | None:
        p = self.producer(t)
        if p is None or p.op_type != "Cast" or next((a.i for a in p.attribute if a.name == "to"), 0) != 1:
            return None
        q = self.const(p.input[0])
        return q.astype(np.float32) if q is not None and q.dtype in (np.int8, np.uint8) else None

    def fold_weight_dequantize(self) -> int:
        count = 0
        for n in self.nodes:
            if n.op_type != "DequantizeLinear" or id(n) in self.dead or self.const(n.input[0]) is None:
                continue
            q, scale = self.const(n.input[0]), self.const(n.input[1])
            zp = self.const(n.input[2]) if len(n.input) > 2 and n.input[2] else np.zeros((), q.dtype)
            if scale is None or zp is None:
                continue
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            if scale.ndim == 1 and q.ndim:
                shape[axis % q.ndim] = -1
            w = (q.astype(np.float32) - zp.astype(np.float32).reshape(shape)) * scale.astype(np.float32).reshape(shape)
            self.new_inits[n.output[0]] = w.astype(np.float32)
            self.dead.add(id(n))
            count += 1
        return count

    def fold_table_dequantize(self) -> int:
        """An integer table read through Gather / Transpose ... then DequantizeLinear by one scale (an
        int8 embedding): the table is dequantized once, the reads carry float and the DQs go."""
        count, done = 0, set()
        for d in self.nodes:
            if d.op_type != "DequantizeLinear" or id(d) in self.dead or self.const(d.input[0]) is not None:
                continue
            t = d.input[0]
            while (p := self.producer(t)) is not None and p.op_type in _MOVE:
                t = p.input[0]
            table = self.const(t)
            if p is not None or table is None or t in done or not np.issubdtype(table.dtype, np.integer):
                continue
            dqs = self._table_readers(t, d)
            if dqs is None:
                continue
            scale, zp = self.const(d.input[1]), self._zero_point(d, table.dtype)
            name = t + "_float"
            self.new_inits[name] = ((table.astype(np.float32) - zp.astype(np.float32)) * scale.astype(np.float32)).astype(np.float32)
            self.retyped.update(self._table_reads(t))
            for n in self.consumers(t):
                n.input[0] = name
            for q in dqs:
                self.rename[q.output[0]] = q.input[0]
                self.dead.add(id(q))
            done.add(t)
            count += 1
        return count

    def _table_reads(self, table: str) -> set[str]:
        """The tensors `table` flows into through the ops that move it (they carry float now)."""
        out, stack = set(), [table]
        while stack:
            for n in self.consumers(stack.pop()):
                if n.op_type in _MOVE and n.output[0] not in out:
                    out.add(n.output[0])
                    stack.append(n.output[0])
        return out

    def _zero_point(self, dq, dtype):
        return self.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros((), dtype)

    def _table_readers(self, table: str, dq) -> list | None:
        """The DQs that end every read of `table` (each with dq's one scale and zero point), or None
        when a read goes anywhere else."""
        scale, zp = self.const(dq.input[1]), self._zero_point(dq, np.int8)
        if scale is None or zp is None or scale.size != 1 or zp.size != 1:
            return None
        dqs, stack, seen = [], [table], set()
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            for n in self.consumers(t):
                if n.op_type in _MOVE and n.input[0] == t and t not in n.input[1:]:
                    stack.append(n.output[0])
                elif n.op_type == "Shape":
                    continue
                elif (n.op_type == "DequantizeLinear" and n.input[0] == t and np.array_equal(self.const(n.input[1]), scale)
                      and np.array_equal(self._zero_point(n, np.int8), zp)):
                    dqs.append(n)
                else:
                    return None
        return dqs if table not in self.outputs and not (seen - {table}) & self.outputs else None

    def drop_activation_pairs(self) -> int:
        count = 0
        for q in self.nodes:
            if q.op_type != "QuantizeLinear" or id(q) in self.dead:
                continue
            dqs = [d for d in self.consumers(q.output[0]) if d.op_type == "DequantizeLinear"]
            if len(dqs) != len(self.consumers(q.output[0])):
                continue
            for d in dqs:
                self.rename[d.output[0]] = q.input[0]
                self.dead.add(id(d))
            self.dead.add(id(q))
            count += 1
        return count

    def fold_dynamic_matmuls(self, op: str = "MatMulInteger") -> int:
        """DynamicQuantizeLinear → MatMulInteger / ConvInteger [→ Add(int32 bias)] → Cast → Mul(x_scale·w_scale)
        becomes MatMul / Conv (with the bias) on the float input and the dequantized weight."""
        count = 0
        for mi in self.nodes:
            if mi.op_type != op or id(mi) in self.dead:
                continue
            dql = self.producer(mi.input[0])
            wq = self.const(mi.input[1])
            chain = self._scale_chain(mi)
            if dql is None or dql.op_type != "DynamicQuantizeLinear" or wq is None or chain is None:
                continue
            dead, mul, w_scale, bias = chain
            wzp = self.const(mi.input[3]) if len(mi.input) > 3 and mi.input[3] else np.zeros((), wq.dtype)
            if wzp is None:
                continue
            per = (-1,) + (1,) * (wq.ndim - 1) if op == "ConvInteger" else (-1,)   # Conv: per output channel (axis 0)
            wzp, w_scale = (a.astype(np.float32).reshape(per if a.size > 1 else ()) for a in (wzp, w_scale))
            name = mi.input[1] + "_float"
            self.new_inits[name] = ((wq.astype(np.float32) - wzp) * w_scale).astype(np.float32)
            inputs = [dql.input[0], name]
            if bias is not None:
                self.new_inits[name + "_bias"] = bias.astype(np.float32).reshape(-1)
                inputs.append(name + "_bias")
            mi.op_type = "Conv" if op == "ConvInteger" else "MatMul"
            del mi.input[:]
            mi.input.extend(inputs)
            mi.output[0] = mul.output[0]
            self.dead.update(id(n) for n in dead)
            count += 1
        return count

    def drop_unread(self) -> None:
        """Quantizers, scale products and int32 bias chains nobody reads any more."""
        while True:
            unread = [n for n in self.nodes if n.op_type in _LEFTOVER and id(n) not in self.dead
                      and not any(self.consumers(o) or o in self.outputs for o in n.output if o)]
            if not unread:
                return
            self.dead.update(id(n) for n in unread)

    def _scale_chain(self, mi):
        """mi → [Add(·, int32 bias)] → Cast(float) → Mul(·, x_scale·w_scale): (nodes, mul, w_scale, float bias or None)."""
        nodes, bias = [], None
        after = self.consumers(mi.output[0])
        if len(after) == 1 and after[0].op_type == "Add" and mi.op_type == "ConvInteger":
            bias = self._int32_bias(next(i for i in after[0].input if i != mi.output[0]))
            if bias is None:
                return None
            nodes.append(after[0])
            after = self.consumers(after[0].output[0])
        if len(after) != 1 or after[0].op_type != "Cast":
            return None
        nodes.append(after[0])
        muls = self.consumers(after[0].output[0])
        if len(muls) != 1 or muls[0].op_type != "Mul":
            return None
        nodes.append(muls[0])
        other = next(i for i in muls[0].input if i != after[0].output[0])
        s = self.producer(other)
        if s is None or s.op_type != "Mul":
            return None
        w_scale = next((self.const(i) for i in s.input if self.const(i) is not None), None)
        return (nodes, muls[0], w_scale, bias) if w_scale is not None else None

    def _int32_bias(self, t: str) -> np.ndarray | None:
        """Reshape(Cast(Floor(Div(bias, x_scale·w_scale)))) (onnx.quantize's ConvInteger bias): the float bias."""
        for op in ("Reshape", "Cast", "Floor", "Div"):
            p = self.producer(t)
            if p is None or p.op_type != op:
                return None
            t = p.input[0]
        return self.const(t)

    def fold_dynamic_lstms(self) -> int:
        """com.microsoft DynamicQuantizeLSTM (X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale,
        W_zero_point, R_scale, R_zero_point; W [D, input, 4H] and R [D, H, 4H] int8) → ONNX LSTM with the
        float W [D, 4H, input] and R [D, 4H, H]; the attributes are LSTM's."""
        count = 0
        for n in self.nodes:
            if n.op_type != "DynamicQuantizeLSTM" or id(n) in self.dead:
                continue
            ins = list(n.input) + [""] * (12 - len(n.input))
            w, r = self._lstm_weight(ins[1], ins[8], ins[9]), self._lstm_weight(ins[2], ins[10], ins[11])
            if w is None or r is None:
                continue
            wn, rn = ins[1] + "_float", ins[2] + "_float"
            self.new_inits[wn], self.new_inits[rn] = w, r
            new = [ins[0], wn, rn, *ins[3:8]]
            while not new[-1]:
                new.pop()
            n.op_type, n.domain = "LSTM", ""
            del n.input[:]
            n.input.extend(new)
            count += 1
        return count

    def _lstm_weight(self, q: str, scale: str, zp: str) -> np.ndarray | None:
        """[D, rows, 4H] int8, scale/zero point per direction [D] or per channel [D, 4H] → float [D, 4H, rows]."""
        q, s = self.const(q), self.const(scale) if scale else None
        if q is None or s is None or q.ndim != 3:
            return None
        z = self.const(zp) if zp else np.zeros((), q.dtype)
        d, gates = q.shape[0], q.shape[2]

        def per(a):
            a = a.astype(np.float32)
            if a.size == 1:
                return a.reshape(())
            if a.size == d:
                return a.reshape(d, 1, 1)
            return a.reshape(d, 1, gates) if a.size == d * gates else None
        s, z = per(s), per(z) if z is not None else None
        if s is None or z is None:
            return None
        return np.ascontiguousarray(((q.astype(np.float32) - z) * s).transpose(0, 2, 1)).astype(np.float32)
