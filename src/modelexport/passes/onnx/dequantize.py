"""`dequantize`: a model that ships already quantized is taken back to float before anything else.

Two forms are common in models shipped on PyPI: ONNX Runtime's static QDQ format (int8 weights
behind DequantizeLinear, activations through QuantizeLinear → DequantizeLinear pairs) and its
dynamic quantization (DynamicQuantizeLinear → MatMulInteger → Cast → Mul by the scales). Left as
they are, an fp16 compile runs them as int8 on the HTP and a quantized compile re-quantizes the
quantizer's own nodes (`two nodes with same node name`, `'x_scale'`). Here the weights become float
initializers and the activation pairs go, so the model is compiled at the precision asked for; its
own encodings are not kept (the manifest's repair record says so, with the counts).
Quantized ops it does not know (QLinearConv, DynamicQuantizeLSTM ...) stay as they are, named in the record.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import GraphEdit

_KNOWN = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger"}


@onnx_repair("dequantize", 5, "a model shipped quantized (QDQ or dynamic int8) is taken back to float; its encodings are dropped")
def dequantize(model, ctx: RepairContext) -> dict | None:
    if not {n.op_type for n in model.graph.node} & _KNOWN:
        return None
    g = _Dequantize(model)
    dynamic = g.fold_dynamic_matmuls()
    weights = g.fold_weight_dequantize()
    pairs = g.drop_activation_pairs()
    g.commit()
    left = sorted({n.op_type for n in model.graph.node if n.op_type in _KNOWN or n.op_type.startswith(("QLinear", "DynamicQuantize"))
                   or n.op_type.endswith("Integer")})
    return {"weights_dequantized": weights, "activation_pairs_dropped": pairs, "dynamic_matmuls": dynamic,
            **({"left_quantized": left} if left else {}),
            "note": "the model shipped quantized: compiled from its float equivalent, its own encodings not kept"}


class _Dequantize(GraphEdit):
    """The folds of this repair over the graph's nodes."""

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

    def fold_dynamic_matmuls(self) -> int:
        count = 0
        for mi in self.nodes:
            if mi.op_type != "MatMulInteger" or id(mi) in self.dead:
                continue
            dql = self.producer(mi.input[0])
            wq = self.const(mi.input[1])
            chain = self._scale_chain(mi)
            if dql is None or dql.op_type != "DynamicQuantizeLinear" or wq is None or chain is None:
                continue
            cast, mul, w_scale = chain
            wzp = self.const(mi.input[3]) if len(mi.input) > 3 and mi.input[3] else np.zeros((), wq.dtype)
            w = (wq.astype(np.float32) - wzp.astype(np.float32)) * w_scale.astype(np.float32)
            name = mi.input[1] + "_float"
            self.new_inits[name] = w.astype(np.float32)
            mi.op_type = "MatMul"
            del mi.input[:]
            mi.input.extend([dql.input[0], name])
            mi.output[0] = mul.output[0]
            self.dead.update({id(cast), id(mul)})
            count += 1
        while count:                          # quantizers and scale products nobody reads any more
            unread = [n for n in self.nodes if n.op_type in ("DynamicQuantizeLinear", "Mul") and id(n) not in self.dead
                      and not any(self.consumers(o) or o in self.outputs for o in n.output if o)]
            if not unread:
                break
            self.dead.update(id(n) for n in unread)
        return count

    def _scale_chain(self, mi):
        """MatMulInteger → Cast(float) → Mul(·, x_scale·w_scale): (cast, mul, w_scale) or None."""
        casts = self.consumers(mi.output[0])
        if len(casts) != 1 or casts[0].op_type != "Cast":
            return None
        muls = self.consumers(casts[0].output[0])
        if len(muls) != 1 or muls[0].op_type != "Mul":
            return None
        other = next(i for i in muls[0].input if i != casts[0].output[0])
        s = self.producer(other)
        if s is None or s.op_type != "Mul":
            return None
        w_scale = next((self.const(i) for i in s.input if self.const(i) is not None), None)
        return (casts[0], muls[0], w_scale) if w_scale is not None else None
