"""The `llm-qdq` stage of the context-binary recipe: load, lay the graphs out, calibrate, plan the
4-bit weights, then export and quantize chunk by chunk: each (variant, part, chunk) graph is its own
cache entry (part_stage.py), reused when a killed compile is run again; a part's chunks are then
joined into the part's graph (quant/chunk_join.py). `QDQ_STAGES` is the order, as data; `build_qdq`
runs it and returns the record the stage's cache entry keeps (its fields are read by
backends/llm_qnn and stay as they are: cached entries must keep reading).

Graph names (AI Hub's scheme): `{type}_ar{N}_cl{C}_{i}_of_{n}` with type `prompt` for N > 1 and
`token` for N = 1, `full` for N = C; C = the graph's context length (max_seq_len, or each of
--context-lengths), part i of n.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ...core.cache import Cache
from ...frontends import find_frontend
from ...quant.precision import get_precision
from ...toolchain.worker_pool import WorkerPool, raise_first_error
from ..model.input_modes import POSITION_COS, POSITION_SIN, ROPE_TABLE, InputMode, get_input_mode, no_token_id
from ..model.lora import install_lora
from ..model.parts import host_chunks
from ..model.static_decoder import ONNX_RMS_NORM, DecoderSpec, StaticDecoderConfig, build_static_decoder, decoder_config
from ..run.text import TextTokens, dialog_start, tokenize
from ..run.tokenizers import from_transformers
from .weight_dtype import in_float32, part_modules, store_bf16
from .calibrate import LlmCalibration, calibrate, part_samples, with_input_mode, with_positions
from .embedder import build_embedders
from .memory import plan_parts
from .onnx_export import DecoderPart, export_part
from .part_stage import PART_NAMESPACE, join_into, part_key, quantize_part
from .plan import LlmPlan, embed_head_bits
from .reference import check_window, record_reference
from .stages import Stage, check_order, run_stages
from .weights import WeightPlan, WeightRequest, plan_weights


def graph_name(n: int, context_len: int, part: int, n_parts: int) -> str:
    """`full` for the full-context graph (N = C), `prompt` for N > 1, `token` for N = 1."""
    kind = "full" if n == context_len else "token" if n == 1 else "prompt"
    return f"{kind}_ar{n}_cl{context_len}_{part}_of_{n_parts}"


@dataclass(frozen=True)
class QdqJob:
    """What the stage is built from: the plan, the entry's folder `tmp`, the cache (each chunk graph
    its own entry under `stage_key`), the VLM's image rows (.npz) when its decoder is calibrated on them."""
    plan: LlmPlan
    tmp: Path
    cache: Cache
    stage_key: str
    report: Callable[[str], None]
    image_calibration: str | None = None


@dataclass(frozen=True)
class LoadedModel:
    llm: Any                 # frontends.loaded_llm.LoadedLLM
    tok: Any                 # llm.run.tokenizers.Tokenizer
    mode: InputMode
    ids: list[int]           # the calibration text's tokens
    no_token_id: int
    held_bf16: bool
    load_s: float
    lora: dict               # --lora: {LoRA input name: its branch on the model's linear} (llm/model/lora.py)


@dataclass(frozen=True)
class GraphLayout:
    """The parts (the per-context memory limit's split), each part's host chunks, the names, and the
    chunk graphs a killed compile finished before (`done`)."""
    parts: list                              # llm.model.parts.PartRange
    memory: dict                             # {N: [memory.GraphMemory per part]} at the longest context
    names: dict[tuple[int, int, int], str]   # {(N, C, part): graph name}
    chunks: dict[int, list]                  # {part: [chunk PartRange]}
    chunk_names: dict[tuple[int, int, int], list[str]]
    keys: dict[str, str]                     # {chunk graph: its entry's key}
    done: frozenset[str]

    def records(self, shapes) -> list[dict]:
        return [{"name": self.names[(n, c, p.index)], "n_tokens": n, "context_len": c, "part": p.index,
                 "n_parts": p.count, "layers": [p.first_layer, p.end_layer], "qdq": f"qdq/{self.names[(n, c, p.index)]}.onnx",
                 "memory_estimate": self.memory[n][p.index - 1].to_dict()} for n, c in shapes for p in self.parts]


@dataclass(frozen=True)
class QuantizedChunks:
    pending: tuple[str, ...]     # the chunk graphs handed to the workers, in order
    outcomes: list               # their workers' outcomes (an error is raised at the join)
    export_s: float
    quantize_s: float            # from the first hand-over: overlaps the later exports


@dataclass(frozen=True)
class JoinedGraphs:
    quantization: dict[str, dict]   # {graph: its quantization record}
    spec: DecoderSpec


def load_model(job: QdqJob) -> LoadedModel:
    plan = job.plan
    t0 = time.perf_counter()
    job.report("loading the model")
    src = plan.facts.path
    # a bf16 HF checkpoint is loaded as bf16 (not float32 then halved: that peak was 6.8 GB for 1B)
    bf16_folder = plan.facts.weights_dtype == "bfloat16" and src.is_dir()
    fe = find_frontend(str(src))
    llm = fe.load(str(src), dtype=torch.bfloat16) if bf16_folder else fe.load(str(src))
    held_bf16 = store_bf16(llm.model, plan.facts.weights_dtype)   # a weight source between the parts' float32 moments
    load_s = round(time.perf_counter() - t0, 2)
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    tok.save(job.tmp / "tokenizer")
    if plan.positions == "cos-sin":
        save_rope_table(llm.model, plan.max_seq_len, job.tmp / ROPE_TABLE)
    mode = get_input_mode(plan.inputs)
    no_token = no_token_id(mode, llm.model.get_input_embeddings().weight.shape[0],
                           llm.model.get_output_embeddings().weight.shape[0], tok.vocab_size)
    ids = tokenize(tok, plan.text.text, plan.max_seq_len * (plan.n_samples + 2))
    branches = install_lora(llm.model, plan.lora.slots if plan.lora else None)
    return LoadedModel(llm, tok, mode, ids, no_token, held_bf16, load_s, branches)


def save_rope_table(model, max_seq_len: int, path: Path) -> None:
    """cos and sin [max_seq_len, rotary_dim/2] float32, as the graphs would gather them (attention scaling in),
    for the runtimes that feed them; the decoder is built here first, which refuses a family one cos/sin
    pair cannot feed (windows, several tables, M-RoPE) before any calibration."""
    dec = build_static_decoder(model, StaticDecoderConfig(1, max_seq_len), positions="cos-sin")
    cos, sin = dec.rope_table()
    np.savez(path, cos=cos.float().numpy(), sin=sin.float().numpy())


def lay_out(job: QdqJob, loaded: LoadedModel) -> GraphLayout:
    plan, cfg = job.plan, loaded.llm.config
    prec = get_precision(plan.precision)
    embed_bits, head_bits = embed_head_bits(plan.overrides, prec.weight_bits)
    parts, mem = plan_parts(cfg, list(plan.variants), plan.max_seq_len, prec.weight_bits, prec.activation_bits,
                            plan.limit_mb, embed_bits, head_bits)
    names = {(n, c, p.index): graph_name(n, c, p.index, p.count) for n, c in plan.shapes for p in parts}
    chunks = {p.index: host_chunks(cfg, p, plan.chunk_mb * 2**20) for p in parts}
    chunk_names = {(n, c, p.index): [ch.name(names[(n, c, p.index)]) for ch in chunks[p.index]]
                   for n, c in plan.shapes for p in parts}
    keys = {c: part_key(job.stage_key, c) for cs in chunk_names.values() for c in cs}
    done = frozenset(c for c, k in keys.items() if job.cache.get(PART_NAMESPACE, k))
    if done:
        reused = [p.index for p in parts if all(ch in done for n, c in plan.shapes for ch in chunk_names[(n, c, p.index)])]
        job.report(f"resuming: {_ranges(reused) or 'no whole part'} of {len(parts)} reused "
                   f"({len(done)} of {len(keys)} graphs quantized before)")
    return GraphLayout(parts, mem, names, chunks, chunk_names, keys, done)


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


def reference_stage(job: QdqJob, loaded: LoadedModel) -> dict | None:
    """The float decoder's logits on a held-out window, into the entry's reference/ (reference.py): what
    compile's own numerics check compares the compiled graphs with."""
    job.report("recording the float model's logits for the numerics check")
    window = check_window(job.plan, loaded.tok, len(loaded.ids))
    return record_reference(loaded.llm.model, job.plan, window, job.tmp)


def calibrate_stage(job: QdqJob, loaded: LoadedModel, layout: GraphLayout) -> LlmCalibration:
    """Only when some graph is still to quantize; the residual scale of those finished before otherwise."""
    done_entries = [job.cache.get(PART_NAMESPACE, layout.keys[c]) for c in sorted(layout.done)]
    text = TextTokens(loaded.ids, tuple(dialog_start(loaded.tok)))
    return calibrate(loaded.llm.model, text, job.plan, len(layout.done) < len(layout.keys),
                     job.image_calibration, done_entries, job.report, loaded.lora)


def weights_stage(job: QdqJob, loaded: LoadedModel) -> WeightPlan:
    """The 4-bit weights' plan (rounding, recipe), computed again on a resume: the graphs still to
    quantize need it, and the manifest records it."""
    p = job.plan
    return plan_weights(loaded.llm.model, loaded.tok, p.text,
                        WeightRequest(p.precision, p.overrides, p.block_size, p.max_seq_len, p.quality), job.tmp,
                        job.report)


class _HandOver:
    """The export → quantize loop's state: the parent exports one chunk graph at a time and hands it
    to the pool, whose workers quantize it (ONNX Runtime's quantizer is single-threaded Python) while
    the next one is exported here."""

    def __init__(self, job: QdqJob, layout: GraphLayout, calibration: LlmCalibration, weights: WeightPlan, pool,
                 lora: dict):
        self.job, self.layout, self.weights, self.pool, self.lora = job, layout, weights, pool, lora
        self.kv_ranges, self.residual_scale = calibration.kv_ranges, calibration.residual_scale
        self.export_s, self.t_first, self.ends_job = 0.0, None, None
        self.pending: list[str] = []
        # a chunk with the embedding or the head is the largest to export and to quantize (1B: 646 MB in
        # float32, 1.4 GB in a worker): where other chunks are smaller, one such in the process tree at a
        # time (two quantizing together made the 1B-shaped compile's peak, 6.05 GB); the parent waits
        # while the workers go on with the others
        self.one_ends_chunk = any(not (c.is_first or c.is_last) for cs in layout.chunks.values() for c in cs)

    def variant(self, model, mode: InputMode, shape: tuple[int, int], samples: list) -> None:
        """Every chunk graph of the (N, C) graph `shape` still to quantize, the float layers' hidden
        states carried from chunk to chunk as the next one's inputs."""
        n, c = shape
        dec = build_static_decoder(model, decoder_config(n, c), rms_norm=ONNX_RMS_NORM,
                                   inputs=mode.name, residual_scale=self.residual_scale,
                                   positions=self.job.plan.positions)
        slots = self.job.plan.lora.slots if self.job.plan.lora else None
        dec.lora_slots, dec.lora_branches = slots, self.lora
        with torch.inference_mode(), in_float32([dec.model.embed_tokens]):
            samples = with_input_mode(samples, mode, lambda x: dec.lookup(torch.from_numpy(x)).float().numpy(),
                                      dec.spec.hidden_size)
        samples = with_positions(samples, dec)
        hidden = None
        lay = self.layout
        order = [(ch, name) for p in lay.parts for ch, name in zip(lay.chunks[p.index], lay.chunk_names[(n, c, p.index)])]
        for i, (chunk, name) in enumerate(order):
            if all(later in lay.done for _, later in order[i:]):
                break                  # this variant's remaining graphs are all finished
            ps = part_samples(samples, chunk, hidden, mode.decoder_inputs,
                              tuple(slots.input_names(chunk.layers())) if slots else ())
            if name not in lay.done:
                self.hand_over(dec, chunk, name, ps)
            if not chunk.is_last:   # hidden states entering the next chunk, from the float layers
                mod = DecoderPart(dec, chunk).eval()
                with torch.inference_mode(), in_float32(part_modules(dec, chunk)):
                    hidden = [mod(*[torch.from_numpy(s[k]) for k in mod.input_names()])[0].float().numpy() for s in ps]

    def hand_over(self, dec, chunk, name: str, samples: list) -> None:
        carries_ends = self.one_ends_chunk and (chunk.is_first or chunk.is_last)
        if carries_ends and self.ends_job is not None:
            self.pool.wait(self.ends_job)
        self.job.report(f"exporting {name}")
        t2 = time.perf_counter()
        fpath = export_part(dec, chunk, self.job.tmp / "float" / f"{name}.onnx")
        self.export_s += time.perf_counter() - t2
        self.t_first = self.t_first or time.perf_counter()
        submitted = self.pool.submit(quantize_part, self.quantize_job(name, fpath, samples))
        self.ends_job = submitted if carries_ends else self.ends_job
        self.pending.append(name)

    def quantize_job(self, name: str, fpath: Path, samples: list) -> dict:
        """The worker's job (part_stage.quantize_part): a dict, as it crosses into a spawned process."""
        job, plan, cache = self.job, self.job.plan, self.job.cache
        return {"name": name, "key": self.layout.keys[name], "cache_root": str(cache.root),
                "cache_enabled": cache.enabled, "residual_scale": self.residual_scale,
                "quantize": {"float_path": str(fpath), "precision": plan.precision,
                             "overrides": list(self.weights.overrides), "samples": samples,
                             "source": str(plan.text.path), "block_size": plan.block_size,
                             "tied_ranges": {**self.kv_ranges, **rope_ranges(job.tmp / ROPE_TABLE)},
                             "rounded_path": self.weights.graph_file}}


def export_and_quantize(job: QdqJob, loaded: LoadedModel, layout: GraphLayout, calibration: LlmCalibration,
                        weights: WeightPlan) -> QuantizedChunks:
    """Each variant's chunk graphs exported here and quantized in the pool; each variant's samples are
    taken out of `calibration` as it is done (the workers have what they need)."""
    plan = job.plan
    (job.tmp / "qdq").mkdir()
    left = len(layout.keys) - len(layout.done)
    with WorkerPool("the quantization of the LLM graphs", max(1, min(plan.jobs, left))) as pool:
        loop = _HandOver(job, layout, calibration, weights, pool, loaded.lora)
        for shape in plan.shapes:
            loop.variant(loaded.llm.model, loaded.mode, shape, calibration.samples.pop(shape))
        if loop.pending:
            job.report(f"quantizing {len(loop.pending)} graphs "
                       f"({plan.precision}{f', 4-bit blocks of {plan.block_size}' if plan.block_size else ''})")
        outcomes = pool.outcomes()
    quantize_s = time.perf_counter() - loop.t_first if loop.t_first else 0.0
    return QuantizedChunks(tuple(loop.pending), outcomes, loop.export_s, quantize_s)


def embedder_stage(job: QdqJob, loaded: LoadedModel) -> dict | None:
    """The embedder part of `--inputs embeddings` (embedder.py), exported beside the decoder's graphs."""
    if not loaded.mode.embedder:
        return None
    plan = job.plan
    job.report("exporting the embedder part")
    return build_embedders(loaded.llm.model, list(plan.variants), plan.max_seq_len, loaded.ids, plan.embedder_precision,
                           job.tmp / "embedder", job.tmp / "float", str(plan.text.path))


def join_parts(job: QdqJob, loaded: LoadedModel, layout: GraphLayout, quantized: QuantizedChunks) -> JoinedGraphs:
    """Each (variant, part) graph joined from its chunks' entries into `qdq/` (a worker's error is raised here)."""
    plan, cache = job.plan, job.cache
    shutil.rmtree(job.tmp / "float", ignore_errors=True)
    results = dict(zip(quantized.pending, raise_first_error(quantized.outcomes)))
    decoder = build_static_decoder(loaded.llm.model, decoder_config(min(plan.variants), plan.max_seq_len))
    quantization = {}
    for n, c in plan.shapes:
        for p in layout.parts:
            name, members = layout.names[(n, c, p.index)], layout.chunk_names[(n, c, p.index)]
            entries = [Path(results[c]["entry"]) if results.get(c) else cache.get(PART_NAMESPACE, layout.keys[c])
                       for c in members]
            io = {"first_inputs": loaded.mode.decoder_inputs, "caches": n != c, "mrope": decoder.mrope,
                  "lora": plan.lora.slots if plan.lora else None, "cos_sin": plan.positions == "cos-sin"}
            quantization[name] = join_into(entries, members, layout.chunks[p.index], name, job.tmp / "qdq", io)
            if not cache.enabled:
                for entry in entries:
                    shutil.rmtree(entry, ignore_errors=True)
    return JoinedGraphs(quantization, decoder.spec)


def record(job: QdqJob, loaded: LoadedModel, layout: GraphLayout, calibration: LlmCalibration, weights: WeightPlan,
           quantized: QuantizedChunks, embedder: dict | None, joined: JoinedGraphs) -> dict:
    """The stage entry's record (backends/llm_qnn reads it into the manifest)."""
    plan, llm, tok, sd = job.plan, loaded.llm, loaded.tok, joined.spec
    rope = getattr(llm.config, "rope_parameters", None) or {}
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or getattr(llm.config, "rope_theta", 10000.0)
    return {"graphs": layout.records(plan.shapes), "parts": [[p.first_layer, p.end_layer] for p in layout.parts],
            "host_chunks": {"mb": plan.chunk_mb, "layers": [[c.first_layer, c.end_layer] for p in layout.parts
                                                            for c in layout.chunks[p.index]]},
            "spec": {"n_layers": sd.n_layers, "n_heads": sd.n_heads, "n_kv_heads": sd.n_kv_heads, "head_dim": sd.head_dim,
                     "hidden_size": sd.hidden_size, "vocab_size": sd.vocab_size, "max_seq_len": plan.max_seq_len},
            "architecture": llm.architecture, "n_params": int(sum(p.numel() for p in llm.model.parameters())),
            "rope_theta": float(theta), "rope_parameters": dict(rope) if isinstance(rope, dict) else {},
            "rope_dim": _rope_dim(job.tmp / ROPE_TABLE), "bos_id": tok.bos_id, "add_bos": bool(tok.add_bos), "eos_ids": list(tok.eos_ids),
            "context_length": getattr(llm.config, "max_position_embeddings", None),
            "quantization": joined.quantization,
            "calibration": {"text": str(plan.text.path), "sha256": plan.text.sha256, "tokens": len(loaded.ids),
                            "samples_per_variant": calibration.counts},
            "inputs": loaded.mode.name, "positions": plan.positions, "embedder": embedder, "no_token_id": loaded.no_token_id,
            "residual_scale": calibration.residual_scale, "resumed_graphs": sorted(layout.done),
            "lora": _lora_record(plan.lora),
            "weights_held_as": "bfloat16" if loaded.held_bf16 else "float32",
            "weight_rounding": weights.rounding, "quality_recipe": weights.recipe,
            "timings": {"load_s": loaded.load_s, "calibration_s": calibration.seconds,
                        "export_s": round(quantized.export_s, 2), "quantize_s": round(quantized.quantize_s, 2),
                        **weights.timings}}


def rope_ranges(table: Path) -> dict[str, list[float]]:
    """`--positions cos-sin`: one range for the cos and sin inputs of every graph (Genie refuses a tensor
    whose encoding differs between the graphs sharing it), the table's whole span; {} without a table."""
    if not table.exists():
        return {}
    with np.load(table) as t:
        peak = float(max(np.abs(t["cos"]).max(), np.abs(t["sin"]).max()))
    return {POSITION_COS: [-peak, peak], POSITION_SIN: [-peak, peak]}


def _rope_dim(table: Path) -> int | None:
    """The width of a `--positions cos-sin` decoder's cos and sin inputs (rotary_dim / 2); None without one."""
    if not table.exists():
        return None
    with np.load(table) as t:
        return int(t["cos"].shape[1])


def _lora_record(lora) -> dict | None:
    """The LoRA inputs and the adapters calibrated with them (backends/llm_qnn copies the adapters in)."""
    if lora is None:
        return None
    return {**lora.slots.to_dict(), "adapters": [{**a.to_dict(), "folder": str(a.folder)} for a in lora.adapters]}


QDQ_STAGES: tuple[Stage, ...] = (
    Stage("load", load_model),
    Stage("reference", reference_stage, ("load",)),
    Stage("layout", lay_out, ("load",)),
    Stage("calibrate", calibrate_stage, ("load", "layout")),
    Stage("weights", weights_stage, ("load",)),
    Stage("graphs", export_and_quantize, ("load", "layout", "calibrate", "weights")),
    Stage("embedder", embedder_stage, ("load",)),
    Stage("join", join_parts, ("load", "layout", "graphs")),
    Stage("record", record, ("load", "layout", "calibrate", "weights", "graphs", "embedder", "join")),
)
check_order(QDQ_STAGES)


def build_qdq(job: QdqJob) -> dict:
    """The `llm-qdq` stage into `job.tmp`: its stages in order → the entry's record."""
    return run_stages(QDQ_STAGES, job)["record"]
