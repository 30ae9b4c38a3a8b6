"""How much the HTP simulator's cycle count moves between runs, left free and held on one core.

`--precision auto` ranks candidates by the simulator's accelerator cycles. On x86 those cycles come
from a simulator whose threads share the host's cores, so the count depends on what else runs. This
compiles one real model at 8a8w and fp16 and, in several fresh processes each, reads the cycles of
every run with the threads free (`profile_ort`) and held on one core, the fewest of five
(`steady_cycles`, what auto uses).

usage: python bench/experiments/sim_cycles_noise.py [--model mtcnn_pnet] [--processes 3]
Writes bench/results/sim_cycles_noise.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]    # bench/
OUT = ROOT / "results" / "sim_cycles_noise.json"


def one(model: str, precision: str) -> dict:
    """In this process: compile, then the cycles of 5 free runs and one steady_cycles reading."""
    import modelexport
    from modelexport.backends.ort_qnn.repair import load_repaired
    from modelexport.profiling import ort_profile
    from modelexport.zoo.real_onnx import get, model_path, real_inputs
    m = get(model)
    work = Path(tempfile.mkdtemp(prefix="cyc-"))
    loaded = load_repaired(model_path(m), dict(m.input_shapes) or None, dict(m.input_values) or None)
    calib = real_inputs(m, loaded.inputs[0].name, work / "speech") or "random"
    b = modelexport.compile(str(model_path(m)), output=work / "b", target="SM8650", precision=precision, calibration=calib,
                            input_shapes=dict(m.input_shapes) or None, input_values=dict(m.input_values) or None,
                            use_cache=False)
    free = ort_profile.profile_ort(b.path, runs=5, level="detailed").totals["qnn_accelerator_cycles_runs"]
    return {"free_runs": free, "steady": ort_profile.steady_cycles(b.path)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mtcnn_pnet")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--one", nargs=2)
    args = ap.parse_args()
    if args.one:
        print("@@ROW@@" + json.dumps(one(*args.one)))
        return
    rows = []
    for prec in ("8a8w", "fp16"):
        for i in range(args.processes):
            p = subprocess.run([sys.executable, __file__, "--one", args.model, prec], capture_output=True, text=True)
            row = json.loads(p.stdout.rpartition("@@ROW@@")[2].strip().splitlines()[0])
            rows.append({"precision": prec, "process": i, **row})
            print(prec, i, row, flush=True)
    summary = {}
    for prec in ("8a8w", "fp16"):
        free = [v for r in rows if r["precision"] == prec for v in r["free_runs"]]
        steady = [r["steady"] for r in rows if r["precision"] == prec]
        summary[prec] = {"free_min": min(free), "free_max": max(free), "free_spread": round(max(free) / min(free), 3),
                         "steady_min": min(steady), "steady_max": max(steady),
                         "steady_spread": round(max(steady) / min(steady), 3), "steady_median": statistics.median(steady)}
    load = os.getloadavg()
    OUT.write_text(json.dumps({"model": args.model, "target": "SM8650", "machine": {"cpus": os.cpu_count(), "loadavg_at_end": load},
                               "summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
