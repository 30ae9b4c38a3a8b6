"""ExecuTorch's QnnQuantizer on the static decoder's methods (the `.pte` path of LLMs).

The plan is `pt2e_qnn`'s: the default precision and the same module overrides as the ONNX path
(`llm_graphs.DEFAULT_OVERRIDES`: the embedding table and lm_head at 8-bit weights), expressed as
the quantizer's per-module configs, matched on the HF module paths the static decoder keeps.

The 4-bit weights are the ONNX path's, not the quantizer's block min-max: the rounding the ONNX
path computes (llm/weight_quality.py: GPTQ by default, nearest where it falls back) is pinned into
each block observer before conversion (`pin_rounded_weights`), so both formats' integers and block
scales are the same (SmolLM2 cut to 2 layers: bench/experiments/llm_pte_weights.py, docs/llm_export.md).

KV-cache encodings are tied as the ONNX path ties them (`llm_graphs._tied_tensors`): a layer's
past-KV input and its new-KV output carry one range, the same in every method, so a runtime may
copy a method's new KV bytes into the next call's cache of either method as they are. ExecuTorch's
own flow reaches the same end by copying the decode graph's encodings into the prefill graph
(`_encoding_override`); here the observers of the KV inputs and outputs are given the range the
float decoder produced over the calibration text, after calibration and before conversion.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import InputError
from .block_weights import _QMIN as _INT4_MIN
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


def quantize_methods(decoders: dict, samples: dict, kv_ranges: dict[str, list[float]], plan: QuantPlan, soc,
                     rounded: dict | None = None, pinned: dict | None = None):
    """{method: static decoder} → ({method: quantized GraphModule}, {method: example inputs},
    {method: {KV I/O: [scale, zp]}}); `samples`: {method: [flat input dicts]} from the float decoder;
    `rounded`: the 4-bit weights every method gets (`pin_rounded_weights`), counts into `pinned`.
    The graphs keep only the tensors their nodes read (`_drop_unused_tensors`)."""
    import torch

    from .pt2e_qnn import quantize
    graphs, inputs, encodings = {}, {}, {}
    for method, dec in decoders.items():
        names_in, names_out = dec.input_names(), dec.output_names()
        inputs[method] = dec.example_inputs()
        ep = torch.export.export(dec, inputs[method], strict=True)
        calib = [tuple(torch.from_numpy(s[k]) for k in names_in) for s in samples[method]]
        def before_convert(p, d=dec, i=names_in, o=names_out, m=method):
            tie_kv_ranges(p, d.spec.n_layers, kv_ranges, i, o)
            if rounded:
                counts = pin_rounded_weights(p, rounded, plan.block_size)
                if pinned is not None:
                    pinned[m] = counts
        graphs[method] = quantize(ep.module(), plan, soc, calib, before_convert=before_convert)
        _drop_unused_tensors(graphs[method])
        encodings[method] = {k: v for k, v in boundary_encodings(graphs[method], names_in, names_out).items()
                             if k in kv_ranges}
    return graphs, inputs, encodings


LPBQ_LEVELS = 16    # ExecuTorch's lowering: block scales as levels 1..16 of the channel's largest / 16


def as_lowered(scale):
    """Block scales [N, K/block] as ExecuTorch's lowering gives them to QNN (`NodeVisitor.
    make_qnn_per_block_config`: channel scale = the largest block scale / 16, each block round(its scale
    / that) in 1..16), computed the same way; on scales of this form it changes nothing."""
    import torch
    channel = scale.amax(dim=-1) / LPBQ_LEVELS
    return torch.clamp(torch.round(scale / channel.unsqueeze(-1)), 1, LPBQ_LEVELS) * channel.unsqueeze(-1)


def pin_rounded_weights(prepared, rounded: dict, block: int) -> dict[str, int]:
    """Give each block-quantized linear/conv weight of a calibrated `prepared` graph the ONNX path's
    4-bit weight: `rounded` ({HF module name: BlockWeight [K, N]}, llm/weight_quality.py). Its
    PerBlockParamObserver returns the block scales the program will hold (ExecuTorch's own SeqMSE pass
    sets precomputed scales the same way: `calculate_qparams` replaced before convert_pt2e): the ONNX
    path's (level 1..15 x channel scale) as the lowering re-derives them (`as_lowered`), over the whole
    int4 grid [-8, 7]; the float parameter becomes integer x that scale. Conversion then folds exactly
    the ONNX path's integers, and the fake-quant graph computes what the program's weights are.
    Returns {"pinned": n, "left_min_max": weights with block observers and no rounded value}."""
    import types

    import torch
    from executorch.backends.qualcomm.quantizer.observers.per_block_param_observer import PerBlockParamObserver
    done = {"pinned": 0, "left_min_max": 0}
    for node in prepared.graph.nodes:
        if node.op != "call_function" or node.target not in (torch.ops.aten.linear.default,
                                                              torch.ops.aten.conv2d.default):
            continue
        obs_node = node.args[1]
        obs = getattr(prepared, obs_node.target, None) if obs_node.op == "call_module" else None
        if not isinstance(obs, PerBlockParamObserver):
            continue
        param = obs_node.args[0]
        name = param.target.removesuffix(".weight") if param.op == "get_attr" else None
        bw = rounded.get(name)
        if bw is None:
            done["left_min_max"] += 1
            continue
        owner_name, _, attr = param.target.rpartition(".")
        owner = prepared.get_submodule(owner_name) if owner_name else prepared
        weight = getattr(owner, attr)
        k, n = bw.q.shape
        if tuple(obs.block_size[:2]) != (1, block) or weight.shape[0] != n or weight[0].numel() != k:
            raise ValueError(f"{name}: graph weight {tuple(weight.shape)} blocks {tuple(obs.block_size)}, "
                             f"rounded [{k}, {n}] in blocks of {block}")
        min_max_scale, min_max_zp = obs.calculate_qparams()         # the shapes and dtypes convert expects
        scale = as_lowered(torch.from_numpy((bw.block_scales.astype(np.float32) * bw.channel_scale).T.copy()))
        q = torch.from_numpy(bw.q.T.astype(np.float32)).reshape(n, k // block, block)
        # a new tensor, not written into the old: an exported module's parameters are the float model's own
        value = (q * scale[:, :, None]).reshape(weight.shape).to(weight.dtype)
        setattr(owner, attr, torch.nn.Parameter(value, requires_grad=False) if isinstance(weight, torch.nn.Parameter)
                else value)
        obs.pinned_qparams = (scale.to(min_max_scale.dtype).reshape(min_max_scale.shape), torch.zeros_like(min_max_zp))
        obs.calculate_qparams = types.MethodType(lambda o: o.pinned_qparams, obs)
        obs.quant_min = int(_INT4_MIN)
        done["pinned"] += 1
    return done


def save_converted(converted, example_inputs: tuple, path) -> None:
    """A method's converted (fake-quant) graph as a `.pt2` (`torch.export`), the `.pte` bundle's
    fake-quant stage: what quantization alone does, run on the CPU by `eval` and `verify`
    (`llm.run.pte_session.load_fake_quant` reads it back)."""
    import torch
    _drop_unused_tensors(converted)
    torch.export.save(torch.export.export(converted, example_inputs, strict=False), str(path))


def _drop_unused_tensors(gm) -> None:
    """Conversion folds each weight into a quantized constant and leaves the float parameter in the
    module, read by no node. Exported as is, every method's `.pt2` and edge program would carry the float
    weights too (the pinned ones a copy per method), and the lowering's copy of the edge program again."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in [*gm.named_parameters(), *gm.named_buffers()]:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(gm.get_submodule(owner) if owner else gm, attr)
