"""`modelexport profile` of an ONNX Runtime QNN bundle: its compiled graph on the HTP simulator with QNN profiling on.

One session on the EPContext model with the QNN EP's provider options `profiling_level` and
`profiling_file_path` (the EP's CSV) and ONNX Runtime's own profiler (per-node wall time, which is
how nodes left on the CPU EP are timed). A warm-up run, then `runs` measured runs; per op the
median over the measured runs. At `detailed` the QNN EP reports cycles per QNN node; each node's
time is estimated as its share of its graph's cycles times that graph's measured wall time (ORT's
kernel time of the EPContext node), so HTP and CPU rows share one unit (µs) and one total.
"""
from __future__ import annotations

import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..backends.ort_qnn.run import SimulatorSession, given_feed, select_graphs
from ..backends.ort_qnn.verify import stored_samples
from ..contract import Bundle, open_bundle
from ..core.errors import InputError, ToolchainError, UnsupportedError, clip
from ..core.targets import get_target
from ..core.vocab import BundleKind
from ..frontends.module_paths import onnx_module_path
from ..toolchain.host_cores import one_host_core
from ..toolchain.htp_options import run_provider_options
from ..toolchain.native_io import native_stdout_to_stderr
from ..toolchain.ort_qnn import CPU_EP_NAME, EP_NAME, SessionPlan, node_assignment, session_options
from .ort_trace import read_ort_profile
from .qnn_csv import read_qnn_csv
from .report import NOTE, ProfileReport, ProfileRow, check_build, median
from .trace import write_trace

_IO_OPS = ("QuantizeLinear", "DequantizeLinear")


def _onnx_nodes(path: Path) -> dict[str, Any]:
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    return {n.name: n for n in m.graph.node}


def _session(cg, level: str, work: Path):
    import onnxruntime as ort

    soc = get_target(cg.target)
    opts = run_provider_options(soc.soc_model, None)
    csv_path = work / "qnn_profile.csv"
    if level != "off":
        opts |= {"profiling_level": level, "profiling_file_path": str(csv_path)}
    so = session_options(SessionPlan(provider_options=opts))
    if level != "off":
        so.enable_profiling = True
        so.profile_file_prefix = str(work / "ort_profile")
    try:
        with native_stdout_to_stderr():
            sess = ort.InferenceSession(str(cg.epcontext), sess_options=so)
    except Exception as e:
        raise ToolchainError(f"the HTP simulator could not load {cg.epcontext}: {clip(str(e), 1000)}",
                             "check the bundle with `modelexport inspect`; recompile it if it came from another QAIRT") from None
    sess.disable_fallback()            # a failed run raises the QNN EP's error, not the CPU EP's retry
    return sess, csv_path


def _profiled_run(sess, feed, level: str) -> None:
    """One run; QNN's refusal to profile the graph at this level is said with the level that works."""
    try:
        sess.run(None, feed)
    except Exception as e:
        if "SET_PROFILE" not in str(e):
            raise
        raise ToolchainError(f"QNN could not profile this graph at level {level} (QNN_GRAPH_ERROR_SET_PROFILE, 6006)",
                             "profile it with --level basic (times per graph, no per-op cycles)") from None


def _feed(bundle: Bundle, cg, sess, inputs) -> tuple[dict[str, np.ndarray], str]:
    class _Shim(SimulatorSession):
        def __init__(self, s):          # reuse the input checks without a second session
            self.session = s
            self.inputs = {i.name: i for i in s.get_inputs()}
    shim = _Shim(sess)
    if inputs:
        return given_feed(inputs, shim), "given"
    samples = stored_samples(bundle, cg.part)
    if samples:
        return shim.check_feed(samples[0]), "stored verify sample 0"
    return shim.random_feed(), "random"


def time_runs(bundle_path: str | Path, runs: int = 5, level: str = "off", part: str | None = None,
              target: str | None = None) -> dict[str, Any]:
    """Wall time of `runs` runs after one warm-up, with profiling off/basic/detailed (for bench/)."""
    bundle = open_bundle(bundle_path)
    check_build(bundle)
    cg = select_graphs(bundle, part, target)[0]
    with tempfile.TemporaryDirectory(prefix="mx-prof-") as tmp:
        t0 = time.perf_counter()
        sess, _ = _session(cg, level, Path(tmp))
        load = time.perf_counter() - t0
        feed, _ = _feed(bundle, cg, sess, None)
        sess.run(None, feed)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t0)
        if level != "off":
            sess.end_profiling()
        del sess
        gc.collect()
    return {"level": level, "load_s": round(load, 4), "run_s": [round(t, 4) for t in times],
            "median_s": round(median(times), 4)}


def profile_ort(bundle_path: str | Path, runs: int = 5, level: str = "basic", part: str | None = None,
                   target: str | None = None, inputs=None, trace: str | Path | None = None,
                   keep_dir: str | Path | None = None) -> ProfileReport:
    bundle = open_bundle(bundle_path)
    if bundle.manifest.kind == BundleKind.LLM:
        raise UnsupportedError(f"{bundle.path} is an LLM bundle; `modelexport profile` profiles one compiled graph of a model bundle",
                               "profile an ONNX/PyTorch model bundle; LLM bundles: use `modelexport generate` timings")
    check_build(bundle)
    graphs = select_graphs(bundle, part, target)
    if len(graphs) != 1:
        raise InputError(f"{bundle.path} holds {len(graphs)} compiled graphs: " + ", ".join(f"{g.part}@{g.target}" for g in graphs),
                         "choose one with --part and/or --target")
    cg = graphs[0]
    pm = bundle.manifest.part(cg.part)
    ref_model = (pm.files.quantized_model or pm.files.float_model) if pm else None
    ref_nodes = _onnx_nodes(bundle.file(ref_model)) if ref_model else {}
    ctx_nodes = _onnx_nodes(cg.epcontext)
    graph_io = {t.name for t in [*(cg.graph.onnx_inputs or []), *(cg.graph.onnx_outputs or [])]}

    with tempfile.TemporaryDirectory(prefix="mx-prof-") as tmp:
        work = Path(keep_dir) if keep_dir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        sess, csv_path = _session(cg, level, work)
        placement = node_assignment(sess)
        if not placement.get(EP_NAME):
            raise ToolchainError("the EPContext node did not land on the QNN EP", "run `modelexport doctor`")
        feed, feed_kind = _feed(bundle, cg, sess, inputs)
        wall = []
        for _ in range(runs + 1):            # run 0 is the warm-up
            t0 = time.perf_counter()
            _profiled_run(sess, feed, level)
            wall.append(time.perf_counter() - t0)
        ort_json = Path(sess.end_profiling())
        del sess
        gc.collect()                          # the QNN EP writes its CSV when the session goes away
        ort_events, ort_runs = read_ort_profile(ort_json)
        if not csv_path.is_file():
            raise ToolchainError(f"the QNN EP wrote no profile ({csv_path})",
                                 "this onnxruntime-qnn does not honour profiling_file_path; run `modelexport doctor`")
        qprof = read_qnn_csv(csv_path)
        files = {}
        if keep_dir:
            files = {"qnn_csv": str(csv_path), "ort_profile": str(ort_json)}

    warnings: list[str] = []
    measured = set(range(1, len(ort_runs)))
    qnn_graphs = [n for n, _ in placement.get(EP_NAME, [])]
    cpu_nodes = placement.get(CPU_EP_NAME, [])
    g = max(1, len(qnn_graphs))
    if len(qprof.runs) != g * (runs + 1):
        warnings.append(f"the QNN EP reported {len(qprof.runs)} executes for {runs + 1} runs of {g} QNN graph(s)")
    # ORT kernel time per (node, run)
    per_node: dict[str, dict[int, float]] = {}
    provider: dict[str, str] = {}
    op_of: dict[str, str] = {}
    order: dict[str, float] = {}
    for e in ort_events:
        per_node.setdefault(e.name, {})[e.run] = per_node.get(e.name, {}).get(e.run, 0.0) + e.dur
        provider[e.name] = e.provider
        op_of[e.name] = e.op_type
        if e.run == 0:
            order[e.name] = e.ts
    # ORT names an EPContext node's kernel by its fused name; map in execution order
    ort_qnn_kernels = sorted((n for n in per_node if provider[n] == EP_NAME), key=lambda n: order.get(n, 0))
    rows: list[ProfileRow] = []
    for name, op in cpu_nodes:
        times = [per_node.get(name, {}).get(r, 0.0) for r in sorted(measured)]
        node = ctx_nodes.get(name) or ref_nodes.get(name)
        io = op in _IO_OPS and name.rsplit("_", 1)[0] in graph_io
        rows.append(ProfileRow(name, op, onnx_module_path(node) if node is not None else None,
                               "CPU (graph io)" if io else "CPU fallback", median(times), None, 0.0,
                               "ORT profiler: CPU EP kernel time", [round(t, 2) for t in times]))
    qnn_totals = {"execute_us": [], "accelerator_us": [], "accelerator_cycles": []}
    run_cycles: dict[int, list[int]] = {}       # per measured run, each QNN graph's cycles (a split model has several)
    for gi, kname in enumerate(ort_qnn_kernels):
        blocks = qprof.runs[gi::g] if len(qprof.runs) >= g else []
        graph_times = [per_node[kname].get(r, 0.0) for r in sorted(measured)]
        mblocks = blocks[1:] if len(blocks) == runs + 1 else blocks
        for j, b in enumerate(mblocks):
            qnn_totals["execute_us"].append(b.execute_us)
            qnn_totals["accelerator_us"].append(b.accel_us)
            if b.accel_cycles is not None:
                run_cycles.setdefault(j, []).append(b.accel_cycles)
        if level == "basic" or not any(b.nodes for b in mblocks):
            label = qnn_graphs[gi] if gi < len(qnn_graphs) else kname
            rows.append(ProfileRow(label, "EPContext (QNN graph)", None, "HTP graph", median(graph_times), None, 0.0,
                                   "ORT profiler: QNN EP kernel time (use --level detailed for per-op cycles)",
                                   [round(t, 2) for t in graph_times]))
            continue
        # per QNN node: cycles per run, time = cycle share × the graph's wall time in that run
        cyc: dict[tuple[str, int], list[int]] = {}
        est: dict[tuple[str, int], list[float]] = {}
        seq: list[tuple[str, int]] = []
        for b, gt in zip(mblocks, graph_times):
            total = sum(e.cycles for e in b.nodes) or 1
            for e in b.nodes:
                key = (e.name, e.op_id)
                if key not in cyc:
                    seq.append(key)
                cyc.setdefault(key, []).append(e.cycles)
                est.setdefault(key, []).append(gt * e.cycles / total)
        for key in seq:
            name = key[0]
            node = ref_nodes.get(name)
            if node is not None:
                op, mp = node.op_type, onnx_module_path(node)
            elif name in ("Input", "Output"):
                op, mp = f"graph {name.lower()} (QNN)", None
            else:
                op, mp = name.rsplit("/", 1)[-1].split("_")[0] + " (added by QNN)", None
            rows.append(ProfileRow(name, op, mp, "HTP", median(est[key]), int(statistics.median(cyc[key])), 0.0,
                                   "QNN EP profile: cycles; time = cycle share x the graph's ORT kernel time",
                                   [round(t, 2) for t in est[key]]))
    # a run's cycles are its graphs' together; a run some graph did not report is left out
    qnn_totals["accelerator_cycles"] = [sum(c) for _, c in sorted(run_cycles.items()) if len(c) == len(ort_qnn_kernels)]
    total_us = sum(r.time_us for r in rows) or 1.0
    for r in rows:
        r.share = r.time_us / total_us
        r.time_us = round(r.time_us, 3)
    rank = {"CPU fallback": 0, "HTP": 1, "HTP graph": 1, "CPU (graph io)": 2}
    rows.sort(key=lambda r: (rank.get(r.backend, 3), -r.time_us))
    totals = {"rows_time_us": round(total_us, 2), "wall_s": [round(t, 4) for t in wall[1:]],
              "warmup_s": round(wall[0], 4), "inputs": feed_kind,
              "qnn_execute_us_median": median([x for x in qnn_totals["execute_us"] if x is not None]),
              "qnn_accelerator_us_median": median([x for x in qnn_totals["accelerator_us"] if x is not None]),
              "qnn_accelerator_cycles_median": median(qnn_totals["accelerator_cycles"]) or None,
              "qnn_accelerator_cycles_min": min(qnn_totals["accelerator_cycles"], default=None),
              "qnn_accelerator_cycles_runs": qnn_totals["accelerator_cycles"],
              "qnn_load": qprof.load, "cpu_fallback_share": round(sum(r.share for r in rows if r.backend == "CPU fallback"), 4),
              "htp_nodes_profiled": sum(1 for r in rows if r.backend == "HTP"),
              "placement": {ep: len(v) for ep, v in placement.items()}}
    rep = ProfileReport(str(bundle.path), cg.part, cg.target, level, runs, rows, totals, qprof.columns, files, NOTE, warnings)
    if trace is not None:
        write_trace(trace, rep, ort_events, ort_runs, qprof, ort_qnn_kernels, g, runs)
        rep.files["trace"] = str(trace)
    return rep


def steady_cycles(bundle_path: str | Path, runs: int = 5) -> float | None:
    """The compiled graph's accelerator cycles on the simulator, read as steadily as this host allows:
    its threads held on one host core, the fewest over `runs` runs. Left free, the simulator's threads
    share the host's cores with everything else and its cycle count moves with them: mtcnn_pnet at
    8a8w read 1.28 M to 2.67 M cycles per run on a quiet 2-core host, held on one core 1.29 M to
    1.81 M between processes (bench/results/sim_cycles_noise.json)."""
    return steady_profile(bundle_path, runs)[0]


def steady_profile(bundle_path: str | Path, runs: int = 5) -> tuple[float | None, dict[str, int]]:
    """(steady_cycles, {QNN op name: its median cycles per run}) from the same runs. A QNN op is named
    after the ONNX node it was made from (a node QNN added is named after its own op)."""
    with one_host_core():
        rep = profile_ort(bundle_path, runs=runs, level="detailed")
    ops: dict[str, int] = {}
    for r in rep.rows:
        if r.cycles is not None:
            ops[r.name] = ops.get(r.name, 0) + r.cycles
    return rep.totals.get("qnn_accelerator_cycles_min"), ops
