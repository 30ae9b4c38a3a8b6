"""The plan of an LLM compile: every option checked and given its default, and the source's facts,
before any weight is loaded (`LlmPlan`): the variants (`parse_variants`), the 4-bit weight options
(`quality_options`) and the whole plan (`resolve_plan`).

`opts` is the backend's `LlmCompileOptions` and `spec` its `PartSpec` (backends/spec.py), read by
attribute: llm/ may not import backends/.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any, Callable

from ...core.arguments import at_least, finite
from ...core.errors import InputError, UnsupportedError
from ...core.targets import SoC, get_target, require_feature
from ...core.vocab import Format
from ...quant.block_weights import DEFAULT_BLOCK
from ...quant.llm_graphs import DEFAULT_OVERRIDES, LLM_DEFAULT_PRECISION, LLM_OFFERED, LLM_PRECISIONS, parse_overrides
from ...quant.precision import Precision, check_block_size, get_precision
from ...quant.weight_rounding import default_rounding, get_rounding
from ...toolchain.htp_options import check_knobs
from ..model.input_modes import POSITIONS, get_input_mode
from ..run.text import TextSource, read_text
from .embedder import get_embedder_precision
from .lora_source import LoraPlan, plan_lora
from .memory import DEFAULT_CONTEXT_LIMIT_MB, host_chunk_mb
from .source import SourceFacts, check_source

DEFAULT_VARIANTS = (1, 32)
DEFAULT_CALIBRATION_SAMPLES = 8
# `--variants full` (seed 003's `--variant bert`): one graph over the whole context (N = --max-seq-len),
# causal, no KV-cache inputs or outputs; parse_variants marks it FULL, resolve_plan makes it N = C.
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


@dataclass(frozen=True)
class QualityOptions:
    """--rounding and --max-ppl-ratio, checked (4-bit weights only). `key()` is the dict the stage
    cache keys and the workers have always read: its fields in this order."""
    rounding: str
    max_ppl_ratio: float | None
    rounding_given: bool
    rounding_why: str | None

    def key(self) -> dict:
        return asdict(self)


def quality_options(opts: Any, precision: str, shape: dict) -> QualityOptions | None:
    """--rounding and --max-ppl-ratio, checked: they concern 4-bit weights only."""
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
    return QualityOptions(get_rounding(chosen).name, opts.max_ppl_ratio, opts.rounding is not None, why)


@dataclass(frozen=True)
class LlmPlan:
    """What `resolve_plan` hands the stages: the checked options and the source's facts."""
    requested: str                     # the precision asked for (16a4w_block)
    requested_precision: Precision
    precision: str                     # what ONNX Runtime quantizes to (16a4w for 16a4w_block)
    block_size: int                    # LPBQ block (0: per channel)
    variants: tuple[int, ...]          # N of each graph, largest first (N = max_seq_len: the full-context graph)
    max_seq_len: int
    socs: tuple[SoC, ...]
    overrides: tuple                   # parsed, the user's first (the first match wins)
    facts: SourceFacts
    text: TextSource
    n_samples: int
    limit_mb: float                    # the per-context HTP memory limit
    chunk_mb: float                    # the host's export / quantization unit
    jobs: int
    jobs_given: bool
    quality: QualityOptions | None
    inputs: str                        # the input mode's name (llm/model/input_modes.py)
    embedder_precision: str | None
    lora: LoraPlan | None = None       # --lora: the adapters and the graphs' LoRA inputs (lora_source.py)
    context_lengths: tuple[int, ...] = ()   # --context-lengths, ascending, the last = max_seq_len (): max_seq_len only
    positions: str = "ids"             # --positions: position_ids, or RoPE's cos and sin (llm/model/graph_io.py)

    @property
    def lengths(self) -> tuple[int, ...]:
        """Every context length the graphs are built for, ascending (the last is max_seq_len)."""
        return self.context_lengths or (self.max_seq_len,)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(N, C) of every graph: each variant at each context length, the longest length first; the
        full-context graph (N = max_seq_len) at the longest only."""
        return [(n, c) for c in reversed(self.lengths) for n in self.variants if n != self.max_seq_len or c == n]


@dataclass(frozen=True)
class _Precision:
    requested: str
    requested_precision: Precision
    precision: str
    block_size: int


def _check_precision(spec: Any, opts: Any) -> _Precision:
    requested_precision = get_precision(spec.precision or LLM_DEFAULT_PRECISION)
    requested = requested_precision.name
    check_block_size(opts.block_size)
    block_size = int(DEFAULT_BLOCK if opts.block_size is None else opts.block_size) if requested_precision.block_wise else 0
    # 16a4w_block: ONNX Runtime quantizes as 16a4w, then the 4-bit MatMul weights become LPBQ blocks
    precision = "16a4w" if block_size else requested
    if precision not in LLM_PRECISIONS:
        raise InputError(f"precision {precision} is not offered for LLMs",
                         f"use one of: {', '.join(LLM_OFFERED)}")
    return _Precision(requested, requested_precision, precision, block_size)


def parse_context_lengths(v: Any) -> list[int]:
    """--context-lengths "256,512,1024" (or a list): whole numbers, each above the one before."""
    items = [s.strip() for it in (v if isinstance(v, (list, tuple)) else [v]) for s in str(it).split(",") if s.strip()]
    fix = "write them shortest first, e.g. --context-lengths 512,1024,2048"
    if not items:
        raise InputError("--context-lengths is empty", fix)
    for s in items:
        if not s.isdigit() or int(s) < 2:
            raise InputError(f"--context-lengths: {s!r} is not a context length (a whole number of tokens, 2 or more)", fix)
    lengths = [int(s) for s in items]
    if any(b <= a for a, b in pairwise(lengths)):
        raise InputError(f"--context-lengths {','.join(items)} is not increasing", fix)
    return lengths


def _check_lengths(opts: Any, max_seq_len_of: Callable[[Any], int]) -> tuple[tuple[int, ...], int]:
    """(the context lengths or (), max_seq_len): --context-lengths' longest is the context."""
    given = getattr(opts, "context_lengths", None)
    if given is None:
        return (), max_seq_len_of(opts.max_seq_len)   # 0 is refused, not taken for the default
    lengths = parse_context_lengths(given)
    if opts.max_seq_len is not None and int(opts.max_seq_len) != lengths[-1]:
        raise InputError(f"--max-seq-len {opts.max_seq_len} differs from the longest of --context-lengths ({lengths[-1]})",
                         "leave --max-seq-len out: the longest context length is the bundle's context")
    max_seq_len_of(lengths[-1])
    return (tuple(lengths) if len(lengths) > 1 else ()), lengths[-1]


def _check_variants(opts: Any, max_seq_len_of: Callable[[Any], int]) -> tuple[list[int], int, tuple[int, ...]]:
    variants = parse_variants(opts.variants)
    lengths, max_seq_len = _check_lengths(opts, max_seq_len_of)
    full = FULL in variants
    variants = [n for n in variants if n != FULL]
    if not variants:
        raise InputError("--variants full alone: the full-context graph scores a whole context but cannot generate "
                         "(it keeps no KV cache)", "add an arN graph beside it, e.g. --variants ar1,full")
    shortest = (lengths or (max_seq_len,))[0]
    if shortest <= max(variants):
        what = f"--context-lengths' shortest ({shortest})" if lengths else f"--max-seq-len {max_seq_len}"
        raise InputError(f"{what} must be larger than the largest variant (ar{max(variants)})",
                         f"raise {'the shortest of --context-lengths' if lengths else '--max-seq-len'} above "
                         f"{max(variants)}, or choose smaller variants "
                         f"(e.g. --variants ar1,ar{min(32, shortest // 2) or 1})")
    if full:   # N = C: the first (largest) variant
        variants = [max_seq_len, *variants]
    return variants, max_seq_len, lengths


def _check_embedder(opts: Any) -> tuple[str, str | None]:
    mode = get_input_mode(opts.inputs)
    if opts.embedder_precision is not None and not mode.embedder:
        raise InputError(f"--embedder-precision is for the embedder part of --inputs embeddings; --inputs {mode.name} "
                         "has none", "leave --embedder-precision out, or add --inputs embeddings")
    return mode.name, get_embedder_precision(opts.embedder_precision).name if mode.embedder else None


def _check_targets(opts: Any, n_variants: int, p: _Precision) -> list[SoC]:
    socs: list[SoC] = []
    for t in opts.targets or ["SM8650"]:
        s = get_target(t)
        if s not in socs:
            socs.append(s)
    check_knobs(socs, opts.vtcm_mb, opts.optimization_level)
    for s in socs:
        if n_variants > 1:
            require_feature(s, "weight_sharing", f"{n_variants} variants sharing one copy of the weights")
        if p.requested_precision.feature:   # the precision table says what the HTP must have
            require_feature(s, p.requested_precision.feature,
                            f"precision {p.requested} ({p.requested_precision.description})")
    return socs


def _read_calibration_text(spec: Any) -> TextSource:
    text = read_text(spec.calibration if spec.calibration not in (None, "random") else None)
    if spec.calibration == "random":
        raise InputError("LLMs are calibrated on real text, not random data",
                         "give a text file with --calibration (default: lee_background.cor)")
    return text


def resolve_plan(spec: Any, opts: Any, max_seq_len_of: Callable[[Any], int]) -> LlmPlan:
    """Every option checked and given its default, and the source's facts: no weights loaded. The
    checks run in the order a user has always seen their errors. `max_seq_len_of`: the backends'
    --max-seq-len check and default (backends/spec.py)."""
    if opts.output_format != Format.CONTEXT_BINARY:
        raise InputError(f"LLMs compile to context-binary, not {opts.output_format!r}", "leave --format out")
    p = _check_precision(spec, opts)
    # checked before the `or default` below: 0 would otherwise silently become the default
    at_least("--calibration-samples", opts.calibration_samples, 1, str(DEFAULT_CALIBRATION_SAMPLES))
    at_least("--context-limit-mb", opts.context_limit_mb, 0.001, f"{DEFAULT_CONTEXT_LIMIT_MB:g}")
    variants, max_seq_len, lengths = _check_variants(opts, max_seq_len_of)
    inputs, embedder_precision = _check_embedder(opts)
    socs = _check_targets(opts, len(variants) * len(lengths or (1,)), p)
    overrides = parse_overrides(list(DEFAULT_OVERRIDES) + list(opts.overrides or []), p.precision)
    overrides = list(reversed(overrides))  # user overrides first: the first match wins
    facts = check_source(spec.model, max_seq_len, "--context-lengths" if lengths else "--max-seq-len")
    text = _read_calibration_text(spec)
    quality = quality_options(opts, p.precision, facts.shape or {})
    limit_mb = float(opts.context_limit_mb or DEFAULT_CONTEXT_LIMIT_MB)
    at_least("--host-chunk-mb", opts.host_chunk_mb, 0.001, "128")
    lora = _check_lora(opts, facts)
    positions = _check_positions(opts, facts)
    return LlmPlan(p.requested, p.requested_precision, p.precision, p.block_size, tuple(variants), max_seq_len,
                   tuple(socs), tuple(overrides), facts, text, int(opts.calibration_samples or DEFAULT_CALIBRATION_SAMPLES),
                   limit_mb, float(opts.host_chunk_mb or host_chunk_mb(limit_mb)),
                   opts.jobs or min(2, os.cpu_count() or 1), bool(opts.jobs), quality, inputs, embedder_precision, lora,
                   lengths, positions)


def _check_positions(opts: Any, facts: SourceFacts) -> str:
    """--positions ids | cos-sin. A family whose layers read different RoPE tables is refused here, before any
    weight loads; windows and M-RoPE set in a config are refused when the decoder is built (check_cos_sin)."""
    given = (getattr(opts, "positions", None) or "ids").strip().lower()
    if given not in POSITIONS:
        raise InputError(f"--positions {opts.positions!r} is not a way of taking positions",
                         f"choose one of: {', '.join(POSITIONS)} (default ids)")
    if given == "cos-sin" and facts.family is not None and facts.family.rope_per_layer_type:
        raise UnsupportedError(f"--positions cos-sin: {facts.architecture} layers read different RoPE tables, which one "
                               "cos/sin input pair cannot feed", "leave --positions out (the graphs then take position_ids)")
    return given


def _check_lora(opts: Any, facts: SourceFacts) -> LoraPlan | None:
    """--lora DIR ...: PEFT adapters, each checked against the base's shapes (no weight loaded)."""
    folders = tuple(getattr(opts, "lora", None) or ())
    if not folders:
        return None
    if facts.format != "hf":
        raise UnsupportedError("--lora takes PEFT adapters for a Hugging Face model folder; this base is a GGUF file",
                               "compile the base model's Hugging Face folder with --lora")
    return plan_lora(folders, facts.shape, facts.family.fused_qkv or facts.family.fused_gate_up)


def embed_head_bits(overrides, weight_bits: int) -> tuple[int, int]:
    """The embedding's and the head's weight bits under `overrides` (the memory plan prices them)."""
    bits = {o.pattern: o.precision.weight_bits for o in overrides}
    return (next((b for p, b in bits.items() if "embed" in p), weight_bits),
            next((b for p, b in bits.items() if "lm_head" in p), weight_bits))
