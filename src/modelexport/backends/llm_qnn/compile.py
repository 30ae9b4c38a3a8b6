"""LLM (GGUF file or HF folder) → static decoder variants → 16a4w QDQ → one weight-shared QNN
context binary per part for devices, plus an unshared twin per graph for the host simulator.

    modelexport compile SmolLM2.gguf --target SM8650 --precision 16a4w --variants ar1,ar32 \
        --max-seq-len 512 [--calibration text.txt] [--override 'lm_head=16a4w'] -o OUT

Stages, each cached by content (source sha256 + options + ONNX Runtime / QAIRT builds):
1. `llm-qdq`: load the model, export every (variant, part) to ONNX, calibrate on real text run
   through the float decoder, quantize (16-bit activations, per-channel 4-bit weights).
   Also holds the tokenizer. A hit skips loading the model at all.
2. `llm-ctx-shared`: per target and part, all variants compiled in one child process with
   `ep.share_ep_contexts` → one `_ctx_qnn.bin` (weights once).
3. `ctx`: per target, variant and part, the same QDQ graph compiled alone (the simulator cannot
   load weight-shared binaries; numerics run on these twins).

Graph names (AI Hub's scheme): `{type}_ar{N}_cl{C}_{i}_of_{n}` with type `prompt` for N > 1 and
`token` for N = 1, C = max_seq_len, part i of n. The QNN EP names the graphs inside the binary
itself (`QNNExecutionProvider_QNNExecutionProvider_<hash>_1_0`); the manifest maps each documented
name to it. Parts of a split decoder are compiled from paths that make those names sort in part
order, which is how Genie orders them (toolchain/qnn_graph_order.py).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable


from ...contract import BundleWriter, GraphSpec, TensorSpec, open_bundle
from ...core.atomic import check_output
from ...contract.manifest import (GRAPH_NAMING, CacheInfo, DecoderShape, GenieCheck, HostTwin, LlmSection, MemoryEstimate, QairtInfo,
                                  SourceModel, Timings, WeightSharing)
from ...core.vocab import BundleKind, Format, GraphKind, Role
from .. import backend
from ...toolchain.htp_options import check_knobs, compile_provider_options, host_twin_provider_options
from ..spec import LlmCompileOptions, PartSpec, max_seq_len_of
from ...core.cache import Cache, cache_key
from ...core.errors import InputError, ModelExportError, ToolchainError, UnsupportedError, VerificationError
from ...quant.precision import check_block_size, get_precision
from ...core.targets import SoC, get_target, require_feature
from ...toolchain.worker_pool import WorkerPool, raise_first_error, run_jobs
from .memory import DEFAULT_CONTEXT_LIMIT_MB, DEFAULT_HOST_CHUNK_MB, host_chunk_mb, host_part_mb, plan_parts
from ...quant.block_weights import DEFAULT_BLOCK
from ...quant.llm_graphs import DEFAULT_OVERRIDES, LLM_PRECISIONS, parse_overrides

EXPORT_VERSION = 9   # 4: RoPE table lookups float; 5: KV-cache encodings tied across graphs; 6: host-sized
#                      parts, weight rounding; 7: the static decoder built from the family table; 8: the residual
#                      stream carried at 1/s (llm/residual_scale.py), Gemma's sandwich norms float (bump on any
#                      change to the decoder or to what stays float); 9: attention's core float (fp16 on the HTP)
JOIN_VERSION = 2      # 2: a part's boundary tensors named after the layer they follow (Genie hands them on by name)
DEFAULT_VARIANTS = (1, 32)
DEFAULT_CALIBRATION_SAMPLES = 8
# cache key: how calibration.ImageRows places a VLM's images (windows 1, 3, 5, ...; 3: the runtime's blocks of ids
# (tiles' markers, wrap ids), rows of the views it shows the vision part, M-RoPE grid positions)
IMAGE_ROWS_VERSION = "image-rows-3"


def graph_name(n: int, max_seq_len: int, part: int, n_parts: int) -> str:
    """`full` for the full-context graph (N = C), `prompt` for N > 1, `token` for N = 1."""
    kind = "full" if n == max_seq_len else "token" if n == 1 else "prompt"
    return f"{kind}_ar{n}_cl{max_seq_len}_{part}_of_{n_parts}"


def embedder_graph_name(n: int, max_seq_len: int) -> str:
    return f"embed_ar{n}_cl{max_seq_len}"


# `--variants full` (seed 003's `--variant bert`): one graph over the whole context (N = --max-seq-len),
# causal, no KV-cache inputs or outputs; parse_variants marks it FULL, _resolve makes it N = C.
FULL_CONTEXT_NAMES = ("full", "bert")
FULL = 0


def parse_variants(v: Any) -> list[int]:
    if v is None:
        return list(DEFAULT_VARIANTS)
    items = v if isinstance(v, (list, tuple)) else str(v).split(",")
    out = []
    for it in items:
        for s in str(it).split(","):
            s = s.strip().lower()
            if not s:
                continue
            if s in FULL_CONTEXT_NAMES:
                out.append(FULL)
                continue
            num = s[2:] if s.startswith("ar") else s
            if not num.isdigit() or int(num) < 1:
                raise InputError(f"--variants: {s!r} is not arN or full", "write e.g. --variants ar1,ar32 (or ar1,ar32,full)")
            out.append(int(num))
    if not out:
        raise InputError("--variants is empty", "write e.g. --variants ar1,ar32")
    return sorted(set(out), reverse=True)


# ----------------------------------------------------------------------------------------------
# stage 1: export + calibrate + quantize (cached)

def _build_qdq(tmp: Path, src_path: Path, variants: list[int], max_seq_len: int, precision: str, overrides,
               text, n_samples: int, limit_mb: float, report, workers: int, block_size: int = 0,
               quality: dict | None = None, *, cache: Cache | None = None, stage_key: str = "",
               weights_dtype: str = "float32", chunk_mb: float = DEFAULT_HOST_CHUNK_MB, inputs: str = "tokens",
               embedder_precision: str | None = None, image_calibration: str | None = None) -> dict:
    """Load, calibrate, then export and quantize chunk by chunk: each (variant, part, chunk) graph is
    its own cache entry (`part_stage`), reused when a killed compile is run again; a part's chunks
    are then joined into the part's graph (quant/chunk_join.py)."""
    import torch

    from ...frontends import find_frontend
    from ...llm.input_modes import get_input_mode, no_token_id
    from ...llm.static_decoder import ONNX_RMS_NORM, build_static_decoder, decoder_config
    from ...llm.tokenizers import from_transformers
    from ...llm.text import tokenize
    from .calibration import calibration_samples, full_context_samples, part_samples, with_input_mode
    from ...llm.parts import host_chunks
    from .onnx_export import DecoderPart, export_part
    from .part_stage import PART_NAMESPACE, join_into, part_key, quantize_part
    from ...llm.weight_dtype import in_float32, part_modules, store_bf16

    cache = cache or Cache(enabled=False)
    t0 = time.perf_counter()
    report("loading the model")
    # a bf16 HF checkpoint is loaded as bf16 (not float32 then halved: that peak was 6.8 GB for 1B)
    bf16_folder = weights_dtype == "bfloat16" and src_path.is_dir()
    fe = find_frontend(str(src_path))
    llm = fe.load(str(src_path), dtype=torch.bfloat16) if bf16_folder else fe.load(str(src_path))
    model, cfg = llm.model, llm.config
    held_bf16 = store_bf16(model, weights_dtype)   # a weight source between the parts' float32 moments
    load_s = round(time.perf_counter() - t0, 2)
    ctx = getattr(cfg, "max_position_embeddings", None)    # checked against --max-seq-len before loading (source.py)
    prec = get_precision(precision)
    embed_bits, head_bits = _embed_head_bits(overrides, prec.weight_bits)
    parts, mem = plan_parts(cfg, variants, max_seq_len, prec.weight_bits, prec.activation_bits, limit_mb,
                            embed_bits, head_bits)
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    tok.save(tmp / "tokenizer")
    names = {(n, p.index): graph_name(n, max_seq_len, p.index, p.count) for n in variants for p in parts}
    chunks = {p.index: host_chunks(cfg, p, chunk_mb * 2**20) for p in parts}
    chunk_names = {(n, p.index): [c.name(names[(n, p.index)]) for c in chunks[p.index]] for n in variants for p in parts}
    keys = {c: part_key(stage_key, c) for cs in chunk_names.values() for c in cs}
    done = {c for c, k in keys.items() if cache.get(PART_NAMESPACE, k)}
    if done:
        reused = [p.index for p in parts if all(c in done for n in variants for c in chunk_names[(n, p.index)])]
        report(f"resuming: {_ranges(reused) or 'no whole part'} of {len(parts)} reused "
               f"({len(done)} of {len(keys)} graphs quantized before)")
    ids = tokenize(tok, text.text, max_seq_len * (n_samples + 2))
    kv_ranges: dict[str, list[float]] = {}   # one encoding per layer's cache, in every graph (Genie)
    t1 = time.perf_counter()
    samples: dict[int, list] = {n: [] for n in variants}
    mode = get_input_mode(inputs)
    no_token = no_token_id(mode, model.get_input_embeddings().weight.shape[0],
                           model.get_output_embeddings().weight.shape[0], tok.vocab_size)
    ar_variants = [n for n in variants if n != max_seq_len]
    stream_peak: dict = {}
    if len(done) < len(keys):
        report(f"calibrating on {text.path.name} through the float decoder")
        images = None
        if image_calibration and mode.name == "embeddings":   # `both` feeds rows beside ids: not calibrated so here
            from .calibration import ImageRows
            images = ImageRows.load(image_calibration)
            report(f"calibrating with {len(images.rows)} images' vision rows at image tokens in every other window"
                   + (" (at their M-RoPE grid positions)" if images.grid else ""))
        samples = calibration_samples(model, ids, ar_variants, max_seq_len, n_samples, kv_ranges, images, stream_peak)
        if max_seq_len in variants:      # the full-context graph: whole windows, no cache
            samples[max_seq_len] = full_context_samples(ids, max_seq_len, n_samples)
    calib_s = round(time.perf_counter() - t1, 2)
    residual_scale = _residual_scale(stream_peak, [cache.get(PART_NAMESPACE, keys[c]) for c in sorted(done)], report)
    graphs = [{"name": names[(n, p.index)], "n_tokens": n, "part": p.index, "n_parts": p.count,
               "layers": [p.first_layer, p.end_layer], "qdq": f"qdq/{names[(n, p.index)]}.onnx",
               "memory_estimate": mem[n][p.index - 1].to_dict()} for n in variants for p in parts]
    export_s, results = 0.0, {}
    # the 4-bit weights' plan (rounding, recipe) is computed again on a resume: the graphs still
    # to quantize need it, and the manifest records it
    weights = _plan_weights(model, tok, text, max_seq_len, precision, overrides, block_size, tmp, quality, report)
    overrides = weights.overrides
    (tmp / "qdq").mkdir()
    float_dir = tmp / "float"
    n_graphs = len(keys)
    samples_per_variant = {str(n): len(samples[n]) for n in variants}
    # ONNX Runtime's quantizer is single-threaded Python: each graph is quantized in a worker as soon
    # as it is exported, while the next one is exported here
    with WorkerPool("the quantization of the LLM graphs", max(1, min(workers, n_graphs - len(done)))) as pool:
        t3 = None
        # a chunk with the embedding or the head is the largest to export and to quantize (1B: 646 MB in
        # float32, 1.4 GB in a worker): where other chunks are smaller, one such in the process tree at a
        # time (two quantizing together made the 1B-shaped compile's peak, 6.05 GB); the parent waits
        # while the workers go on with the others
        ends_job = None
        one_ends_chunk = any(not (c.is_first or c.is_last) for cs in chunks.values() for c in cs)
        for n in variants:
            dec = build_static_decoder(model, decoder_config(n, max_seq_len), rms_norm=ONNX_RMS_NORM, inputs=mode.name,
                                       residual_scale=residual_scale)
            with torch.inference_mode(), in_float32([dec.model.embed_tokens]):
                samples[n] = with_input_mode(samples[n], mode, lambda x: dec.lookup(torch.from_numpy(x)).float().numpy(),
                                             dec.spec.hidden_size)
            hidden = None
            order = [(c, name) for p in parts for c, name in zip(chunks[p.index], chunk_names[(n, p.index)])]
            for i, (chunk, name) in enumerate(order):
                if all(later in done for _, later in order[i:]):
                    break                  # this variant's remaining graphs are all finished
                ps = part_samples(samples[n], chunk, hidden, mode.decoder_inputs)
                if name not in done:
                    carries_ends = one_ends_chunk and (chunk.is_first or chunk.is_last)
                    if carries_ends and ends_job is not None:
                        pool.wait(ends_job)
                    report(f"exporting {name}")
                    t2 = time.perf_counter()
                    fpath = export_part(dec, chunk, float_dir / f"{name}.onnx")
                    export_s += time.perf_counter() - t2
                    t3 = t3 or time.perf_counter()
                    job = pool.submit(quantize_part, {
                        "name": name, "key": keys[name], "cache_root": str(cache.root), "cache_enabled": cache.enabled,
                        "residual_scale": residual_scale,
                        "quantize": {"float_path": str(fpath), "precision": precision, "overrides": overrides,
                                     "samples": ps, "source": str(text.path), "block_size": block_size,
                                     "tied_ranges": kv_ranges,
                                     "rounded_path": weights.graph_file}})
                    ends_job = job if carries_ends else ends_job
                    results[name] = None
                if not chunk.is_last:   # hidden states entering the next chunk, from the float layers
                    mod = DecoderPart(dec, chunk).eval()
                    with torch.inference_mode(), in_float32(part_modules(dec, chunk)):
                        hidden = [mod(*[torch.from_numpy(s[k]) for k in mod.input_names()])[0].float().numpy()
                                  for s in ps]
            del dec
        del samples   # the workers have what they need
        if results:
            report(f"quantizing {len(results)} graphs ({precision}{f', 4-bit blocks of {block_size}' if block_size else ''})")
        outcomes = pool.outcomes()
    quant_s = time.perf_counter() - t3 if t3 else 0.0   # from the first graph's hand-over: overlaps the later exports
    embedder = None
    if mode.embedder:
        from .embedder import build_embedders
        report("exporting the embedder part")
        embedder = build_embedders(model, variants, max_seq_len, ids, embedder_precision, tmp / "embedder", float_dir,
                                   str(text.path))
    shutil.rmtree(float_dir, ignore_errors=True)
    for name, r in zip(list(results), raise_first_error(outcomes)):
        results[name] = r
    quant_info = {}
    decoder = build_static_decoder(model, decoder_config(min(variants), max_seq_len))
    for g in graphs:
        members = chunk_names[(g["n_tokens"], g["part"])]
        entries = [Path(results[c]["entry"]) if results.get(c) else cache.get(PART_NAMESPACE, keys[c]) for c in members]
        quant_info[g["name"]] = join_into(entries, members, chunks[g["part"]], g["name"], tmp / "qdq",
                                          first_inputs=mode.decoder_inputs, caches=g["n_tokens"] != max_seq_len,
                                          mrope=decoder.mrope)
        if not cache.enabled:
            for entry in entries:
                shutil.rmtree(entry, ignore_errors=True)
    sd = decoder.spec
    n_params = sum(p.numel() for p in model.parameters())
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta or getattr(cfg, "rope_theta", 10000.0)
    return {"graphs": graphs, "parts": [[p.first_layer, p.end_layer] for p in parts],
            "host_chunks": {"mb": chunk_mb, "layers": [[c.first_layer, c.end_layer] for p in parts for c in chunks[p.index]]},
            "spec": {"n_layers": sd.n_layers, "n_heads": sd.n_heads, "n_kv_heads": sd.n_kv_heads, "head_dim": sd.head_dim,
                     "hidden_size": sd.hidden_size, "vocab_size": sd.vocab_size, "max_seq_len": max_seq_len},
            "architecture": llm.architecture, "n_params": int(n_params), "rope_theta": float(theta),
            "bos_id": tok.bos_id, "add_bos": bool(tok.add_bos), "eos_ids": list(tok.eos_ids), "context_length": ctx,
            "quantization": quant_info, "calibration": {"text": str(text.path), "sha256": text.sha256,
                                                          "tokens": len(ids), "samples_per_variant": samples_per_variant},
            "inputs": mode.name, "embedder": embedder, "no_token_id": no_token, "residual_scale": residual_scale,
            "resumed_graphs": sorted(done), "weights_held_as": "bfloat16" if held_bf16 else "float32",
            "weight_rounding": weights.plan.rounding if weights.plan else None,
            "quality_recipe": weights.plan.recipe if weights.plan else None,
            "timings": {"load_s": load_s, "calibration_s": calib_s, "export_s": round(export_s, 2),
                        "quantize_s": round(quant_s, 2), **weights.timings}}


def _residual_scale(stream_peak: dict, done_entries: list, report) -> float:
    """The residual stream's scale (llm/residual_scale.py): from this calibration's peak, or, when every
    graph was quantized before (no calibration ran), the one those graphs were exported with."""
    from ...llm.residual_scale import residual_scale_for
    if "max" not in stream_peak:
        return float(next((Cache.meta(e).get("residual_scale", 1.0) for e in done_entries if e), 1.0))
    scale = residual_scale_for(stream_peak["max"])
    if scale != 1.0:
        report(f"carrying the residual stream at 1/{scale:g} in the graphs: it peaks at {stream_peak['max']:,.0f} on "
               "the calibration text, beyond what fp16 on the HTP holds with room to spare")
    return scale


class _Weights:
    """The 4-bit weights' plan for _build_qdq: overrides to use, the rounded weights file, the record."""
    def __init__(self, overrides, plan=None, graph_file=None, timings=None):
        self.overrides, self.plan, self.graph_file, self.timings = overrides, plan, graph_file, timings or {}


def _plan_weights(model, tok, text, max_seq_len: int, precision: str, overrides, block_size: int, tmp: Path,
                  quality: dict | None, report) -> _Weights:
    """Data-aware rounding and the quality recipe (llm/weight_quality.py), for 4-bit precisions."""
    if not quality:
        return _Weights(overrides)
    from ...llm.text import tokenize
    from ...llm.weight_quality import HELD_OUT_TOKENS, WeightPlan, four_bit_linears, plan_weights
    from ...quant.weight_rounding import MIN_ROUNDING_TOKENS, ROUNDING_TOKENS, ROUNDINGS, get_rounding
    t0 = time.perf_counter()
    names = four_bit_linears(model, get_precision(precision).weight_bits, overrides)
    ids = tokenize(tok, text.text, ROUNDING_TOKENS + HELD_OUT_TOKENS)
    note = ""
    if get_rounding(quality["rounding"]).needs_activations and not quality.get("rounding_given") \
            and len(ids) < MIN_ROUNDING_TOKENS:
        # the default is the best rounding the text allows: a short text is no error unless a
        # data-aware rounding was asked for by name
        note = (f" (the default --rounding {quality['rounding']} needs {MIN_ROUNDING_TOKENS}+ calibration tokens, "
                f"the text has {len(ids)})")
        report(f"4-bit weights rounded to nearest{note}")
        quality = {**quality, "rounding": "nearest", "rounding_why": "the default" + note}
    if quality["rounding"] == "nearest" and not quality.get("max_ppl_ratio"):
        # the workers round to nearest themselves, as before: nothing to compute here
        return _Weights(overrides, WeightPlan(rounding={"method": "nearest", "what": ROUNDINGS["nearest"].what + note,
                                                        "why": quality.get("rounding_why"), "modules": len(names)}))
    plan = plan_weights(model, ids, min(max_seq_len, 1024), names, quality["rounding"], block_size, tmp / "rounding",
                        quality.get("max_ppl_ratio"), report)
    plan.rounding["why"] = quality.get("rounding_why")
    extra = parse_overrides(plan.extra_overrides, precision)
    rounded = str(plan.rounded_path) if quality["rounding"] != "nearest" else None
    return _Weights(extra + list(overrides), plan, rounded, {"weight_plan_s": round(time.perf_counter() - t0, 2)})


def _embed_head_bits(overrides, weight_bits: int) -> tuple[int, int]:
    bits = {o.pattern: o.precision.weight_bits for o in overrides}
    return (next((b for p, b in bits.items() if "embed" in p), weight_bits),
            next((b for p, b in bits.items() if "lm_head" in p), weight_bits))


def _ranges(indices: list[int]) -> str:
    """[1, 2, 4] -> 'parts 1–2, 4'."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ", ".join(f"{a}–{b}" if a != b else f"{a}" for a, b in spans)
    return f"part{'s' if len(indices) > 1 else ''} {text}" if indices else ""



def _refuse_vision_flags(opts: LlmCompileOptions) -> None:
    """A text LLM without --vision-encoder: the vision flags would be silently ignored."""
    from ..spec import vision_flags_given
    for flag in vision_flags_given(opts):   # --vision-encoder itself makes it a VLM compile before this
        raise InputError(f"{flag} is for vision-language models; this model has no vision part",
                         f"leave {flag} out, or add --vision-encoder ENCODER.onnx to give it one")


def _resolve(spec: PartSpec, opts: LlmCompileOptions):
    """Every option checked and given its default, and the source's facts: no weights loaded."""
    from types import SimpleNamespace

    from ...llm.text import read_text
    from .source import check_source
    if opts.output_format != Format.CONTEXT_BINARY:
        raise InputError(f"LLMs compile to context-binary, not {opts.output_format!r}", "leave --format out")
    requested_precision = get_precision(spec.precision or "16a4w_block")
    requested = requested_precision.name
    check_block_size(opts.block_size)
    block_size = int(DEFAULT_BLOCK if opts.block_size is None else opts.block_size) if requested_precision.block_wise else 0
    # 16a4w_block: ONNX Runtime quantizes as 16a4w, then the 4-bit MatMul weights become LPBQ blocks
    precision = "16a4w" if block_size else requested
    if precision not in LLM_PRECISIONS:
        raise InputError(f"precision {precision} is not offered for LLMs",
                         f"use one of: {', '.join(LLM_PRECISIONS + ('16a4w_block',))}")
    from ...core.arguments import at_least
    # checked before the `or default` below: 0 would otherwise silently become the default
    at_least("--calibration-samples", opts.calibration_samples, 1, str(DEFAULT_CALIBRATION_SAMPLES))
    at_least("--context-limit-mb", opts.context_limit_mb, 0.001, f"{DEFAULT_CONTEXT_LIMIT_MB:g}")
    variants = parse_variants(opts.variants)
    max_seq_len = max_seq_len_of(opts.max_seq_len)   # 0 is refused, not taken for the default
    full = FULL in variants
    variants = [n for n in variants if n != FULL]
    if not variants:
        raise InputError("--variants full alone: the full-context graph scores a whole context but cannot generate "
                         "(it keeps no KV cache)", "add an arN graph beside it, e.g. --variants ar1,full")
    if max_seq_len <= max(variants):
        raise InputError(f"--max-seq-len {max_seq_len} must be larger than the largest variant (ar{max(variants)})",
                         f"raise --max-seq-len above {max(variants)}, or choose smaller variants "
                         f"(e.g. --variants ar1,ar{min(32, max_seq_len // 2) or 1})")
    if full:   # N = C: the first (largest) variant
        variants = [max_seq_len, *variants]
    from ...llm.input_modes import get_input_mode
    from .embedder import get_embedder_precision
    mode = get_input_mode(opts.inputs)
    if opts.embedder_precision is not None and not mode.embedder:
        raise InputError(f"--embedder-precision is for the embedder part of --inputs embeddings; --inputs {mode.name} "
                         "has none", "leave --embedder-precision out, or add --inputs embeddings")
    embedder_precision = get_embedder_precision(opts.embedder_precision).name if mode.embedder else None
    socs: list[SoC] = []
    for t in opts.targets or ["SM8650"]:
        s = get_target(t)
        if s not in socs:
            socs.append(s)
    check_knobs(socs, opts.vtcm_mb, opts.optimization_level)
    for s in socs:
        if len(variants) > 1:
            require_feature(s, "weight_sharing", f"{len(variants)} variants sharing one copy of the weights")
        if requested_precision.feature:   # the precision table says what the HTP must have
            require_feature(s, requested_precision.feature, f"precision {requested} ({requested_precision.description})")
    overrides = parse_overrides(list(DEFAULT_OVERRIDES) + list(opts.overrides or []), precision)
    overrides = list(reversed(overrides))  # user overrides first: the first match wins
    facts = check_source(spec.model, max_seq_len)
    text = read_text(spec.calibration if spec.calibration not in (None, "random") else None)
    if spec.calibration == "random":
        raise InputError("LLMs are calibrated on real text, not random data",
                         "give a text file with --calibration (default: lee_background.cor)")
    n_samples = int(opts.calibration_samples or DEFAULT_CALIBRATION_SAMPLES)
    quality = _quality_options(opts, precision, facts.shape or {})
    limit_mb = float(opts.context_limit_mb or DEFAULT_CONTEXT_LIMIT_MB)
    from ...core.arguments import at_least
    at_least("--host-chunk-mb", opts.host_chunk_mb, 0.001, "128")
    chunk_mb = float(opts.host_chunk_mb or host_chunk_mb(limit_mb))
    jobs = opts.jobs or min(2, os.cpu_count() or 1)
    return SimpleNamespace(jobs_given=bool(opts.jobs), requested=requested, requested_precision=requested_precision, block_size=block_size,
                           precision=precision, variants=variants, max_seq_len=max_seq_len, socs=socs,
                           overrides=overrides, facts=facts, text=text, n_samples=n_samples, limit_mb=limit_mb, chunk_mb=chunk_mb,
                           jobs=jobs, quality=quality, inputs=mode.name, embedder_precision=embedder_precision)


def _estimate(r, cache: Cache, quantized: bool):
    """The plan and the host estimate of a resolved job (None when the source's shape is unknown)."""
    from ...llm.job_estimate import config_from_shape, estimate_job
    cfg = config_from_shape(r.facts.shape)
    if cfg is None:
        return None
    prec = get_precision(r.precision)
    embed_bits, head_bits = _embed_head_bits(r.overrides, prec.weight_bits)
    parts, _ = plan_parts(cfg, r.variants, r.max_seq_len, prec.weight_bits, prec.activation_bits, r.limit_mb,
                          embed_bits, head_bits)
    from ...llm.layerwise_rounding import rounding_bytes
    from ...quant.weight_rounding import get_rounding
    data_aware = r.quality and (get_rounding(r.quality["rounding"]).needs_activations or r.quality.get("max_ppl_ratio"))
    return estimate_job(cfg, parts, r.variants, r.jobs, prec.weight_bits, r.facts.weights_dtype == "bfloat16",
                        len(r.socs), quantized=quantized, chunk_bytes=r.chunk_mb * 2**20,
                        rounding_bytes=(rounding_bytes(r.facts.shape) or 0) if data_aware else 0,
                        embedder=r.embedder_precision)


def _fitted_estimate(r, cache: Cache, quantized: bool):
    """The estimate, and a note when it took fewer workers: if the default worker count does not fit
    the memory the machine has but one worker does, the job runs with one (slower, not refused);
    `r.jobs` is set to what runs. A --jobs the user gave is kept (and refused if it does not fit)."""
    from ...llm.job_estimate import GB, available_memory
    est = _estimate(r, cache, quantized)
    if est is None or r.jobs_given or r.jobs == 1:
        return est, None
    have = available_memory()
    if have is None or est.peak_bytes <= have:
        return est, None
    default, r.jobs = r.jobs, 1
    one = _estimate(r, cache, quantized)
    if one.peak_bytes > have:      # one worker does not fit either: check_machine refuses with what would help
        return one, None
    return one, (f"one worker instead of {default}: the machine has {have / GB:.1f} GB available, "
                 f"{default} workers would need about {est.peak_bytes / GB:.1f} GB")


def plan_llm(model: str | Path, precision: str | None = None, **options) -> dict:
    """`compile --dry-run`: the parts and the host memory and disk estimate, checked against this
    machine (the refusal `compile` would give is reported, not raised). Nothing is loaded or written."""
    from dataclasses import fields
    from ...llm.job_estimate import check_machine
    from ...core.cache import cache_root
    known = {f.name for f in fields(LlmCompileOptions)}
    opts = LlmCompileOptions(**{k: v for k, v in options.items() if k in known and v not in (None, [], ())})
    from ...frontends.vlm_folder import is_vlm_folder
    if is_vlm_folder(model) or opts.vision_encoder is not None:
        raise InputError(f"{model}: --dry-run plans text LLMs; this is a vision-language model",
                         "leave --dry-run out to compile it")
    _refuse_vision_flags(opts)
    r = _resolve(PartSpec(model=str(model), precision=precision or "16a4w_block",
                          calibration=options.get("calibration")), opts)
    est, jobs_note = _fitted_estimate(r, Cache(enabled=False), quantized=False)
    if est is None:
        raise InputError(f"{model}: its config names no decoder shape (hidden_size, num_hidden_layers, ...)",
                         "compile it without --dry-run")
    report = {"model": str(model), "architecture": r.facts.architecture, "precision": r.requested,
              "variants": [f"ar{n}" for n in r.variants], "max_seq_len": r.max_seq_len, "context_limit_mb": r.limit_mb,
              "host_part_mb": host_part_mb(r.limit_mb), "host_chunk_mb": r.chunk_mb, "jobs": r.jobs, "jobs_note": jobs_note, "weights_held_as": r.facts.weights_dtype}
    try:
        check_machine(est, cache_root(), r.limit_mb, r.jobs)
        report["fits"], report["refusal"] = True, None
    except ModelExportError as e:
        report["fits"], report["refusal"] = False, str(e)
    report["estimate"] = est.to_dict()
    return report


# Block-wise 4-bit weights by default: per-channel 4-bit loses too much (SmolLM2 stops answering).
@backend("llm_qnn", kinds=("llm",), description="LLM → static ar-N decoders, 16a4w QDQ, weight-shared QNN context binaries + Genie config",
         formats=("context-binary",), options=LlmCompileOptions, default_precision="16a4w_block",
         precisions=LLM_PRECISIONS + ("16a4w_block",))
def compile_llm(parts: list[PartSpec], out: str | Path, options: LlmCompileOptions | None = None, force: bool = False,
                progress: Callable[[str, float, float], None] | None = None) -> Any:
    from ...toolchain.qairt import find_qairt
    import onnxruntime

    opts = options or LlmCompileOptions()
    say = progress or (lambda msg, done, total: None)
    t_start = time.perf_counter()
    out = Path(out)
    check_output(out, force)
    if len(parts) != 1:
        raise InputError("one LLM per bundle", "compile each model into its own bundle")
    spec = parts[0]
    from ...frontends.vlm_folder import is_vlm_folder
    if is_vlm_folder(spec.model) or opts.vision_encoder is not None:   # a vision part beside the text decoder (vlm.py)
        from .vlm import compile_vlm
        return compile_vlm(spec, out, opts, force, say, lambda *a: compile_llm([a[0]], *a[1:]))
    _refuse_vision_flags(opts)
    r = _resolve(spec, opts)
    requested, block_size, precision, variants, max_seq_len = r.requested, r.block_size, r.precision, r.variants, r.max_seq_len
    socs, overrides, facts, text, n_samples, limit_mb = r.socs, r.overrides, r.facts, r.text, r.n_samples, r.limit_mb
    quality = r.quality
    qairt = find_qairt()
    cache = Cache(enabled=opts.use_cache)
    timings: dict[str, Any] = {}

    # 1. QDQ graphs
    from importlib.metadata import version   # not `import torch`: a cache hit needs no torch
    from .embedder import EMBEDDER_VERSION
    # the input mode joins the key only when it is not the default: a token bundle's entries stay valid
    mode_key = [] if r.inputs == "tokens" else [r.inputs, r.embedder_precision]
    if opts.image_calibration:   # a VLM's decoder calibrated on its vision rows too
        from ...core.files import sha256_file
        mode_key += [IMAGE_ROWS_VERSION, sha256_file(Path(opts.image_calibration))]
    chunks_key = cache_key("llm-qdq", EXPORT_VERSION, facts.sha256, variants, max_seq_len, requested, block_size,
                           [(o.pattern, o.precision.name) for o in overrides], text.sha256, n_samples, limit_mb,
                           host_part_mb(limit_mb), r.chunk_mb, quality, onnxruntime.__version__, version("torch"),
                           *mode_key)
    # the joined part graphs changed apart from the quantized chunks (their entries stay valid)
    qkey = cache_key("llm-qdq", chunks_key, JOIN_VERSION, *([EMBEDDER_VERSION] if mode_key else []))
    t0 = time.perf_counter()
    say("checking the cache", 0, 4)
    est, jobs_note = _fitted_estimate(r, cache, quantized=cache.get("llm-qdq", qkey) is not None)
    if jobs_note:
        say(jobs_note, 0, 4)
    if est is not None:   # refused here, before any weight is loaded, rather than killed half-way
        from ...llm.job_estimate import check_machine
        check_machine(est, cache.root, limit_mb, r.jobs)
        say(f"plan: {est.n_parts} part{'s' if est.n_parts > 1 else ''}, about {est.peak_bytes / 2**30:.1f} GB of "
            f"memory at the peak and {est.disk_bytes / 2**30:.1f} GB of disk (estimated)", 0, 4)
    qentry, qhit = cache.get_or_create("llm-qdq", qkey, lambda tmp: _build_qdq(
        tmp, facts.path, variants, max_seq_len, precision, overrides, text, n_samples, limit_mb,
        lambda m: say(m, 1, 4), r.jobs, block_size, quality, cache=cache, stage_key=chunks_key,
        weights_dtype=facts.weights_dtype, chunk_mb=r.chunk_mb, inputs=r.inputs,
        embedder_precision=r.embedder_precision, image_calibration=opts.image_calibration))
    timings["quantize_stage_s"] = round(time.perf_counter() - t0, 3)
    qmeta = Cache.meta(qentry)
    n_parts = len(qmeta["parts"])
    graphs = qmeta["graphs"]

    # 2 + 3. context binaries
    from ..ort_qnn import worker as ort_qnn_worker
    from ...core.files import sha256_onnx
    from .ctx_jobs import SHARED_NAMESPACE, compile_shared
    from ...toolchain.qnn_graph_order import ORDER_SCHEME
    shas = {g["name"]: sha256_onnx(qentry / g["qdq"]) for g in graphs}
    jobs: list[tuple[Callable, dict]] = []
    for soc in socs:
        popts = compile_provider_options(soc, opts.vtcm_mb, opts.optimization_level)
        for p in range(1, n_parts + 1):
            # the arN graphs share one binary; the full-context graph gets its own (Genie refuses a binary
            # holding a graph without the past_ cache group: "Invalid cache-group prefix detected: past_")
            for full in (False, True):
                members = [g for g in graphs if g["part"] == p and (g["n_tokens"] == max_seq_len) == full]
                if not members:
                    continue
                key = cache_key(SHARED_NAMESPACE, [shas[g["name"]] for g in members], popts, qairt.build_id,
                                onnxruntime.__version__, *([ORDER_SCHEME, p, n_parts] if n_parts > 1 else []))
                jobs.append((compile_shared, {"kind": "shared", "part": p, "n_parts": n_parts, "target": soc.name,
                                              "provider_options": popts, "full_context": full,
                                              "models": [(g["name"], str(qentry / g["qdq"])) for g in members],
                                              "key": key, "cache_root": str(cache.root), "cache_enabled": cache.enabled}))
        for g in graphs:
            twin = ort_qnn_worker.compile_job_for(g["name"], soc.name, qentry / g["qdq"], shas[g["name"]],
                                                  host_twin_provider_options(popts), "context-binary", qairt.build_id, cache,
                                                  graph_order=(g["part"], n_parts) if n_parts > 1 else None)
            jobs.append((ort_qnn_worker.compile_job, {"kind": "twin", "graph": g["name"], **twin}))
        jobs += _embedder_jobs(qmeta.get("embedder"), qentry, soc, popts, qairt, cache)
    namespace = {"shared": SHARED_NAMESPACE, "twin": ort_qnn_worker.CACHE_NAMESPACE}
    pending = [j for _, j in jobs if not cache.get(namespace[j["kind"]], j["key"])]
    workers = min(len(pending), r.jobs)
    done = [0]

    def on_done(r):
        done[0] += 1
        say(f"compiled {done[0]}/{len(jobs)} context binaries", 2 + done[0] / max(1, len(jobs)), 4)
    say(f"compiling {len(jobs)} context binaries ({len(pending)} not cached)", 2, 4)
    t0 = time.perf_counter()
    # everything cached: the jobs only read their entries, here, without a child process
    results = raise_first_error(run_jobs("the context-binary compile", jobs, workers, on_done if pending else None,
                                         in_process=not pending))
    timings["compile_stage_s"] = round(time.perf_counter() - t0, 3)
    timings["context_binaries"] = _job_seconds(jobs, results)
    if block_size and block_size != DEFAULT_BLOCK:   # the default is checked by the tests and the benchmark
        _check_twins_load(jobs, results, cache, block_size, say)
    temp_entries = [Path(r["entry"]) for r in results if not cache.enabled]
    try:
        return _write_bundle(out, force, facts, socs, variants, max_seq_len, requested, overrides, qentry, qmeta, qhit,
                             jobs, results, qairt, cache, timings, t_start, limit_mb, say,
                             host_estimate=est.to_dict() if est is not None else None)
    finally:
        for t in temp_entries:
            shutil.rmtree(t, ignore_errors=True)
        if not cache.enabled:
            shutil.rmtree(qentry, ignore_errors=True)


def _job_seconds(jobs, results) -> dict:
    """Each context-binary job's compile seconds, wall and CPU (its worker's threads), as its cache entry
    recorded them (a cache hit shows the build that made it): where the compile stage's time went."""
    out = {}
    for (fn, job), r in zip(jobs, results):
        meta = r["meta"]
        what = f"twin_{job['graph']}" if job["kind"] == "twin" else \
            f"shared_{job['part']}{'_full' if job.get('full_context') else ''}"
        wall, cpu = meta.get("compile_seconds"), meta.get("compile_cpu_seconds")
        if isinstance(wall, dict):   # a weight-shared job: one session per graph, in order
            wall, cpu = sum(wall.values()), (sum(cpu.values()) if cpu else None)
        out[f"{job['target']}/{job.get('role', 'decoder')}/{what}"] = {"wall_s": wall, "cpu_s": cpu, "hit": bool(r.get("hit"))}
    return out


def _quality_options(opts: LlmCompileOptions, precision: str, shape: dict) -> dict | None:
    """--rounding and --max-ppl-ratio, checked: they concern 4-bit weights only."""
    from ...core.arguments import finite
    from ...quant.weight_rounding import default_rounding, get_rounding
    four_bit = get_precision(precision).weight_bits == 4
    if opts.max_ppl_ratio is not None:
        finite("--max-ppl-ratio", opts.max_ppl_ratio, "1.05")
        if not opts.max_ppl_ratio > 1.0:
            raise InputError(f"--max-ppl-ratio is the allowed perplexity over float's, above 1; got {opts.max_ppl_ratio}",
                             "e.g. --max-ppl-ratio 1.05 (within 5% of float)")
        if not four_bit:
            raise InputError(f"--max-ppl-ratio raises 4-bit modules to 8-bit; --precision {precision} has no 4-bit weights",
                             "use it with --precision 16a4w_block (the default) or 16a4w")
    if opts.rounding is not None:
        get_rounding(opts.rounding)
        if not four_bit and opts.rounding != "nearest":
            raise InputError(f"--rounding {opts.rounding} chooses 4-bit weights; --precision {precision} has none",
                             "leave --rounding out, or use --precision 16a4w_block")
    if not four_bit:
        return None
    chosen, why = (opts.rounding, "asked for") if opts.rounding is not None else default_rounding(shape)
    return {"rounding": get_rounding(chosen).name, "max_ppl_ratio": opts.max_ppl_ratio,
            "rounding_given": opts.rounding is not None, "rounding_why": why}


def _check_twins_load(jobs, results, cache: Cache, block_size: int, say) -> None:
    """LPBQ twins of a non-default block size are loaded and run once on the simulator in child
    processes first (cached by the twin's key; ~100 s for SmolLM2's two graphs): a binary that
    crashes it fails the build here, not the user's process later."""
    from .ctx_jobs import simulator_smoke_run
    checks = []
    for (fn, job), r in zip(jobs, results):
        if job["kind"] == "twin" and not cache.get("sim-smoke", job["key"]):
            checks.append((simulator_smoke_run, {"epcontext": str(Path(r["entry"]) / f"{job['graph']}_ctx.onnx"),
                                                 "soc_model": get_target(job["target"]).soc_model,
                                                 "graph": job["graph"], "key": job["key"]}))
    if not checks:
        return
    say(f"running {len(checks)} host twins once on the simulator", 3.2, 4)
    for (fn, job), r in zip(checks, run_jobs("the simulator check of the host twins", checks, min(2, len(checks)))):
        crashed = isinstance(r, ModelExportError)
        if crashed or not r.get("ok"):
            raise ToolchainError(f"the compiled {job['graph']} (16a4w_block, --block-size {block_size}) "
                                 f"{'crashed' if crashed else 'gave non-finite outputs on'} the x86 HTP simulator "
                                 f"when loaded from its context binary (a simulator defect seen with 64-wide blocks)",
                                 "use --block-size 32 (the default), or --precision 16a8w")
        cache.get_or_create("sim-smoke", job["key"], lambda tmp: r)


def _check_part_order(graphs, target: str) -> None:
    """Genie orders a variant's parts by their QNN graph names (toolchain/qnn_graph_order.py): the
    names read back from the binaries, device and host twins, must sort in part order."""
    from ...toolchain.qnn_graph_order import in_part_order
    for n in sorted({g.n_tokens for g in graphs if g.target == target}):
        parts = sorted((g for g in graphs if g.target == target and g.n_tokens == n), key=lambda g: g.part_index or 1)
        for what, names in (("device binaries", [g.qnn_graph_name for g in parts]),
                            ("host twins", [g.host_twin.qnn_graph_name for g in parts if g.host_twin])):
            if len(names) > 1 and not in_part_order(names):
                raise VerificationError(f"the QNN graphs of ar{n}'s parts in the {what} do not sort in part order "
                                        f"({', '.join(names)}): Genie would run the parts out of order",
                                        "report this with the manifest: the QNN EP's graph naming changed")


def _tensor_specs(infos) -> list[TensorSpec]:
    from ..context_binary import tensor_spec
    return [tensor_spec(t) for t in infos]


def _write_bundle(out, force, facts, socs, variants, max_seq_len, precision, overrides, qentry, qmeta, qhit,
                  jobs, results, qairt, cache, timings, t_start, limit_mb, say, host_estimate=None):
    from ..context_binary import read_back
    from ...toolchain.genie import validate_genie_config
    from .genie import genie_config, lut_embedding
    from .genie_dialog import check_dialogs

    say("checking the binaries and writing the bundle", 3.5, 4)
    n_parts = len(qmeta["parts"])
    graphs = {g["name"]: g for g in qmeta["graphs"]}
    spec = qmeta["spec"]
    with BundleWriter(out, force) as w:
        m = w.manifest
        m.kind = BundleKind.LLM
        m.format = Format.CONTEXT_BINARY
        m.targets = [s.name for s in socs]
        m.precision = precision
        m.source = SourceModel(path=str(facts.path.resolve()), sha256=facts.sha256,
                               format="gguf" if facts.format == "gguf" else "hf-folder",
                               description=f"{qmeta['architecture']}, {qmeta['n_params']:,} parameters")
        m.options = {"backend": "llm_qnn", "variants": [f"ar{n}" if n != max_seq_len else "full" for n in variants],
                     "max_seq_len": max_seq_len,
                     "precision": precision, "overrides": [f"{o.pattern}={o.precision.name}" for o in overrides],
                     "optimization_level": None, "embed_mode": 0, "weight_sharing": len(variants) > 1,
                     "context_limit_mb": limit_mb, "n_parts": n_parts, "host_part_mb": host_part_mb(limit_mb),
                     "host_chunks": qmeta.get("host_chunks"),
                     "host_estimate": host_estimate}
        m.calibration = {"llm": {"kind": "text", "representative": True, **qmeta["calibration"]}}
        tok_dir = qentry / "tokenizer"
        for f in sorted(tok_dir.iterdir()):
            w.add_file(f, f"tokenizer/{f.name}", role=Role.TOKENIZER if f.name == "tokenizer.json" else Role.TOKENIZER_CONFIG)
        for g in qmeta["graphs"]:
            for f in sorted((qentry / "qdq").glob(g["name"] + ".onnx*")):
                w.add_file(f, f"qdq/{f.name}", role=Role.QUANTIZED_MODEL if f.suffix == ".onnx" else Role.QUANTIZED_MODEL_DATA)
        weight_sharing: dict[str, WeightSharing] = {}
        placement: dict[str, Any] = {}
        build_ids = set()
        ctx_bins: dict[str, list[str]] = {}
        twin_files: dict[tuple[str, str], HostTwin] = {}
        for (fn, job), r in zip(jobs, results):
            if job["kind"] != "twin":
                continue
            entry, meta = Path(r["entry"]), r["meta"]
            tdir = f"{job['target']}/host"
            ctx_rel = w.add_file(entry / meta["files"]["epcontext"], f"{tdir}/{job['graph']}_ctx.onnx", role=Role.HOST_EPCONTEXT_MODEL)
            bin_name = meta["files"]["context_binary"]
            bin_rel = w.add_file(entry / bin_name, f"{tdir}/{bin_name}", role=Role.HOST_CONTEXT_BINARY)
            info = read_back(entry / bin_name, get_target(job["target"]))
            build_ids.add(info.build_id)
            g0 = info.graphs[0]
            twin_files[(job["target"], job["graph"])] = HostTwin(
                epcontext_model=ctx_rel, context_binary=bin_rel, qnn_graph_name=g0.name,
                const_bytes=g0.htp.const_size if g0.htp else None, bytes=(entry / bin_name).stat().st_size,
                optimization_level=g0.htp.optimization_level if g0.htp else None)
            pl = meta["placement"]
            placement.setdefault(job["graph"], {})[job["target"]] = {
                "htp_nodes": len(pl.get("QNNExecutionProvider", [])),
                "cpu_nodes": [n for n, _ in pl.get("CPUExecutionProvider", [])],
                "note": "CPU nodes are the graph-boundary QuantizeLinear/DequantizeLinear of the float IO"}
        for (fn, job), r in zip(jobs, results):
            if job["kind"] != "shared" or job.get("role") == "embedder":
                continue
            entry, meta = Path(r["entry"]), r["meta"]
            soc = get_target(job["target"])
            p = job["part"]
            tdir = f"{job['target']}"
            full = job.get("full_context", False)
            bin_name = f"{qmeta['architecture']}_{precision}{'_full' if full else ''}_cl{max_seq_len}_{p}_of_{n_parts}.bin"
            bin_rel = w.add_file(entry / meta["context_binary"], f"{tdir}/{bin_name}", role=Role.CONTEXT_BINARY)
            if not full:   # Genie runs the arN graphs only
                ctx_bins.setdefault(job["target"], []).append(bin_name)
            info = read_back(entry / meta["context_binary"], soc)
            build_ids.add(info.build_id)
            m.htp_arch[soc.name] = info.dsp_arch
            names = [name for name, _ in job["models"]]
            if len(info.graphs) != len(names):
                raise VerificationError(f"the weight-shared binary of part {p} holds {len(info.graphs)} graphs, "
                                        f"expected {len(names)} ({', '.join(names)})", "report this: sharing failed")
            shared_sizes = {g.htp.shared_weights_size for g in info.graphs if g.htp}
            const = {g.name: g.htp.const_size for g in info.graphs if g.htp}
            twins = [twin_files[(job["target"], n)] for n in names]
            unshared_total = sum(t.bytes for t in twins)
            shared_bytes = (entry / meta["context_binary"]).stat().st_size
            weights_once = len(shared_sizes) == 1 and next(iter(shared_sizes)) > 0
            if len(names) > 1 and not weights_once:
                raise VerificationError(f"the binary of part {p} does not share its weights (shared sizes {sorted(shared_sizes)})",
                                        "report this: the QNN EP did not share the weights")
            weight_sharing[f"{job['target']}/{p}{'/full' if full else ''}"] = WeightSharing(
                file=bin_rel, graphs=[g.name for g in info.graphs], shared_weights_bytes=sorted(shared_sizes),
                const_bytes=const, bytes=shared_bytes, unshared_twins_bytes=unshared_total,
                saved_bytes=unshared_total - shared_bytes, weights_stored_once=weights_once,
                note="read back through libQnnSystem; the x86 simulator cannot load weight-shared binaries, "
                     "host numerics run on the unshared twins built from the same QDQ graphs")
            for name in names:
                ctx_name = meta["epcontext"][name]
                ctx_rel = w.add_file(entry / ctx_name, f"{tdir}/{name}_ctx.onnx", role=Role.EPCONTEXT_MODEL)
                # the EPContext model names the binary it references: point it at the renamed file
                _retarget_epcontext(w.dir / ctx_rel, meta["context_binary"], bin_name)
                twin = twin_files[(job["target"], name)]
                # parts in order: each compile named its graph from its own path (toolchain/qnn_graph_order.py)
                qnn_name = meta.get("expected_graph_names", {}).get(name, twin.qnn_graph_name)
                qg = next((g for g in info.graphs if g.name == qnn_name), None)
                if qg is None and n_parts > 1:
                    raise VerificationError(f"the binary of part {p} has no graph {qnn_name} for {name} "
                                            f"(it holds {', '.join(g.name for g in info.graphs)})",
                                            "report this with the manifest: the QNN EP's graph naming changed")
                g = graphs[name]
                m.graphs.append(GraphSpec(
                    name=name, file=bin_rel, kind=GraphKind.CONTEXT_BINARY, target=soc.name, htp_arch=info.dsp_arch,
                    inputs=_tensor_specs(qg.inputs) if qg else [], outputs=_tensor_specs(qg.outputs) if qg else [],
                    part=name, n_tokens=g["n_tokens"], part_index=g["part"], n_parts=g["n_parts"],
                    layers=g["layers"], qnn_graph_name=qg.name if qg else None,
                    epcontext_model=ctx_rel, shared=len(names) > 1,
                    optimization_level=qg.htp.optimization_level if qg and qg.htp else None,
                    const_bytes=qg.htp.const_size if qg and qg.htp else None,
                    shared_weights_bytes=qg.htp.shared_weights_size if qg and qg.htp else None,
                    host_twin=twin, quantized_model=g["qdq"],
                    memory_estimate=MemoryEstimate(**g["memory_estimate"])))
        embedder = _write_embedder(w, qentry, qmeta.get("embedder"), jobs, results, twin_files, max_seq_len, say)
        for info in embedder.pop("build_ids", set()):
            build_ids.add(info)
        if len(build_ids) > 1:
            raise ToolchainError(f"binaries of one bundle name different QAIRT builds {sorted(build_ids)}",
                                 "clear the cache (MODELEXPORT_CACHE_DIR) and compile again")
        m.qairt_build = build_ids.pop() if build_ids else qairt.build_id
        m.placement = placement
        # Genie config per target, checked by the real libGenie
        genie = {}
        for soc in socs:
            rel = "genie_config.json" if len(socs) == 1 else f"{soc.name}/genie_config.json"
            up = "" if len(socs) == 1 else "../"   # paths relative to the folder Genie runs in
            lut = embedder["part"].genie_lut if embedder else None
            cfg = genie_config(ctx_bins=[(f"{soc.name}/{b}" if len(socs) == 1 else b) for b in ctx_bins[soc.name]],
                               tokenizer=f"{up}tokenizer/tokenizer.json",
                               context_size=max_seq_len, vocab=spec["vocab_size"],
                               bos=qmeta["bos_id"] if qmeta.get("add_bos") else None,
                               eos=qmeta["eos_ids"], head_dim=spec["head_dim"],
                               embedding=lut_embedding(f"{up}{lut}", spec["hidden_size"]) if lut else None)
            path = w.path(rel, role=Role.GENIE_CONFIG)
            path.write_text(json.dumps(cfg, indent=2))
            twins = [(g.n_tokens, w.dir / g.host_twin.context_binary)
                     for g in sorted(m.graphs, key=lambda g: (g.part_index or 1, g.name))
                     if g.n_tokens != max_seq_len
                     if g.target == soc.name and g.host_twin is not None]
            _check_part_order(m.graphs, soc.name)
            mode = qmeta.get("inputs", "tokens")
            if mode == "both":   # Genie feeds input_ids or inputs_embeds, never both
                genie[soc.name] = GenieCheck(file=rel, **validate_genie_config(path), dialog_created=False,
                                             dialog_note=GENIE_BOTH_NOTE)
                continue
            say(f"creating a Genie dialog on the {soc.name} host twins", 3.8, 4)
            genie[soc.name] = GenieCheck(file=rel, **validate_genie_config(path),
                                         **check_dialogs(cfg, path.parent, twins))
        n_params = qmeta["n_params"]
        device_bytes = sum(ws.bytes for ws in weight_sharing.values() if ws.file.startswith(socs[0].name))
        shared_w = sum(max(ws.shared_weights_bytes or [0]) for key, ws in weight_sharing.items()
                       if ws.file.startswith(socs[0].name) and not key.endswith("/full"))   # a decode step reads the arN binaries
        timings["total_s"] = round(time.perf_counter() - t_start, 3)
        split_note = (f"split into {n_parts} parts by layers: the largest graph's estimated HTP memory exceeds the "
                      f"{limit_mb:g} MB per-context limit" if n_parts > 1 else None)
        m.parameters = n_params
        m.llm = LlmSection(
            architecture=qmeta["architecture"], spec=DecoderShape(**spec), variants=variants, max_seq_len=max_seq_len,
            n_parts=n_parts, parts=qmeta["parts"], split_note=split_note,
            weight_bytes_per_token=shared_w or device_bytes,
            device_bytes=device_bytes, bytes_per_parameter=round(device_bytes / n_params, 4),
            bos_id=qmeta["bos_id"], eos_ids=qmeta["eos_ids"], rope_theta=qmeta["rope_theta"],
            graph_naming=GRAPH_NAMING, weight_sharing=weight_sharing, genie=genie, quantization=qmeta["quantization"],
            memory_limit_mb=limit_mb, weight_rounding=qmeta.get("weight_rounding"), quality_recipe=qmeta.get("quality_recipe"),
            residual_scale=qmeta.get("residual_scale", 1.0),
            **_input_facts(qmeta, spec, variants, max_seq_len, embedder.get("part")))
        m.timings = Timings.model_validate({**qmeta["timings"], **timings})
        m.cache = CacheInfo(enabled=cache.enabled, quantize_hit=qhit, resumed_graphs=qmeta.get("resumed_graphs") or None,
                            compile_hits=sum(1 for r in results if r.get("hit")), compile_jobs=len(results))
        m.qairt = QairtInfo(source=qairt.source, version=qairt.version, core_api=qairt.core_api, htp_api=qairt.htp_api)
    return open_bundle(out)


GENIE_BOTH_NOTE = ("--inputs both: the decoder takes input_ids and inputs_embeds, and Genie's dialog writes one "
                   "input layer (inputs_embeds when the graph has it, else input_ids), never both: input_ids would "
                   "hold whatever its buffer holds, so no dialog was created; generate / eval run the bundle with "
                   "--backend htp-sim, and --inputs embeddings makes a bundle Genie runs")


def _input_facts(qmeta: dict, spec: dict, variants: list[int], max_seq_len: int, embedder) -> dict:
    """The LLM section's input-mode fields (llm/input_modes.py) and the full-context flag."""
    from ...llm.input_modes import get_input_mode
    mode = get_input_mode(qmeta.get("inputs"))
    return {"inputs": mode.name, "embedder": embedder, "full_context": max_seq_len in variants,
            "no_token_id": qmeta.get("no_token_id", spec["vocab_size"]) if mode.name == "both" else None}


def _embedder_jobs(embedder: dict | None, qentry: Path, soc: SoC, popts: dict, qairt, cache: Cache) -> list:
    """The embedder part's compile jobs for one target: its graphs in one weight-shared binary, and a
    host twin per graph (role "embedder": _write_bundle keeps them out of the decoder's records)."""
    if not embedder:
        return []
    import onnxruntime

    from ..ort_qnn import worker as ort_qnn_worker
    from ...core.files import sha256_onnx
    from .ctx_jobs import SHARED_NAMESPACE, compile_shared
    gs = embedder["graphs"]
    shas = {g["name"]: sha256_onnx(qentry / g["graph"]) for g in gs}
    key = cache_key(SHARED_NAMESPACE, [shas[g["name"]] for g in gs], popts, qairt.build_id, onnxruntime.__version__)
    jobs: list = [(compile_shared, {"kind": "shared", "role": "embedder", "part": "embedder", "n_parts": 1,
                                    "target": soc.name, "provider_options": popts,
                                    "models": [(g["name"], str(qentry / g["graph"])) for g in gs],
                                    "key": key, "cache_root": str(cache.root), "cache_enabled": cache.enabled})]
    for g in gs:
        twin = ort_qnn_worker.compile_job_for(g["name"], soc.name, qentry / g["graph"], shas[g["name"]],
                                              host_twin_provider_options(popts), "context-binary", qairt.build_id, cache)
        jobs.append((ort_qnn_worker.compile_job, {"kind": "twin", "role": "embedder", "graph": g["name"], **twin}))
    return jobs


def _write_embedder(w, qentry: Path, embedder: dict | None, jobs, results, twin_files, max_seq_len: int, say) -> dict:
    """The embedder part into the bundle: its graphs' ONNX, its weight-shared binary and EPContext
    models per target, and the check of each target's twin against the float lookup (in a child:
    it loads the simulator). → {"part": EmbedderPart, "build_ids": {...}}."""
    if not embedder:
        return {}
    from ..context_binary import read_back
    from ...contract.manifest import EmbedderPart, LogitsAgreement
    from .embedder import embedder_check
    models = {}
    for g in embedder["graphs"]:
        for f in sorted((qentry / "embedder").glob(g["name"] + ".onnx*")):
            rel = w.add_file(f, f"embedder/{f.name}",
                             role=Role.QUANTIZED_MODEL if f.suffix == ".onnx" else Role.QUANTIZED_MODEL_DATA)
            if f.suffix == ".onnx":
                models[g["name"]] = rel
    n_of = {g["name"]: g["n_tokens"] for g in embedder["graphs"]}
    lut = w.add_file(qentry / embedder["genie_lut"], embedder["genie_lut"], role=Role.GENIE_LUT)
    part = EmbedderPart(precision=embedder["precision"], what=embedder["what"], quantized_models=models, genie_lut=lut)
    build_ids, checks = set(), []
    for (fn, job), r in zip(jobs, results):
        if job["kind"] != "shared" or job.get("role") != "embedder":
            continue
        entry, meta = Path(r["entry"]), r["meta"]
        soc = get_target(job["target"])
        bin_name = f"embedder_{embedder['precision']}_cl{max_seq_len}.bin"
        bin_rel = w.add_file(entry / meta["context_binary"], f"{soc.name}/{bin_name}", role=Role.CONTEXT_BINARY)
        info = read_back(entry / meta["context_binary"], soc)
        build_ids.add(info.build_id)
        part.bytes[soc.name] = (entry / meta["context_binary"]).stat().st_size
        for name, _ in job["models"]:
            ctx_rel = w.add_file(entry / meta["epcontext"][name], f"{soc.name}/{name}_ctx.onnx", role=Role.EPCONTEXT_MODEL)
            _retarget_epcontext(w.dir / ctx_rel, meta["context_binary"], bin_name)
            twin = twin_files[(soc.name, name)]
            qg = next((g for g in info.graphs if g.name == meta.get("expected_graph_names", {}).get(name, twin.qnn_graph_name)),
                      info.graphs[0] if len(info.graphs) == 1 else None)
            part.graphs.append(GraphSpec(
                name=name, file=bin_rel, kind=GraphKind.CONTEXT_BINARY, target=soc.name, htp_arch=info.dsp_arch,
                inputs=_tensor_specs(qg.inputs) if qg else [], outputs=_tensor_specs(qg.outputs) if qg else [],
                part="embedder", n_tokens=n_of[name], qnn_graph_name=qg.name if qg else None, epcontext_model=ctx_rel,
                shared=len(job["models"]) > 1, const_bytes=qg.htp.const_size if qg and qg.htp else None,
                shared_weights_bytes=qg.htp.shared_weights_size if qg and qg.htp else None,
                host_twin=twin, quantized_model=models[name]))
        largest = max(job["models"], key=lambda m: n_of[m[0]])[0]
        checks.append((embedder_check, {"target": soc.name, "soc_model": soc.soc_model, "check": str(qentry / embedder["check"]),
                                        "epcontext": str(w.dir / twin_files[(soc.name, largest)].epcontext_model)}))
    say("checking the embedder part on the simulator", 3.6, 4)
    for (fn, job), r in zip(checks, run_jobs("the embedder check", checks, 1)):
        if isinstance(r, ModelExportError):
            raise r
        part.check[job["target"]] = LogitsAgreement(sqnr_db=r["sqnr_db"], max_abs_error=r["max_abs_error"], samples=r["tokens"])
    return {"part": part, "build_ids": build_ids}


def _retarget_epcontext(onnx_path: Path, old: str, new: str) -> None:
    """Rewrite the EPContext nodes' `ep_cache_context` (the binary's file name in embed mode 0)."""
    import onnx
    model = onnx.load(str(onnx_path))
    changed = False
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        for a in node.attribute:
            if a.name == "ep_cache_context" and a.s.decode(errors="replace") == old:
                a.s = new.encode()
                changed = True
    if changed:
        onnx.save(model, str(onnx_path))
