"""What to do about a node the HTP will not take: a table of rules, first match wins.

A rule matches on the op type and/or a regular expression over the backend's reason, and may
hold only for quantized or only for float (fp16) precisions: advice about calibration or more bits
means nothing for fp16. The text says what to change in the model (or which flag to give), naming a
rewrite into ops the HTP has where one exists; tests/test_fix_texts.py checks that every flag and
verb a text names exists.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..passes import passes_fixing


@dataclass(frozen=True)
class FixRule:
    fix: str
    op_types: tuple[str, ...] = ()   # empty: any op
    reason: str | None = None        # regex over the reason text (case-insensitive)
    quantized: bool | None = None    # True: quantized precisions only; False: float only; None: any

    def matches(self, op_type: str, reason: str, quantized: bool | None = None) -> bool:
        if self.op_types and op_type not in self.op_types:
            return False
        if self.quantized is not None and quantized is not None and self.quantized != quantized:
            return False
        return self.reason is None or re.search(self.reason, reason or "", re.I) is not None


# ExecuTorch (PyTorch models): the QNN partitioner's reasons, in its own and QNN's words.
ET_RULES: tuple[FixRule, ...] = (
    FixRule("the HTP runs static shapes only: compile without dynamic_shapes= (no torch.export Dim), one bundle per "
            "shape you need (e.g. a prefill and a decode graph)", reason=r"only have static dimensions|Dynamically shaped"),
    FixRule("the causal mask is built at run time with tril (le.Scalar has no QNN op builder yet): give "
            "scaled_dot_product_attention an explicit constant mask (--rewrite causal-mask does it for is_causal=True), "
            "or precompute the mask as a buffer", op_types=("aten.le.Scalar",), reason=r"tril"),
    FixRule("put the topk dimension last (x.transpose(d, -1).topk(k, -1), then transpose back): --rewrite topk-last-dim",
            op_types=("aten.topk.default",), reason=r"only supports channel as dimension"),
    FixRule("the HTP op builder takes max_pool2d without dilation only: use dilation=1, or take the max over the dilated "
            "window's strided slices (x[..., ::d, ::d] views combined with torch.maximum)",
            op_types=("aten.max_pool2d_with_indices.default",), reason=r"dilation"),
    FixRule("ExecuTorch has not written the QNN op builder for this op yet: express it with ops that have one "
            "(docs/op_support.md), or leave it on the CPU (XNNPACK)", reason=r"to_be_implemented"),
    FixRule("ExecuTorch has no QNN op builder for this op: replace it with supported ops (docs/op_support.md), or leave "
            "it on the CPU (XNNPACK)", reason=r"no QNN op builder"),
)

RULES: tuple[FixRule, ...] = ET_RULES + (
    FixRule("ONNX Runtime's int8 LSTM has no QNN op: modelexport gives the HTP a float LSTM when the model's LSTMs "
            "take at most 64 time steps in all (QNN unrolls one cell per step and direction); otherwise they run on "
            "the CPU as shipped. To put them on the HTP, compile a shorter window if the time axis is an input "
            "(--input-shape NAME=1,16,40) and run the model over the sequence window by window",
            op_types=("DynamicQuantizeLSTM",)),
    FixRule("the QNN EP takes recurrent nodes with ONNX's default activations only. modelexport drops activations "
            "that spell out the defaults, and keeps a recurrent node of more than 256 time steps × directions on the "
            "CPU on purpose (QNN unrolls one cell per step; the audit's notes say which): to put it on the HTP, "
            "compile a shorter window if the time axis is an input (--input-shape NAME=64,1,FEATURES) and run the "
            "model over the sequence window by window", op_types=("LSTM", "GRU", "RNN"), reason=r"non-default activations"),
    FixRule("the HTP's nearest Resize takes nearest_mode floor with asymmetric coordinates; modelexport rewrites "
            "the node itself where floor's pixels (moved along by a few) are the node's own, which needs static "
            "shapes and constant scales: give --input-shape for every dynamic input, or export the upsampling with "
            "nearest_mode='floor' or coordinate_transformation_mode='half_pixel'",
            op_types=("Resize",), reason=r"ResizeNearestNeighbor.*asymmetric"),
    FixRule("give static shapes: --input-shape NAME=1,3,224,224 for every dynamic input (the HTP runs static graphs only)",
            reason=r"cannot get shape|dynamic (shape|dim|input)|shape must be static|unknown (rank|dim)"),
    FixRule("data-dependent output size: move it into CPU post-processing, or use a fixed-size mask (Where / Greater) instead",
            op_types=("NonZero", "Unique", "NonMaxSuppression", "Compress")),
    FixRule("compile with a precision (the default compile flow runs qnn_preprocess_model, which fuses the Erf-based GELU "
            "into one Gelu op the HTP has), or export GELU with approximate='tanh'", op_types=("Erf",)),
    FixRule("rewrite Celu(x) as Max(x,0) + Min(0, alpha*(Exp(x/alpha)-1)): Max, Min, Exp, Mul, Sub all run on the HTP",
            op_types=("Celu",)),
    FixRule("rewrite Shrink as Where(|x|>lambd, x - Sign(x)*bias, 0) with Abs, Greater, Sign, Mul, Sub, Where",
            op_types=("Shrink",)),
    FixRule("multiply by a constant triangular mask (Mul with an initializer) instead of Trilu", op_types=("Trilu",)),
    FixRule("replace Hardmax with ArgMax followed by OneHot (or Equal against ReduceMax)", op_types=("Hardmax",)),
    FixRule("replace BitShift with Mul/Div by a power of two on int32 tensors", op_types=("BitShift",)),
    FixRule("compute the determinant on the CPU after the graph, or in closed form for 2x2/3x3 "
            "(a*d - b*c with Gather/Mul/Sub)", op_types=("Det",)),
    # QNN refused to build the whole graph (audit_blockers words these reasons).
    FixRule("compile at --precision fp16, where constants stay float and no empty quantized tensor is made; or remove "
            "the empty input from the model (an optional input such as Resize's roi may be left unnamed from opset 13)",
            reason=r"empty constant", quantized=True),
    FixRule("QNN refused this node while building the quantized graph: audit it with --precision fp16; if that "
            "compiles, the node's quantized tensors are the problem: compile at fp16, or give its module another "
            "precision (--override 'REGEX=16a16w')", reason=r"refused to build the graph", quantized=True),
    FixRule("QNN refused this node while building the fp16 graph (its shapes, attributes or dtypes): replace the op "
            "with ones the HTP has (docs/op_support.md), or move it out of the graph into CPU pre/post-processing",
            reason=r"refused to build the graph", quantized=False),
    FixRule("this QNN partition has no graph input: it computes only from constants, cut off from the rest by the "
            "op(s) left on the CPU: fix those first (their rows; a tril causal mask: --rewrite causal-mask), or "
            "precompute the constant part as a buffer", reason=r"No graph inputs present"),
    FixRule("QNN could not lower this fp16 partition (its op builder for this op emits tensors QNN then rejects): "
            "compile at a quantized precision (--precision 8a8w or 16a8w), or replace the op with ones the HTP has "
            "(docs/op_support.md)", reason=r"lowering failed|genNop|mismatched scale", quantized=False),
    FixRule("QNN could not lower this quantized partition: compile at --precision 16a8w or fp16, or replace the op "
            "with ones the HTP has (docs/op_support.md)", reason=r"lowering failed|genNop|mismatched scale",
            quantized=True),
    FixRule("the HTP validator rejected this node's parameters (QNN error 3110 = op config validation failure): check its "
            "shapes, attributes and dtypes; 16-bit activations (--precision 16a8w) or fp16 sometimes pass where 8-bit does not",
            reason=r"3110|backendValidateOpConfig", quantized=True),
    FixRule("the HTP validator rejected this node's parameters at fp16 (QNN error 3110 = op config validation failure): "
            "check its shapes, attributes and dtypes against docs/op_support.md, or try a quantized precision "
            "(--precision 8a8w)", reason=r"3110|backendValidateOpConfig", quantized=False),
    # A (de)quantize node left alone: audit's reason says which op it feeds and where that runs.
    FixRule("it stays on the CPU because the op it feeds does: fix that op (its row) and this node joins it on the HTP",
            op_types=("DequantizeLinear", "QuantizeLinear"), reason=r"feeds .* \(on the CPU\)"),
    FixRule("the model holds its weights quantized per channel (weight-only quantization) and QNN runs such a "
            "DequantizeLinear only inside a quantized op: compile at --precision 8a8w (activations get Q/DQ and "
            "the DequantizeLinear joins the op it feeds), or export the model with float weights for fp16",
            reason=r"standalone (DQ|Q) op with per-channel", quantized=False),
    FixRule("QNN takes a per-channel DequantizeLinear only as the weight of the op it feeds, in one Q/DQ unit with "
            "it: compile the float model (without its own Q/DQ nodes) with --precision 8a8w, so that modelexport "
            "quantizes every input of the op",
            reason=r"standalone (DQ|Q) op with per-channel", quantized=True),
    FixRule("int64 arithmetic is not on the HTP: cast to int32 in the model (indices and shapes fit); until then the "
            "node runs on the CPU, which compile accepts without --strict", reason=r"int64|INT_64"),
    FixRule("no HTP kernel for this op type: replace it with supported ops (docs/op_support.md), or move it out of the "
            "graph into CPU pre/post-processing", reason=r"not supported"),
    FixRule("quantization parameters do not fit this op: quantize with --precision 16a8w, or keep the op in float (fp16)",
            reason=r"quant|scale|zero.?point|offset", quantized=True),
)

DEFAULT_FIX = "the node runs on the CPU; see the reason and the verbose log (modelexport audit --log FILE)"


def suggest_fix(op_type: str, reason: str | None, quantized: bool | None = None) -> str:
    """The first rule's fix for a node refused as `op_type` for `reason` at a quantized (True) or
    float (False) precision; None: any precision."""
    for rule in RULES:
        if rule.matches(op_type, reason or "", quantized):
            return rule.fix
    return DEFAULT_FIX


def source_fn(node) -> str | None:
    """The torch function a decomposed node came from (`tril` for the le.Scalar of a causal mask)."""
    stack = node.meta.get("source_fn_stack") or []
    if not stack:
        return None
    fn = stack[-1][1]
    return getattr(fn, "__name__", None) or str(fn)


def fix_for(op: str, reason: str | None, source: str | None = None, quantized: bool | None = None) -> str:
    """The rules table's fix for a refused node, naming the opt-in rewrite passes that remove it."""
    context = f"{reason} (from {source})" if source else (reason or "")
    rewrites = passes_fixing(op, context)
    fix = suggest_fix(op, context, quantized)
    if not rewrites or any(f"--rewrite {r}" in fix for r in rewrites):
        return fix
    return f"opt in: --rewrite {' / '.join(rewrites)}; or: {fix}"
