"""Host memory and disk of an LLM compile, estimated before any weight is loaded, and the refusal
when the machine cannot hold them.

From config.json / GGUF metadata (`source.SourceFacts.shape`) and the plan (`memory.plan_parts`):
the phases of a compile follow one another, so the peak is the largest of
- load:      the frontend builds the model (bf16 for a bf16 checkpoint, float32 otherwise) while the
             checkpoint's pages are mapped;
- calibrate: the model plus what calibration records through the float decoder;
- round:     the data-aware 4-bit rounding after it (`--rounding gptq`, the default): the model, the
             calibration samples, one window of decoder layers' input moments and GPTQ's work on them
             (llm/layerwise_rounding.rounding_bytes);
- quantize:  the parent holding the model and exporting one (variant, part) graph while workers
             quantize the graphs exported before it, or the parent idle while `jobs` workers quantize;
- compile:   `jobs` QNN EP compiles, each of one part's quantized graph.
- embedder:  `--inputs embeddings` only: after the decoder's graphs, the parent exports the embedder
             part (one graph per variant, each writing the table in float32) while holding the
             model, quantizes it for `--embedder-precision 8bit` (ONNX Runtime's quantizer in the
             parent) and writes Genie's float32 table; priced like a graph's export (EXPORT_FACTOR on
             the float32 table, + QUANTIZE_FACTOR for 8 bits), not measured apart.
The peak counts memory the compile owns. A bf16 Hugging Face folder is loaded as stored, its weights
mapped from the safetensors files: page cache the kernel can drop and read again, beside the peak
(`mapped_bytes`), not in it. Measured (bench/experiments/llm_memory_kinds.py, a Llama-3.2-1B-shaped
bf16 folder): 0.32 GB anonymous after loading, 1.84 GB while calibrating with 2.47 GB of the
checkpoint mapped, 5.82 GB at the peak (the context-binary compiles), against 5.6 / 5.3 / 10.3 GB
when the weights were counted as the compile's own.
The factors are measured (bench/llm_sizes.py, the tree's RSS per progress stage): SmolLM2-135M
from its GGUF (1 part, ar32 + ar1, 2 jobs: load 1.3, calibrate 3.2, export 3.2 in the parent,
quantize 1.6 per worker, compile 1.25 per worker; peak 4.8 GB), and a Llama-3.2-1B-shaped bf16
compile exported in chunks of one layer (calibrate 4.75 GB; compile 4.86 GB with 2 workers); the
export factor is measured on single 1B layers. One or two models each: they are estimates and
printed as such.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

try:
    import psutil
except ImportError:   # then /proc/meminfo (available_memory)
    psutil = None

from ..core.errors import ResourceError
from .model.parts import host_chunks, host_part_bytes, layer_params

GB = 2**30
# per process, before any model: Python + torch + transformers (parent), + ONNX Runtime (workers)
PARENT_BASE = 1.0 * GB
WORKER_BASE = 0.6 * GB
# float32 W^T of the chunk's linears + the rest lifted + what tracing holds; weights never go through
# the exporter (onnx_export.export_part). One 1B layer (226 MB): +0.41 GB; with the embedding (646 MB): +1.27 GB
EXPORT_FACTOR = 2.0
CALIBRATION_BYTES = 2.0 * GB   # recorded through the float decoder (SmolLM2 +1.9 GB, 1B-shaped +2.0 GB over the load)
# of it, the samples still held while the 4-bit weights are rounded (1B-shaped: 16 samples with their
# 512-token caches, ~0.5 GB), not measured apart
SAMPLES_HELD_SHARE = 0.25
# the float chunk as ONNX Runtime's quantizer holds it + a few rows of temporaries; the LPBQ rewrite
# after it holds one weight (Llama-3.2-1B-shaped: a 226 MB layer 0.76 GB per worker, the last layer
# with the 400 MB head 1.40 GB)
QUANTIZE_FACTOR = 1.4
COMPILE_FACTOR = 9.0      # the QNN EP preparing one part's quantized graph (SmolLM2: 1.25 GB per worker)
DEVICE_BYTES_PER_PARAM = 0.66   # measured on Llama-3.2-1B-shaped, 16a4w_block (issue 17)
# phases that hold the whole model, whatever the parts and workers
WHOLE_MODEL_PHASES = ("load", "calibrate", "round", "embedder")
_DOING = {"load": "loading", "calibrate": "calibrating", "round": "rounding the 4-bit weights of",
          "embedder": "exporting the embedder part of"}
# what overrides the machine's own figures (tests; a container whose /proc lies)
MEMORY_ENV = "MODELEXPORT_MEMORY_AVAILABLE_MB"
DISK_ENV = "MODELEXPORT_DISK_AVAILABLE_MB"


@dataclass
class JobEstimate:
    n_params: int
    n_parts: int
    parts: list[list[int]]
    largest_part_float_bytes: int
    phases: dict[str, int] = field(default_factory=dict)    # phase -> peak host bytes
    peak_bytes: int = 0
    disk_bytes: int = 0
    available_bytes: int | None = None
    disk_available_bytes: int | None = None
    mapped_bytes: int = 0      # the checkpoint mapped as stored: page cache beside the peak, dropped under pressure

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(peak_gb=round(self.peak_bytes / GB, 2), disk_gb=round(self.disk_bytes / GB, 2),
                 mapped_gb=round(self.mapped_bytes / GB, 2),
                 available_gb=None if self.available_bytes is None else round(self.available_bytes / GB, 2),
                 disk_available_gb=None if self.disk_available_bytes is None else round(self.disk_available_bytes / GB, 2))
        return d


def config_from_shape(shape: dict) -> SimpleNamespace:
    """What memory.py reads of an HF config, from SourceFacts.shape (no transformers, no weights)."""
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if not shape.get(k)]
    if missing:
        return None
    return SimpleNamespace(**shape)


def n_params_of(cfg) -> int:
    embed = cfg.vocab_size * cfg.hidden_size
    tied = getattr(cfg, "tie_word_embeddings", False)
    norms = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size
    return layer_params(cfg) * cfg.num_hidden_layers + embed * (1 if tied else 2) + norms


def estimate_job(cfg, parts, variants: list[int], jobs: int, weight_bits: int, bf16_source: bool,  # noqa: PLR0913
                 targets: int = 1, quantized: bool = False, chunk_bytes: float | None = None,
                 rounding_bytes: int = 0, embedder: str | None = None, mapped: bool = False) -> JobEstimate:
    """`quantized`: the QDQ stage is cached, so nothing is loaded: only the compile phase counts.
    `chunk_bytes`: the host's unit of export and quantization (parts.host_chunks); a whole part if None.
    `rounding_bytes`: what a data-aware rounding adds over the model (0: none, `nearest`).
    `embedder`: the embedder part's precision when the bundle has one (fp16 | 8bit), else None.
    `mapped`: the weights stay mapped from the checkpoint as stored (a bf16 Hugging Face folder):
    file-backed pages the kernel drops and reads again under pressure, not memory of the compile's
    own (`mapped_bytes`); the phases count the float32 lift of the largest module instead."""
    n = n_params_of(cfg)
    part_float = max(host_part_bytes(cfg, p) for p in parts)
    part_q = part_float / 4 * (weight_bits / 8 + 0.05)       # quantized weights + float norms/scales
    chunks = [c for p in parts for c in (host_chunks(cfg, p, chunk_bytes) if chunk_bytes else [p])]
    chunk_float = max(host_part_bytes(cfg, c) for c in chunks)
    stored = n * (2 if bf16_source else 4)
    # mapped: the model's own memory is one module lifted to float32 at a time (the largest: the embedding
    # table or a layer), not the weights themselves
    held = int(4 * max(cfg.vocab_size * cfg.hidden_size, layer_params(cfg))) if mapped else stored
    tasks = len(chunks) * max(1, len(variants))         # one (variant, chunk) graph each
    table = cfg.vocab_size * cfg.hidden_size * 4        # the embedding table in float32
    # the embedder's binary is one of the compile jobs (its table in fp16 or 8 bits)
    embedder_bin = (table / 2 if embedder == "fp16" else table / 4) if embedder else 0
    quantizing = lambda k: min(max(1, jobs), k) * (WORKER_BASE + QUANTIZE_FACTOR * chunk_float)
    phases = {
        # the model, + the checkpoint's pages mapped while it is read (a mapped model: neither, until used)
        "load": int(PARENT_BASE + (0 if mapped else held + 2 * n)),
        "calibrate": int(PARENT_BASE + held + CALIBRATION_BYTES),
        **({"round": int(PARENT_BASE + held + SAMPLES_HELD_SHARE * CALIBRATION_BYTES + rounding_bytes)}
           if rounding_bytes else {}),
        # the last graph's export overlaps the quantization of those exported before it
        "quantize": int(max(PARENT_BASE + held + EXPORT_FACTOR * chunk_float + quantizing(tasks - 1),
                            PARENT_BASE + held + quantizing(tasks))),
        "compile": int(PARENT_BASE + max(1, jobs) * (WORKER_BASE + COMPILE_FACTOR * max(part_q, embedder_bin))),
    }
    if embedder:
        phases["embedder"] = int(PARENT_BASE + held + EXPORT_FACTOR * table
                                 + (QUANTIZE_FACTOR * table if embedder == "8bit" else 0))
    if quantized:
        phases = {"compile": phases["compile"]}
    qdq = len(variants) * (n / 4 * (weight_bits / 8 + 0.05) * 4)   # each variant's QDQ graph holds its weights
    binaries = targets * DEVICE_BYTES_PER_PARAM * n * (1 + len(variants))   # shared binary + a twin per variant
    # the embedder part: its graphs (a table each, float32 or 8 bits), Genie's float32 table, and per
    # target its binary (fp16 or 8 bits) with a twin per variant
    graph_bytes = table if embedder == "fp16" else table / 4
    embedder_disk = (len(variants) * graph_bytes + table + targets * (1 + len(variants)) * embedder_bin) if embedder else 0
    # cache (part entries, QDQ stage, binaries, embedder) + the bundle's copies + float parts being quantized
    disk = int(2 * (qdq + binaries + embedder_disk) + (max(1, jobs) + 1) * chunk_float)
    return JobEstimate(n_params=n, n_parts=len(parts), parts=[[p.first_layer, p.end_layer] for p in parts],
                       largest_part_float_bytes=int(part_float), phases=phases, peak_bytes=max(phases.values()),
                       disk_bytes=disk, mapped_bytes=int(stored) if mapped else 0)


def available_memory() -> int | None:
    env = os.environ.get(MEMORY_ENV)
    if env:
        return int(float(env) * 2**20)
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_disk(where: Path) -> int | None:
    env = os.environ.get(DISK_ENV)
    if env:
        return int(float(env) * 2**20)
    p = where
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def check_machine(est: JobEstimate, where: Path, limit_mb: float, jobs: int) -> JobEstimate:
    """Fill in what the machine has; refuse, with the numbers and a fix, when it cannot hold the job."""
    est.available_bytes = available_memory()
    est.disk_available_bytes = available_disk(where)
    g = lambda b: f"{b / GB:.1f} GB"
    if est.available_bytes is not None and est.peak_bytes > est.available_bytes:
        worst = max(est.phases, key=est.phases.get)
        if worst in WHOLE_MODEL_PHASES:     # the model itself: no part size or worker count lowers these
            fix = (f"free memory, or use a machine with more: {_DOING[worst]} this model needs about "
                   f"{g(est.phases[worst])} whatever the parts and workers")
            if worst == "round":
                fix += f", or compile with --rounding nearest (no input moments; {g(max(est.phases['load'], est.phases['calibrate']))})"
        else:
            fixes = ["--jobs 1 (one worker at a time)"] if jobs > 1 else []
            fixes.append(f"--context-limit-mb {max(64, int(limit_mb // 2))} (smaller parts; now {est.n_parts} "
                         f"part{'s' if est.n_parts > 1 else ''}, the largest {g(est.largest_part_float_bytes)} in float32)")
            fix = "free memory, or compile with " + " or ".join(fixes)
        raise ResourceError(
            f"this compile needs about {g(est.peak_bytes)} of memory at its peak ({worst}: "
            + ", ".join(f"{k} {g(v)}" for k, v in est.phases.items())
            + f"), and the machine has {g(est.available_bytes)} available",
            fix + "; `modelexport compile ... --dry-run` shows the plan")
    if est.disk_available_bytes is not None and est.disk_bytes > est.disk_available_bytes:
        raise ResourceError(f"this compile needs about {g(est.disk_bytes)} of disk (cache and bundle), and "
                            f"{where} has {g(est.disk_available_bytes)} free",
                            "free disk space, or move the cache (MODELEXPORT_CACHE_DIR) to a larger disk")
    return est
