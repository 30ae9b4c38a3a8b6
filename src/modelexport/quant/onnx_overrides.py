"""Per-module precision overrides for the ONNX path: `--override 'REGEX=PRECISION'`.

REGEX is searched in each node's module path (from the exporter's node names, e.g.
`features.3.conv.0.0` for `/features/features.3/conv/conv.0/conv.0.0/Conv`) and in its node name;
first match wins. `=fp16` makes the matched nodes an fp16 island: the quantizer leaves them float
(`nodes_to_exclude`), with a DequantizeLinear before and a QuantizeLinear after, and the HTP runs them
in float16 inside the quantized graph (a log-power front end, a layer whose range 8 or 16 bits cannot
hold). Any other matched node gets the override's weight width (signed, symmetric: what the HTP
takes per channel) on its weight initializers
(per-channel on axis 0 for Conv, axis 1 for ConvTranspose, when the compile is per-channel) and,
when the override's activation type differs from the default, on its outputs. They reach ONNX
Runtime's quantizer as `get_qnn_qdq_config(init_overrides=...)`, i.e. the TensorQuantOverrides
extra option; mixed activation types get the quantizer's own convert nodes.
"""
from __future__ import annotations

from ..core.errors import InputError
from ..frontends.module_paths import onnx_module_path
from .override_spec import Override, parse_override_specs
from .precision import ONNX_PRECISIONS, Precision

_WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}
_CHANNEL_AXIS = {"Conv": 0, "ConvTranspose": 1}
# ops whose constant inputs are weights and biases, typed by the quantizer itself (a LayerNorm's scale
# at the weight width, its bias int32): given the activation width, the HTP ran the LayerNorm in float
_OWN_PARAMS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "LayerNormalization", "InstanceNormalization",
               "BatchNormalization", "GroupNormalization")


def weight_override(quant_type, axis: int | None) -> dict:
    """A weight initializer's TensorQuantOverrides entry: signed, symmetric (what the HTP takes per
    channel), one scale per slice on `axis` (None: per tensor)."""
    return {"quant_type": quant_type, "symmetric": True, **({"axis": axis} if axis is not None else {})}


def parse_onnx_overrides(specs: list[str] | None, default: Precision) -> list[Override]:
    def check(spec: str, p: Precision) -> None:
        if not default.quantized:
            raise InputError(f"--override {spec!r} needs a quantized --precision (the model is compiled as {default.name})",
                             "give --precision 8a8w/16a8w/16a4w/... and override the modules that need another one")
    return parse_override_specs(specs, "features\\.3\\.conv=16a8w", check, ONNX_PRECISIONS)


def tensor_overrides(model, overrides: list[Override], default: Precision, per_channel: bool) -> tuple[dict, dict, list[str]]:
    """→ (init_overrides for get_qnn_qdq_config, {pattern: matched node count}, the fp16 island's node names)."""
    from onnxruntime.quantization import QuantType

    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, list[dict]] = {}
    matched = {o.pattern: 0 for o in overrides}
    promoted: dict[str, object] = {}                 # node name → its activation type, where it differs
    island: list[str] = []
    for node in model.graph.node:
        hit = next((o for o in overrides if o.matches(onnx_module_path(node), node.name)), None)
        if hit is None:
            continue
        matched[hit.pattern] += 1
        if not hit.precision.quantized:
            if not node.name:
                raise InputError(f"--override {hit.pattern!r}=fp16 matches a node without a name ({node.op_type} "
                                 f"writing {node.output[0]!r}): the quantizer excludes nodes by name",
                                 "give the model's nodes names (onnx.helper / onnx-ir), or override with 16a16w")
            island.append(node.name)
            continue
        act, weight = hit.precision.quant_types()
        widx = _WEIGHT_INPUT.get(node.op_type)
        if widx is not None and len(node.input) > widx and node.input[widx] in inits:
            # HTP takes per-channel weights signed and symmetric (offset 0): uint8 → int8, uint16 → int16
            weight = {QuantType.QUInt8: QuantType.QInt8, QuantType.QUInt16: QuantType.QInt16}.get(weight, weight)
            axis = _CHANNEL_AXIS.get(node.op_type) if per_channel else None
            out[node.input[widx]] = [weight_override(weight, axis)]
        if hit.precision.activation_type != default.activation_type:
            _convert_inputs(node, out, inits, QuantType[default.activation_type], act)
            promoted[node.name] = act
            for t in node.output:
                if t and t not in inits:
                    out[t] = [{"quant_type": act}]
    _convert_outputs(model, out, promoted, QuantType[default.activation_type])
    _constant_inputs(model, out, promoted, inits)
    for o in overrides:
        if not matched[o.pattern]:
            raise InputError(f"--override {o.pattern!r} matches no node (module paths look like 'features.3.conv.0.0')",
                             "run `modelexport audit MODEL` to see module paths, or `verify --per-layer` for a suggestion")
    return out, matched, island


def _convert_inputs(node, out: dict, inits: dict, default_act, act) -> None:
    """The node's activation inputs are converted to its own type for it alone: a node unit whose
    inputs and outputs share one type is what the QNN EP builds as one quantized op. Converted only
    at the output, a 16-bit Conv fed 8 bits ran in float with its DequantizeLinear and QuantizeLinear
    as separate HTP ops (ppocr_det, 8a8w with its Convs at 16a8w: 18× the cycles of 8a8w)."""
    for t in node.input:
        if not t or t in inits:
            continue
        have = out.get(t)
        if have is None:
            out[t] = [{"quant_type": default_act, "convert": {"quant_type": act, "recv_nodes": {node.name}}}]
        elif have[0]["quant_type"] != act:
            conv = have[0].setdefault("convert", {"quant_type": act, "recv_nodes": set()})
            if conv["quant_type"] == act:
                conv["recv_nodes"].add(node.name)


def _convert_outputs(model, out: dict, promoted: dict, default_act) -> None:
    """A promoted node's outputs are converted back to the default type for the consumers that were
    not promoted: ONNX Runtime's quantizer does not add that convert itself, and a Mul fed one 16-bit
    and one 8-bit input ran in float on the HTP."""
    for node in model.graph.node:
        act = promoted.get(node.name)
        if act is None:
            continue
        for t in node.output:
            if t not in out:
                continue
            rest = {c.name for c in model.graph.node if t in c.input and promoted.get(c.name) != act}
            if rest:
                out[t][0]["convert"] = {"quant_type": default_act, "recv_nodes": rest}


def _constant_inputs(model, out: dict, promoted: dict, inits: dict) -> None:
    """A promoted elementwise node's float constants (a PRelu's slope, a Mul's scale) take its
    activation type when no other node reads them: quantized at the default 8 bits beside a 16-bit
    input, the op ran in float on the HTP (mtcnn_pnet with its PRelus at 16a8w: 20× the cycles)."""
    from onnx import TensorProto
    readers: dict[str, set] = {}
    for node in model.graph.node:
        for t in node.input:
            readers.setdefault(t, set()).add(node.name)
    for node in model.graph.node:
        act = promoted.get(node.name)
        if act is None:
            continue
        slots = node.input[:1] if node.op_type in _OWN_PARAMS else node.input
        for t in slots:
            if (t in inits and t not in out and inits[t].data_type == TensorProto.FLOAT
                    and all(promoted.get(r) == act for r in readers[t])):
                out[t] = [{"quant_type": act}]
