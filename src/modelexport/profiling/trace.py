"""A Chrome / Perfetto trace (JSON "traceEvents") of a profile.

Track "ONNX Runtime nodes": every ORT node of every run at its real start and duration (µs, from
ONNX Runtime's profiler), tagged with its execution provider. Track "HTP ops (cycle share)": at
`detailed`, the QNN nodes of each QNN graph laid end to end inside that graph's ORT span, each as
wide as its share of the graph's cycles (the QNN EP reports cycles, not start times). Open in
https://ui.perfetto.dev or chrome://tracing.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..core.atomic import atomic_file


def write_trace(path, rep, ort_events, ort_runs, qprof, qnn_kernels, n_graphs, runs) -> Path:
    info = {(r.name): r for r in rep.rows}
    ev = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"{rep.part}@{rep.target} on the HTP simulator"}},
          {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "ONNX Runtime nodes (wall time)"}},
          {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "HTP ops (cycle share of the QNN graph)"}},
          {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "runs"}}]
    for i, (ts, dur) in enumerate(ort_runs):
        ev.append({"ph": "X", "pid": 1, "tid": 0, "name": "warm-up run" if i == 0 else f"run {i}", "ts": ts, "dur": dur, "cat": "run"})
    spans: dict[tuple[str, int], tuple[float, float]] = {}
    for e in ort_events:
        backend = "HTP" if e.provider == "QNNExecutionProvider" else (info[e.name].backend if e.name in info else "CPU")
        ev.append({"ph": "X", "pid": 1, "tid": 1, "name": e.name, "ts": e.ts, "dur": e.dur, "cat": backend,
                   "args": {"op_type": e.op_type, "provider": e.provider, "run": e.run}})
        if e.provider == "QNNExecutionProvider":
            spans[(e.name, e.run)] = (e.ts, e.dur)
    for gi, k in enumerate(qnn_kernels):
        blocks = qprof.runs[gi::n_graphs]
        for run_idx, b in enumerate(blocks):
            if not b.nodes or (k, run_idx) not in spans:
                continue
            ts, dur = spans[(k, run_idx)]
            total = sum(x.cycles for x in b.nodes) or 1
            t = ts
            for x in b.nodes:
                w = dur * x.cycles / total
                if x.cycles:
                    row = info.get(x.name)
                    ev.append({"ph": "X", "pid": 1, "tid": 2, "name": x.name, "ts": round(t, 3), "dur": round(w, 3), "cat": "HTP",
                               "args": {"cycles": x.cycles, "op_id": x.op_id, "op_type": row.op_type if row else None,
                                        "module_path": row.module_path if row else None, "run": run_idx}})
                t += w
    data = {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"note": rep.note, "bundle": rep.bundle, "level": rep.level,
                          "layout": "HTP ops are laid out by cycle share inside the QNN graph's measured span"}}
    path = Path(path)
    with atomic_file(path, True) as tmp:
        Path(tmp).write_text(json.dumps(data))
    return path
