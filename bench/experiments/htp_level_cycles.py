"""What `--optimization-level` buys and costs on one LLM graph (issue 17: compile time).

For each HTP graph-finalization level (1, 2, 3) the QDQ graph is prepared by the QNN EP on this host
(the real graph preparer: preparation wall/CPU seconds) and then executed on the x86 HTP simulator
with QNN profiling at `detailed` ("Accelerator (execute) time (cycles)" per run). The simulator's
cycles are its model of the HTP, not a phone measurement; they compare levels on one graph.

    python bench/experiments/htp_level_cycles.py BUNDLE/qdq/token_ar1_cl512_1_of_1.onnx [--runs 3]

Writes bench/results/htp_level_cycles.json (with the load average: this machine is shared).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]    # bench/
RESULT = ROOT / "results" / "htp_level_cycles.json"
sys.path.insert(0, str(ROOT.parent / "src"))

_DTYPES = {1: np.float32, 6: np.int32, 7: np.int64, 10: np.float16}


def _feeds(model_path: Path) -> dict[str, np.ndarray]:
    import onnx
    m = onnx.load(str(model_path), load_external_data=False)
    out = {}
    for i in m.graph.input:
        t = i.type.tensor_type
        out[i.name] = np.zeros([d.dim_value for d in t.shape.dim], _DTYPES[t.elem_type])
    return out


def _child_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(model_path: Path, level: int, runs: int, soc: str) -> dict:
    import onnxruntime as ort

    from modelexport.core.targets import get_target
    from modelexport.profiling.qnn_csv import read_qnn_csv
    from modelexport.toolchain.htp_options import compile_provider_options
    from modelexport.toolchain.ort_qnn import SessionPlan, session_options
    work = Path(tempfile.mkdtemp(prefix=f"level{level}-"))
    csv_path = work / "qnn.csv"
    opts = compile_provider_options(get_target(soc), None, level) | {
        "profiling_level": "detailed", "profiling_file_path": str(csv_path)}
    so = session_options(SessionPlan(provider_options=opts, disable_cpu_fallback=False))
    feeds = _feeds(model_path)
    cpu0, t0 = _child_cpu_s(), time.perf_counter()
    sess = ort.InferenceSession(str(model_path), sess_options=so)
    prep_wall, prep_cpu = time.perf_counter() - t0, _child_cpu_s() - cpu0
    sess.run(None, feeds)   # warm-up
    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        walls.append(time.perf_counter() - t)
    del sess
    prof = read_qnn_csv(csv_path)
    cycles = [r.accel_cycles for r in prof.runs if r.accel_cycles is not None]
    return {"level": level, "prepare_wall_s": round(prep_wall, 1), "prepare_cpu_s": round(prep_cpu, 1),
            "simulator_run_wall_s": [round(w, 2) for w in walls],
            "accelerator_cycles_per_run": cycles, "accelerator_cycles_median": int(np.median(cycles)) if cycles else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="a QDQ graph of a compiled bundle (BUNDLE/qdq/*.onnx)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--soc", default="SM8650")
    ap.add_argument("--levels", default="1,2,3")
    ap.add_argument("--label", default=None, help="the entry's key in the results file (default: the graph's name)")
    args = ap.parse_args()
    load_start = os.getloadavg()
    rows = [measure(args.model, int(lv), args.runs, args.soc) for lv in args.levels.split(",")]
    for r in rows:
        print(json.dumps(r), flush=True)
    entry = {"graph": args.model.name, "soc": args.soc, "runs": args.runs, "levels": rows,
             "host": {"cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in load_start],
                      "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]},
             "note": "preparation here is one graph alone (no weight sharing); the bundle's device pair prepares "
                     "ar1 + ar32 together in one process"}
    results = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    results[args.label or args.model.stem] = entry
    RESULT.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
