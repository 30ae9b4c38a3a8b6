"""Context-binary jobs for LLM graphs, run in child processes (spawn).

`shared`: every variant of one part compiled in ONE process, in order, with
`ep.share_ep_contexts=1` (and `ep.stop_share_ep_contexts=1` on the last), embed mode 0 → one
`_ctx_qnn.bin` holding all graphs with one copy of the weights, referenced by one `_ctx.onnx`
per variant. Compiling it never loads it on the simulator (which cannot run weight-shared
binaries); it is read back only through libQnnSystem.
`unshared` twins reuse the generic ONNX job (`backends.ort_qnn_worker.compile_job`).
"""
from __future__ import annotations

import time
from pathlib import Path

from ...cache import Cache
from ...errors import ModelExportError, ToolchainError


def _build_shared(job: dict, tmp: Path) -> dict:
    from ...toolchain.ort_qnn import SessionPlan, create_session, node_assignment
    placements, seconds = {}, {}
    n = len(job["models"])
    for i, (name, model_path) in enumerate(job["models"]):
        entries = {"ep.context_enable": "1", "ep.context_file_path": str(tmp / f"{name}_ctx.onnx"),
                   "ep.context_embed_mode": "0", "ep.share_ep_contexts": "1"}
        if i == n - 1:
            entries["ep.stop_share_ep_contexts"] = "1"
        t0 = time.perf_counter()
        try:
            sess = create_session(model_path, SessionPlan(provider_options=dict(job["provider_options"]),
                                                          config_entries=entries))
        except Exception as e:
            raise ToolchainError(f"the QNN EP could not compile {name} (weight-shared) for {job['target']}: "
                                 f"{' '.join(str(e).split())[:500]}",
                                 "try --optimization-level 1, or compile without weight sharing (one variant)") from None
        seconds[name] = round(time.perf_counter() - t0, 3)
        placements[name] = {ep: [list(x) for x in nodes] for ep, nodes in node_assignment(sess).items()}
        del sess
    bins = sorted(p.name for p in tmp.glob("*.bin"))
    if len(bins) != 1:
        raise ToolchainError(f"weight sharing produced {len(bins)} context binaries for part {job['part']} (expected 1)",
                             "report this: the QNN EP did not share its context")
    return {"part": job["part"], "target": job["target"], "context_binary": bins[0],
            "epcontext": {name: f"{name}_ctx.onnx" for name, _ in job["models"]},
            "placement": placements, "compile_seconds": seconds, "provider_options": job["provider_options"]}


def compile_shared(job: dict) -> dict:
    try:
        cache = Cache(Path(job["cache_root"]), job["cache_enabled"])
        entry, hit = cache.get_or_create("llm-ctx-shared", job["key"], lambda tmp: _build_shared(job, tmp))
        return {"entry": str(entry), "hit": hit, "meta": Cache.meta(entry)}
    except ModelExportError as e:
        return {"error": {"type": type(e).__name__, "problem": e.problem, "fix": e.fix}}
