"""Read ONNX Runtime's own session profile (`SessionOptions.enable_profiling`, Chrome-trace JSON).

Per ORT node and run: a `<node name>_kernel_time` event with `dur` (µs) and `args.provider`
(CPUExecutionProvider / QNNExecutionProvider) and `args.op_name`. Runs are delimited by the
`model_run` Session events.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class OrtNodeEvent:
    name: str
    op_type: str
    provider: str
    ts: float
    dur: float
    run: int


def read_ort_profile(path: str | Path) -> tuple[list[OrtNodeEvent], list[tuple[float, float]]]:
    """→ (node events, [(ts, dur) of each model_run])."""
    events = json.loads(Path(path).read_text())
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    out = []
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        args = e.get("args", {})
        ts = float(e["ts"])
        idx = next((i for i, (s, d) in enumerate(runs) if s <= ts <= s + d), -1)
        out.append(OrtNodeEvent(e["name"][: -len("_kernel_time")], args.get("op_name", "?"), args.get("provider", "?"),
                                ts, float(e["dur"]), idx))
    return out, runs
