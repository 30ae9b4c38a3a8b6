"""Profiling a `.pte` bundle (ExecuTorch, QNN delegate) through ExecuTorch's ETDump.

executorch 1.5.1's pip runtime records an ETDump (`Runtime.load_program(..., enable_etdump=True)`,
`Program.write_etdump_result_to_file`), read back with `executorch.devtools.Inspector`. What it holds
here: runtime-level events — `Method::init`, `Program::load_method`, one `DELEGATE_CALL` per delegate
call, `Method::execute`, and one event per portable (CPU) kernel — with durations in ms per run.
It holds no per-op events *inside* the QNN delegate: those need the QNN delegate's own profiler to
be switched on when the .pte is compiled (QnnExecuTorchBackendOptions profile level), which
`modelexport compile` does not do yet. So a .pte profile ranks delegate calls against CPU kernels.
"""
from __future__ import annotations

import gc
import json
import statistics
import tempfile
import warnings
from pathlib import Path

from ..backends.executorch_qnn.inspect import read_pte
from ..backends.executorch_qnn.specs import qnn_ready
from ..core.atomic import atomic_file
from ..core.errors import ToolchainError, clip
from ..toolchain.executorch_env import ensure_executorch_qnn
from ..toolchain.native_io import capture_native_output
from .report import NOTE, ProfileReport, ProfileRow, check_build

ET_NOTE = ("ETDump of the executorch 1.5.1 pip runtime: delegate calls and CPU kernels are timed; ops inside the "
           "QNN delegate are not (that needs the QNN delegate's profiler compiled into the .pte)")
_RUNTIME_EVENTS = {"Method::init", "Program::load_method", "Method::execute"}


def _ready():
    try:
        return qnn_ready()
    except ImportError:
        return ensure_executorch_qnn()


def profile_pte(bundle_path, runs, level, part, target, inputs, trace, keep_dir=None):
    """`keep_dir` is the runners' one signature: ETDump leaves no raw profile folder to keep."""
    from ..backends.executorch_qnn.run import PteSession, _one, _select
    g = _one(_select(bundle_path, part, target), bundle_path)
    if g.bundle is not None:
        check_build(g.bundle)
    _ready()
    from executorch.runtime import Runtime

    with tempfile.TemporaryDirectory(prefix="mx-etdump-") as tmp:
        etdp = Path(tmp) / "run.etdp"
        try:
            with capture_native_output():
                program = Runtime.get().load_program(g.pte, enable_etdump=True)
                method = program.load_method(g.method)
        except Exception as e:
            raise ToolchainError(f"executorch.runtime could not load {g.pte}: {clip(str(e), 1000)}",
                                 "check it with `modelexport inspect`; recompile it with this modelexport") from None

        class _Shim(PteSession):
            def __init__(self):
                self.g, self.inputs, self.method = g, {i["name"]: i for i in g.inputs}, method
        shim = _Shim()
        if inputs:
            from ..backends.ort_qnn.run import given_feed
            feed = given_feed(inputs, shim)
            kind = "given"
        else:
            feed, kind = shim.random_feed(), "random"
        wall = []
        for _ in range(runs + 1):
            _, dt = shim.run(feed)
            wall.append(dt)
        try:
            program.write_etdump_result_to_file(str(etdp), str(Path(tmp) / "debug.bin"))
        except Exception as e:
            raise ToolchainError(f"ExecuTorch wrote no ETDump: {e}", "this executorch runtime was built without event tracing") from None
        del method, program
        gc.collect()

        from executorch.devtools import Inspector
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ins = Inspector(etdump_path=str(etdp))
    backends = {}
    if g.bundle is not None:
        try:
            info = read_pte(g.pte.read_bytes(), read_binaries=False)
            backends = next((m.get("delegate_calls", {}) for m in info["methods"] if m["name"] == g.method), {})
        except Exception:  # the label is a nicety; the timings stand without it
            backends = {}
    only = next(iter(backends)) if len(backends) == 1 else None
    rows: list[ProfileRow] = []
    totals: dict = {"inputs": kind, "wall_s": [round(t, 4) for t in wall[1:]], "warmup_s": round(wall[0], 4)}
    k = 0
    for block in ins.event_blocks:
        for e in block.events:
            raw = list(e.perf_data.raw) if e.perf_data is not None else []
            if e.name in _RUNTIME_EVENTS:
                totals[f"{e.name}_ms_median"] = round(statistics.median(raw[1:] or raw), 4) if raw else None
                continue
            times_us = [x * 1000.0 for x in (raw[1:] if len(raw) > 1 else raw)]
            if e.name == "DELEGATE_CALL":
                k += 1
                be = e.delegate_backend_name or only
                backend = "HTP" if be == "QnnBackend" else ("CPU fallback" if be else "delegate (backend not recorded)")
                name, op = f"delegate call {k}", f"DELEGATE_CALL ({be or ' / '.join(backends) or '?'})"
            else:
                name, op, backend = e.name, "portable kernel", "CPU fallback"
            rows.append(ProfileRow(name, op, None, backend, statistics.median(times_us) if times_us else 0.0, None, 0.0,
                                   "ETDump (executorch.devtools.Inspector)", [round(t, 2) for t in times_us]))
    total = sum(r.time_us for r in rows) or 1.0
    for r in rows:
        r.share = r.time_us / total
        r.time_us = round(r.time_us, 3)
    rows.sort(key=lambda r: ({"CPU fallback": 0, "HTP": 1}.get(r.backend, 2), -r.time_us))
    totals |= {"rows_time_us": round(total, 2), "qnn_execute_us_median": 0.0, "qnn_accelerator_cycles_median": None,
               "cpu_fallback_share": round(sum(r.share for r in rows if r.backend == "CPU fallback"), 4),
               "htp_nodes_profiled": 0, "delegate_calls_in_pte": backends}
    rep = ProfileReport(str(bundle_path), g.part, g.target or "?", "etdump", runs, rows, totals, [], {}, NOTE, [ET_NOTE])
    if level == "detailed":
        rep.warnings.append("--level detailed has no per-op effect on a .pte: " + ET_NOTE)
    if trace is not None:
        ev, t = [], 0.0
        for r in rows:
            ev.append({"ph": "X", "pid": 1, "tid": 1, "name": r.name, "ts": t, "dur": r.time_us, "cat": r.backend,
                       "args": {"op_type": r.op_type, "median_of_runs": True}})
            t += r.time_us
        with atomic_file(Path(trace), True) as tmpf:
            Path(tmpf).write_text(json.dumps({"traceEvents": ev, "otherData": {"note": NOTE, "layout": "medians laid end to end"}}))
        rep.files["trace"] = str(trace)
    return rep
