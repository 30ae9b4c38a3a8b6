"""Context-binary jobs for LLM graphs, run in child processes (spawn).

`shared`: every variant of one part compiled in ONE process, in order, with
`ep.share_ep_contexts=1` (and `ep.stop_share_ep_contexts=1` on the last), embed mode 0 → one
`_ctx_qnn.bin` holding all graphs with one copy of the weights, referenced by one `_ctx.onnx`
per variant. Compiling it never loads it on the simulator (which cannot run weight-shared
binaries); it is read back only through libQnnSystem.
`unshared` twins reuse the generic ONNX job (`backends.ort_qnn.worker.compile_job`).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ...core.cache import Cache
from ...core.errors import ToolchainError, clip
from ...toolchain.htp_options import run_provider_options
from ...toolchain.ort_qnn import SessionPlan, create_session, node_assignment
from ...toolchain.qnn_graph_order import ordered_model_path, qnn_graph_name

SHARED_NAMESPACE = "llm-ctx-shared"


def _build_shared(job: dict, tmp: Path) -> dict:
    placements, seconds, cpu_seconds, graph_names = {}, {}, {}, {}
    n = len(job["models"])
    with tempfile.TemporaryDirectory(prefix="modelexport-order-") as links:   # the ordered paths' symlinks
        for i, (name, model_path) in enumerate(job["models"]):
            if job.get("n_parts", 1) > 1:   # each variant's graph of this part named to sort at the part's place
                model_path = ordered_model_path(Path(model_path), job["part"], job["n_parts"], Path(links))
            # the QNN EP names the graph from the path: a twin compiled from a copy elsewhere is named otherwise
            graph_names[name] = qnn_graph_name(model_path)
            entries = {"ep.context_enable": "1", "ep.context_file_path": str(tmp / f"{name}_ctx.onnx"),
                       "ep.context_embed_mode": "0", "ep.share_ep_contexts": "1"}
            if i == n - 1:
                entries["ep.stop_share_ep_contexts"] = "1"
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                sess = create_session(model_path, SessionPlan(provider_options=dict(job["provider_options"]),
                                                              config_entries=entries))
            except Exception as e:
                raise ToolchainError(f"the QNN EP could not compile {name} (weight-shared) for {job['target']}: "
                                     f"{clip(str(e), 1000)}",
                                     "try --optimization-level 1, or compile without weight sharing (one variant)") from None
            seconds[name] = round(time.perf_counter() - t0, 3)
            cpu_seconds[name] = round(time.process_time() - c0, 3)   # every thread of this worker
            placements[name] = {ep: [list(x) for x in nodes] for ep, nodes in node_assignment(sess).items()}
            del sess
    bins = sorted(p.name for p in tmp.glob("*.bin"))
    if len(bins) != 1:
        raise ToolchainError(f"weight sharing produced {len(bins)} context binaries for part {job['part']} (expected 1)",
                             "report this: the QNN EP did not share its context")
    return {"part": job["part"], "target": job["target"], "context_binary": bins[0],
            "epcontext": {name: f"{name}_ctx.onnx" for name, _ in job["models"]},
            "placement": placements, "compile_seconds": seconds, "compile_cpu_seconds": cpu_seconds,
            "provider_options": job["provider_options"],
            "expected_graph_names": graph_names}


def compile_shared(job: dict) -> dict:
    cache = Cache(Path(job["cache_root"]), job["cache_enabled"])
    entry, hit = cache.get_or_create(SHARED_NAMESPACE, job["key"], lambda tmp: _build_shared(job, tmp))
    return {"entry": str(entry), "hit": hit, "meta": Cache.meta(entry)}


def simulator_smoke_run(job: dict) -> dict:
    """Load one host twin from its context binary on the x86 simulator and run it once on zeros.

    Run in a child process: some block-wise (LPBQ) binaries crash the simulator when loaded from a
    context binary (measured on QAIRT 2.51 with 64-wide blocks on 576- and 512-wide inputs, while
    16/32/48/96/128 ran), and the host numerics (`eval`, `verify`, `generate --backend htp-sim`)
    must never take the user's process down. A crash is seen by the parent as a dead worker; a
    load or run that fails without crashing ends the same way, as a ToolchainError."""
    import numpy as np

    try:
        sess = create_session(job["epcontext"], SessionPlan(provider_options=run_provider_options(job["soc_model"], None)))
        dtypes = {"tensor(int32)": np.int32, "tensor(int64)": np.int64}
        feed = {i.name: np.zeros(i.shape, dtypes.get(i.type, np.float32)) for i in sess.get_inputs()}
        t0 = time.perf_counter()
        out = sess.run(None, feed)[0]
    except Exception as e:
        raise ToolchainError(f"the simulator could not run {job['epcontext']}: {clip(str(e), 1000)}") from None
    return {"ok": bool(np.isfinite(out).all()), "seconds": round(time.perf_counter() - t0, 2)}
