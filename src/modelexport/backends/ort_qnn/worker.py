"""One compile job: an ONNX (QDQ or float) model → one output format (formats.py) for one
target, through a real QNN EP session. Runs in a pool worker or in-process; the
result lands in the content-addressed cache."""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ...core.cache import Cache, cache_key
from ...core.errors import ToolchainError, clip
from ...toolchain.ort_qnn import SessionPlan, create_session, node_assignment
from ...toolchain.ort_qnn_log import layout_refusal_fix
from ...toolchain.qnn_graph_order import ORDER_SCHEME, ordered_model_path
from .formats import OUTPUT_FORMATS

CACHE_NAMESPACE = "ctx"


@dataclass(frozen=True)
class ModelFile:
    """The ONNX model a job compiles, and its sha256 (core.files.sha256_onnx: the cache key's)."""
    path: Path
    sha256: str


def compile_job_for(part: str, target: str, model: ModelFile, provider_options: dict, output_format: str,
                    qairt_build: str, cache: Cache, graph_order: tuple[int, int] | None = None) -> dict:
    """The job `compile_job` takes, keyed by everything that shapes what the QNN EP writes; the
    ONNX and LLM compilers share the cache entries. `graph_order` (i, n): the QNN graph is named to
    sort i-th of n (toolchain/qnn_graph_order.py)."""
    import onnxruntime
    key = cache_key(CACHE_NAMESPACE, model.sha256, provider_options, output_format, qairt_build, onnxruntime.__version__,
                    part, *([ORDER_SCHEME, list(graph_order)] if graph_order else []))
    return {"part": part, "target": target, "model_path": str(model.path), "provider_options": provider_options,
            "format": output_format, "key": key, "cache_root": str(cache.root), "cache_enabled": cache.enabled,
            "graph_order": list(graph_order) if graph_order else None}


def _build(job: dict, tmp: Path) -> dict:
    part, fmt = job["part"], OUTPUT_FORMATS[job["format"]]
    more_opts, entries = fmt.session(tmp, part)
    opts = dict(job["provider_options"]) | more_opts
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with tempfile.TemporaryDirectory(prefix="modelexport-order-") as links:
            model_path = job["model_path"]
            if job.get("graph_order"):
                model_path = ordered_model_path(Path(model_path), *job["graph_order"], Path(links))
            sess = create_session(str(model_path), SessionPlan(provider_options=opts, config_entries=entries))
    except Exception as e:
        raise ToolchainError(f"the QNN EP could not compile {part} for {job['target']}: {clip(str(e), 1000)}",
                             _compile_fix(str(e), opts)) from None
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0   # CPU: every thread of this worker
    placement = {ep: [list(x) for x in nodes] for ep, nodes in node_assignment(sess).items()}
    del sess
    files = fmt.collect(tmp, part, job["target"])
    return {"part": part, "target": job["target"], "files": files, "placement": placement,
            "compile_seconds": round(seconds, 3), "compile_cpu_seconds": round(cpu_seconds, 3),
            "provider_options": opts, "session_config": entries}


def _compile_fix(error: str, opts: dict) -> str:
    """What to do when the EP refuses: graph preparation out of memory at a high optimization level
    (PP-OCRv3's 960x960 detector at fp16: MEM_ALLOC at -O 3, compiled at -O 1) is not a node's fault."""
    if "MEM_ALLOC" in error and str(opts.get("htp_graph_finalization_optimization_mode", "3")) != "1":
        return ("the HTP's graph preparation ran out of memory at this optimization level: compile with -O 1 "
                "(a lighter optimization: check its speed with `modelexport profile`), or a smaller --input-shape "
                "where the model allows one")
    return layout_refusal_fix(error) or ("run `modelexport audit` on the model with the same --precision: it "
                                         "names the node QNN refuses and the fix for it")


def compile_job(job: dict) -> dict:
    """{"entry", "hit", "meta"} of the job's cache entry, built on a miss."""
    cache = Cache(Path(job["cache_root"]), job["cache_enabled"])
    entry, hit = cache.get_or_create(CACHE_NAMESPACE, job["key"], lambda tmp: _build(job, tmp))
    return {"entry": str(entry), "hit": hit, "meta": Cache.meta(entry)}
