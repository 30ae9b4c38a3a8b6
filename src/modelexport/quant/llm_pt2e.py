"""ExecuTorch's QnnQuantizer on the static decoder's methods (the `.pte` path of LLMs).

The plan is `pt2e_qnn`'s: the default precision and the same module overrides as the ONNX path
(`llm_graphs.DEFAULT_OVERRIDES`: the embedding table and lm_head at 8-bit weights), expressed as
the quantizer's per-module configs, matched on the HF module paths the static decoder keeps.

KV-cache encodings are tied as the ONNX path ties them (`llm_graphs._tied_tensors`): a layer's
past-KV input and its new-KV output carry one range, the same in every method, so a runtime may
copy a method's new KV bytes into the next call's cache of either method as they are. ExecuTorch's
own flow reaches the same end by copying the decode graph's encodings into the prefill graph
(`_encoding_override`); here the observers of the KV inputs and outputs are given the range the
float decoder produced over the calibration text, after calibration and before conversion.
"""
from __future__ import annotations

from typing import Any

from ..core.errors import InputError
from .llm_graphs import DEFAULT_OVERRIDES
from .precision import get_precision
from .pt2e_qnn import QuantPlan, parse_overrides

# The precisions the `.pte` path of LLMs offers, default first (16-bit activations: the KV caches
# and the logits need them; 4-bit weights only in blocks: per-channel 4-bit loses the answer).
LLM_PTE_PRECISIONS = ("16a4w_block", "16a8w")
DEFAULT_BLOCK_SIZE = 32     # the ONNX path's LPBQ block (block_weights.DEFAULT_BLOCK)
# The most positions one RoPE-table lookup takes in a `.pte` method: QnnQuantizer quantizes the
# lookup (uint16 table, Gather), and the HTP simulator's quantized Gather gives wrong rows past the
# 16th index (SmolLM2 cut to 2 layers, ar32: twin vs its fake-quant graph 26.5 dB, 39.7 dB with the
# lookup split in gathers of 16; the same fault the ONNX path avoids by a float Gather, which the
# QNN partitioner of ExecuTorch refuses in a quantized graph: the HTP validates no fp32/fp16 Gather).
MAX_ROPE_GATHER = 16
# (de)quantize ops the converted graph carries at its boundary
_QUANTIZE_OPS = ("quantize_per_tensor", "dequantize_per_tensor")


def check_precision(name: str) -> None:
    p = get_precision(name)
    if p.name not in LLM_PTE_PRECISIONS:
        raise InputError(f"--format pte takes precision {', '.join(LLM_PTE_PRECISIONS)} for LLMs, not {p.name}",
                         f"use --precision {LLM_PTE_PRECISIONS[0]} (the default) or {LLM_PTE_PRECISIONS[1]}, or "
                         f"leave --format out for the context-binary bundle, which also takes {p.name}"
                         if p.name in ("16a4w", "16a16w", "8a8w") else
                         f"use --precision {LLM_PTE_PRECISIONS[0]} (the default) or {LLM_PTE_PRECISIONS[1]}")


def llm_quant_plan(precision: str, user_overrides: list[str] | None, block_size: int | None) -> QuantPlan:
    """The QuantPlan: the user's overrides first (the first match wins), then the ONNX path's defaults."""
    p = get_precision(precision)
    overrides = parse_overrides(list(user_overrides or []) + list(DEFAULT_OVERRIDES), p)
    for o in overrides:
        if o.precision.activation_bits != p.activation_bits:
            raise InputError(f"--override {o.pattern}={o.precision.name}: only the weight bits can differ from "
                             f"--precision {p.name} ({p.activation_bits}-bit activations)",
                             f"use one of: {', '.join(LLM_PTE_PRECISIONS)}")
    return QuantPlan(p, overrides, block_size=int(block_size or DEFAULT_BLOCK_SIZE))


def _observer_of(node) -> Any:
    """The observer module a prepared graph inserted after (or as) `node`."""
    from torchao.quantization.pt2e import ObserverBase
    gm = node.graph.owning_module
    if node.op == "call_module" and isinstance(getattr(gm, node.target, None), ObserverBase):
        return getattr(gm, node.target)
    for user in node.users:
        if user.op == "call_module" and isinstance(getattr(gm, user.target, None), ObserverBase):
            return getattr(gm, user.target)
    return None


def tie_kv_ranges(prepared, n_layers: int, kv_ranges: dict[str, list[float]], names_in: list[str],
                  names_out: list[str]) -> int:
    """Set the observers of every KV input and output to its tied [min, max]; → observers set."""
    import torch
    placeholders = [n for n in prepared.graph.nodes if n.op == "placeholder"]
    outputs = list(next(n for n in prepared.graph.nodes if n.op == "output").args[0])
    if len(placeholders) != len(names_in) or len(outputs) != len(names_out):
        raise InputError(f"the decoder graph has {len(placeholders)} inputs and {len(outputs)} outputs, "
                         f"expected {len(names_in)} and {len(names_out)}", "report this: the static decoder changed")
    done = 0
    for nodes, names in ((placeholders, names_in), (outputs, names_out)):
        for node, name in zip(nodes, names):
            if name not in kv_ranges:
                continue
            obs = _observer_of(node)
            if obs is None:
                raise InputError(f"{name} of the decoder graph has no quantization observer",
                                 "report this: the KV caches must be quantized to be tied")
            lo, hi = kv_ranges[name]
            obs.min_val = torch.tensor(float(lo))
            obs.max_val = torch.tensor(float(hi))
            done += 1
    return done


def boundary_encodings(converted, names_in: list[str], names_out: list[str]) -> dict[str, list[float]]:
    """{I/O name: [scale, zero_point]} of the (de)quantize ops next to the converted graph's inputs
    and outputs: what tying made of the KV caches, checked across methods."""
    def qparams(node) -> list[float] | None:
        if node is None or node.op != "call_function" or not any(q in str(node.target) for q in _QUANTIZE_OPS):
            return None
        return [float(node.args[1]), float(node.args[2])]

    placeholders = [n for n in converted.graph.nodes if n.op == "placeholder"]
    outputs = list(next(n for n in converted.graph.nodes if n.op == "output").args[0])
    out: dict[str, list[float]] = {}
    for node, name in zip(placeholders, names_in):
        q = next((qparams(u) for u in node.users if qparams(u)), None)
        if q:
            out[name] = q
    for node, name in zip(outputs, names_out):
        q = qparams(node)
        if q:
            out[name] = q
    return out


def check_pte_request(precision: str, variants: list[int], max_seq_len: int, socs, n_models: int = 1,
                      calibration: str | None = None) -> None:
    """What `--format pte` cannot take, said before any work: the precision, the variants, the SoCs."""
    from ..core.targets import require_feature
    if n_models != 1:
        raise InputError("one LLM per bundle", "compile each model into its own bundle")
    if calibration == "random":
        raise InputError("LLMs are calibrated on real text, not random data",
                         "give a text file with --calibration (default: lee_background.cor)")
    check_precision(precision)
    if len(variants) != 2 or 1 not in variants:
        raise InputError(f"--format pte holds one decode (ar1) and one prefill (arN) method; --variants gave "
                         f"{', '.join(f'ar{n}' for n in variants)}",
                         "give --variants ar1,arN (e.g. ar1,ar32), or leave --format out for more variants")
    if max_seq_len <= max(variants):
        raise InputError(f"--max-seq-len {max_seq_len} must be larger than the largest variant (ar{max(variants)})")
    p = get_precision(precision)
    for s in socs:
        require_feature(s, "weight_sharing", "--format pte (the decode and prefill methods share one copy of the "
                                             "weights through QNN weight sharing)")
        if p.feature:
            require_feature(s, p.feature, f"precision {p.name} ({p.description})")


def quantize_methods(decoders: dict, samples: dict, kv_ranges: dict[str, list[float]], plan: QuantPlan, soc):
    """{method: static decoder} → ({method: quantized GraphModule}, {method: example inputs},
    {method: {KV I/O: [scale, zp]}}); `samples`: {method: [flat input dicts]} from the float decoder."""
    import torch

    from .pt2e_qnn import quantize
    graphs, inputs, encodings = {}, {}, {}
    for method, dec in decoders.items():
        names_in, names_out = dec.input_names(), dec.output_names()
        inputs[method] = dec.example_inputs()
        ep = torch.export.export(dec, inputs[method], strict=True)
        calib = [tuple(torch.from_numpy(s[k]) for k in names_in) for s in samples[method]]
        graphs[method] = quantize(ep.module(), plan, soc, calib, before_convert=lambda p, d=dec, i=names_in, o=names_out:
                                  tie_kv_ranges(p, d.spec.n_layers, kv_ranges, i, o))
        encodings[method] = {k: v for k, v in boundary_encodings(graphs[method], names_in, names_out).items()
                             if k in kv_ranges}
    return graphs, inputs, encodings


def save_converted(converted, example_inputs: tuple, path) -> None:
    """A method's converted (fake-quant) graph as a `.pt2` (`torch.export`), the `.pte` bundle's
    fake-quant stage: what quantization alone does, run on the CPU by `eval` and `verify`
    (`llm.pte_session.load_fake_quant` reads it back)."""
    import torch
    _drop_unused_tensors(converted)
    torch.export.save(torch.export.export(converted, example_inputs, strict=False), str(path))


def _drop_unused_tensors(gm) -> None:
    """Conversion folds each weight into a quantized constant and leaves the float parameter in the
    module, read by no node; exported as is, every method's `.pt2` would carry the float weights too."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in [*gm.named_parameters(), *gm.named_buffers()]:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(gm.get_submodule(owner) if owner else gm, attr)
