"""QDQ quantization of decoder graphs: 16-bit activations, 4-bit (or 8/16-bit) weights per output
channel, per-module overrides.

ONNX Runtime's QNN quantization config quantizes MatMul weights per tensor when `per_channel`
is on ("QNN does not support per-channel MatMul", its comment says); that is useless at 4 bits.
Here every 2-D MatMul weight gets an explicit override instead: symmetric, `axis=1` (one scale
per output column), which the QNN EP compiles (measured on QAIRT 2.51, SM8650: every node on the
HTP). Block-wise 4-bit (16a4w_block, LPBQ) is not offered by ONNX Runtime's QDQ quantizer for
MatMul: with `block_size`, the 4-bit MatMul weights it made are rewritten afterwards from the
float weights (`block_weights`).

The residual stream stays out of the integer QDQ: the residual adds and the RMSNorms (and the
final norm) are float in the QDQ graph, which the HTP runs in fp16 (`enable_htp_fp16_precision`).
SmolLM2's residual carries massive activations (|x| up to ~25,000 from layer ~12 on): one uint16
scale per tensor has a step of ~0.76 there and erased every other channel (greedy output was
noise). Kept in fp16 (with the norm in its `scaled` form, see static_decoder), the 16a8w QDQ
graph scores the float perplexity and answers "Paris" (measured; see docs/llm_export.md).

Module paths for overrides are the HF names (`model.layers.3.mlp.down_proj`, `lm_head`,
`model.embed_tokens`), matched with `re.search`; first matching override wins.
"""
from __future__ import annotations

import logging
import re
import time
import warnings
from pathlib import Path

import numpy as np

from ..core.errors import CalibrationError, InputError, clip
from ..frontends.module_paths import llm_module_path
from .block_weights import load_rounded, to_block_weights, to_channel_weights
from .calibration import CalibrationSet
from .minmax_ranges import minmax_ranges, quantize_with_ranges
from .ort_qnn import qnn_quantization
from .override_spec import Override, parse_override_specs
from .precision import ONNX_PRECISIONS, Precision, get_precision

# weight bits → (QuantType name, symmetric)
_WEIGHT_TYPES = {4: ("QInt4", True), 8: ("QInt8", True), 16: ("QInt16", True)}
# by default the embedding table and lm_head keep 8-bit weights (ExecuTorch's 16a4w LLM recipes
# do the same for lm_head); `--override 'lm_head=16a4w'` makes them 4-bit too.
DEFAULT_OVERRIDES = (r"^model\.embed_tokens$=16a8w", r"^lm_head$=16a8w")
# what the QDQ quantizer here makes of a decoder; 16a4w_block is 16a4w whose 4-bit MatMul weights are
# then rewritten in blocks (see quantize_decoder)
LLM_PRECISIONS = ("16a4w", "16a8w", "16a16w", "8a8w")
LLM_DEFAULT_PRECISION = "16a4w_block"   # built from 16a4w (block_weights); what LLMs compile to by default
LLM_OFFERED = (*LLM_PRECISIONS, LLM_DEFAULT_PRECISION)   # what `--precision` may name for an LLM
# A layer's norms on the residual stream, by their HF module names: every family's input and
# post-attention norms, and the sandwich norms of Gemma 2 / 3 (the norm before the MLP reads the
# residual stream; the one after it writes into it). Quantized, the pre-MLP norm put one uint16 scale
# on the stream (a step of ~0.8 at Gemma 3 270M's |x| ~ 27,000) and the HTP's fixed-point norm
# departed from the QDQ graph: the real model cut to 6 layers gave 24.4 dB simulator vs QDQ (logits),
# 2 layers' worth below the bar (tests/test_llm_real_gemma3.py).
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
# node names (TorchScript exporter: the module path, then the op) that stay float: the residual adds
# of each layer (`/layers.3/Add`, `/layers.3/Add_1`), the layer norms and the final norm, and the
# RoPE table lookups (`/rotary_emb/Gather`, `/rotary_emb/Unsqueeze`). Quantized, the tables' Gather
# gave wrong rows on the HTP simulator for the chunk's tokens 16-31 (SmolLM2 cut to 2 layers, real
# text: the new keys at 6 dB vs the QDQ graph on the CPU, 65 dB with the tables float); see
# docs/llm_export.md. The `both` input mode's join of looked-up rows and given embeddings
# (`/embed_join/`) starts the residual stream: float too; so does what scales the stream's inputs
# (static_decoder.ResidualScale: `/residual_scale/`, `/layers.3/residual_scale/`). Attention's core
# (static_decoder.AttentionCore: q.k^T, scale, mask, softmax, p.v) runs in fp16 on the HTP: quantized,
# the HTP takes the second input of each 16x16 activation MatMul at 8 bits (bench/experiments/htp_matmul_precision.py:
# 40 dB where the fake-quant graph claims 84); Gemma 3 cut to 6 layers, simulator vs QDQ 26.9 -> 36.0 dB,
# top-1 vs float 77% -> 84%, for ~14% more simulator cycles (SmolLM2's ar32 cut, docs/llm_export.md).
# A LoRA adapter's branch (llm/model/lora.py: `/layers.3/self_attn/lora_1/`) is float too: its A and B are graph inputs
# set at run time, whose ranges no calibration can fix.
FLOAT_NODES = re.compile(r"^/layers\.\d+/Add(_1)?$|^/layers\.\d+/" + f"({'|'.join(LAYER_NORMS)})/" + r"|^/norm/"
                         r"|^/rotary_emb/|^/embed_join/|(^|/)residual_scale/|/self_attn/core/|/lora(_\d+)?/")


def parse_overrides(items: list[str], base_precision: str) -> list[Override]:
    base = get_precision(base_precision)

    def check(item: str, p: Precision) -> None:
        if not p.quantized or p.activation_bits != base.activation_bits:
            raise InputError(f"--override {item!r}: only the weight bits can differ from --precision {base.name} "
                             f"({base.activation_bits}-bit activations)",
                             f"use one of: {', '.join(x for x in LLM_PRECISIONS if get_precision(x).activation_bits == base.activation_bits)}")
    return parse_override_specs(items, "lm_head=16a8w", check, ONNX_PRECISIONS)


def weight_overrides(model, base_precision: str, overrides: list[Override]) -> tuple[dict, dict]:
    """TensorQuantOverrides for every MatMul/Gather weight, and {module: weight bits} for the manifest."""
    from onnxruntime.quantization import QuantType

    inits = {i.name: i for i in model.graph.initializer}
    base_bits = get_precision(base_precision).weight_bits
    tq: dict[str, list[dict]] = {}
    chosen: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in inits and len(inits[node.input[1]].dims) == 2:
            w, axis = node.input[1], 1
        elif node.op_type == "Gather" and node.input[0] in inits and len(inits[node.input[0]].dims) == 2:
            w, axis = node.input[0], None
        else:
            continue
        mod = llm_module_path(node.name)
        bits = next((o.precision.weight_bits for o in overrides if o.matches(mod)), base_bits)
        chosen[mod] = bits
        if axis is None:   # the embedding table: per tensor (Gather data)
            tq[w] = [{"quant_type": QuantType.QUInt8 if bits <= 8 else QuantType.QUInt16, "symmetric": False}]
            chosen[mod] = 8 if bits <= 8 else 16
            continue
        qt, sym = _WEIGHT_TYPES[bits]
        tq[w] = [{"quant_type": QuantType[qt], "symmetric": sym, "axis": axis}]
    return tq, chosen


# ops whose output the QDQ quantizer gives its input's encoding: a range fixed on a graph output
# must be fixed on the tensor before them too, or the output inherits the upstream range
_SAME_ENCODING_OPS = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def _tied_tensors(model, tied_ranges: dict[str, list[float]]) -> dict[str, list[float]]:
    """{tensor: range} for the graph inputs and outputs named in `tied_ranges`, and for the tensors
    each output takes its encoding from (through `_SAME_ENCODING_OPS`)."""
    io_names = {v.name for v in (*model.graph.input, *model.graph.output)}
    producer = {o: n for n in model.graph.node for o in n.output}
    out: dict[str, list[float]] = {}
    for name, r in tied_ranges.items():
        if name not in io_names:
            continue
        out[name] = r
        node = producer.get(name)
        while node is not None and node.op_type in _SAME_ENCODING_OPS:
            out[node.input[0]] = r
            node = producer.get(node.input[0])
    return out


def quantize_decoder(float_path: Path, out_path: Path, precision: str, overrides: list[Override],
                     calibration: CalibrationSet, block_size: int = 0,
                     tied_ranges: dict[str, list[float]] | None = None, rounded_path: str | None = None) -> dict:
    """ONNX Runtime's QDQ quantization of one decoder graph; with `block_size`, its 4-bit MatMul
    weights are then re-quantized in blocks of that many input channels (LPBQ, 16a4w_block).
    `tied_ranges` ({tensor: [min, max]}) fixes the ranges of those graph inputs and outputs (the KV
    caches), so every graph that names them gets the same encoding. `rounded_path` (the file of
    `llm/weight_quality.py`) gives the 4-bit weights as a data-aware rounding chose them."""
    import onnx

    prec = get_precision(precision)
    act, weight = prec.quant_types()
    model = onnx.load(str(float_path), load_external_data=False)
    tq, chosen = weight_overrides(model, precision, overrides)
    tied = _tied_tensors(model, tied_ranges or {})
    for name, (lo, hi) in tied.items():   # the quantizer wants numpy scalars here
        tq[name] = [{"rmin": np.float32(lo), "rmax": np.float32(hi)}]
    float_nodes = [n.name for n in model.graph.node if FLOAT_NODES.search(n.name)]
    four_bit = {n.name: llm_module_path(n.name) for n in model.graph.node if n.op_type == "MatMul"
                and n.input[1] in tq and chosen.get(llm_module_path(n.name)) == 4}
    block_nodes = set(four_bit) if block_size else set()
    del model
    t0 = time.perf_counter()
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = qnn_quantization().get_qnn_qdq_config(str(float_path), calibration.reader(), activation_type=act,
                                                           weight_type=weight, per_channel=True, init_overrides=tq,
                                                           nodes_to_exclude=float_nodes)
            config.use_external_data_format = True
            try:
                t1 = time.perf_counter()
                ranges = minmax_ranges(float_path, calibration.samples, config.op_types_to_quantize)
                ranges_s = time.perf_counter() - t1
                quantize_with_ranges(float_path, out_path, config, ranges)
            except Exception as e:
                raise CalibrationError(f"quantizing {float_path.name} failed: {clip(str(e), 1000)}",
                                       "check the calibration text; report the model if it persists") from None
    finally:
        root.setLevel(level)
    blocks, rounded, rewritten = {}, None, {}
    if rounded_path:
        rounded = load_rounded(rounded_path, four_bit)
        if not block_size:
            t2 = time.perf_counter()
            rewritten = {"matmuls": to_channel_weights(out_path, rounded), "seconds": round(time.perf_counter() - t2, 2)}
    if block_nodes:
        t2 = time.perf_counter()
        blocks = {"block_size": block_size, "matmuls": to_block_weights(out_path, float_path, block_nodes, block_size, rounded),
                  "rounded_given": len(rounded or {}),
                  "seconds": round(time.perf_counter() - t2, 2),
                  "what": "4-bit MatMul weights in blocks of input channels, block scales as uint4 x a float per "
                          "output channel (LPBQ)"}
    bits = sorted(set(chosen.values()))
    return {"precision": prec.name, "activation_type": prec.activation_type, "weight_bits": {str(b): sum(1 for v in chosen.values() if v == b) for b in bits},
            "modules": chosen, "per_channel": "MatMul weights per output channel (axis 1), symmetric; embedding per tensor",
            "float_nodes": {"count": len(float_nodes), "what": "residual adds, RMSNorms and RoPE table lookups (fp16 on the HTP)"},
            "calibration_method": "MinMax", "tied_io_ranges": len(tied), "ranges_seconds": round(ranges_s, 2), **({"blocks": blocks} if blocks else {}),
            **({"rounded_weights": rewritten} if rewritten else {}),
            "seconds": round(time.perf_counter() - t0, 2)}


def quantize_job(job: dict) -> dict:
    """`quantize_decoder` in a worker process (toolchain/worker_pool.py)."""
    cal = CalibrationSet(job["samples"], "text", job["source"])
    return quantize_decoder(Path(job["float_path"]), Path(job["out_path"]), job["precision"], job["overrides"], cal,
                            job.get("block_size", 0), job.get("tied_ranges"), job.get("rounded_path"))


# what adds up when the quantization records of a part's chunks become the part's (counts, seconds)
_SUMMED = {"seconds", "ranges_seconds", "count", "tied_io_ranges", "matmuls", "rounded_given"}


def merge_quantization(records: list[dict]) -> dict:
    """One part's quantization record from its chunks' (quant/chunk_join.py), in chunk order."""
    def merge(a, b, key=""):
        if isinstance(a, dict) and isinstance(b, dict):
            out = dict(a)
            for k, v in b.items():
                out[k] = merge(a[k], v, k) if k in a else v
            return out
        if key in _SUMMED and isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return round(a + b, 2) if isinstance(a + b, float) else a + b
        return a
    out = records[0]
    for r in records[1:]:
        bits = {k: out["weight_bits"].get(k, 0) + r["weight_bits"].get(k, 0)
                for k in {*out["weight_bits"], *r["weight_bits"]}}
        out = {**merge(out, r), "weight_bits": dict(sorted(bits.items(), key=lambda kv: int(kv[0])))}
    return {**out, "chunks": len(records)} if len(records) > 1 else out
