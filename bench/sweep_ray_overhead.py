"""The cost of running `modelexport sweep` on Ray instead of the local runner, on the same matrix.

Matrix: the test's tiny models (two ONNX convs, a PyTorch MLP) plus MobileNetV2 (ONNX, ImageNet
weights) so some cells do real work; SM8650 + SM8750, fp16 + 8a8w: 16 cells. Both runners get 2
slots (local: 2 spawned processes; Ray: a local instance started here with `ray.init(num_cpus=2)`).

- cold: each runner with its own empty compile cache (every cell compiles);
- warm: the same again with `force` on the filled cache (every cell is a bundle-memo copy + the
  rename): what is left is the runner's own overhead.
Rounds alternate local / Ray. Wall time ratio Ray / local; Ray's start-up (`ray.init`) is reported
apart. Writes bench/results/sweep_ray_overhead.json, with the load average at start and end
(this is a shared 2-core host: judge the ratios by it).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULT = ROOT / "results" / "sweep_ray_overhead.json"
sys.path.insert(0, str(ROOT.parent / "tests"))
WARM_ROUNDS = 3


def build_matrix(work: Path) -> Path:
    from et_models import MLP, write
    from onnx_models import conv_relu

    from modelexport.zoo.mobilenet_v2 import export_onnx
    conv_relu(work / "conv8.onnx")
    conv_relu(work / "conv4.onnx", channels=4)
    write(work, "mlp", MLP)
    export_onnx(work / "mobilenet_v2.onnx")
    (work / "matrix.yaml").write_text(
        "models:\n"
        "  - {path: conv8.onnx, calibration: random}\n"
        "  - {path: conv4.onnx, calibration: random}\n"
        "  - {path: mlp.py:build, calibration: random}\n"
        "  - {path: mobilenet_v2.onnx, calibration: random}\n"
        "targets: [SM8650, SM8750]\nprecisions: [fp16, 8a8w]\n")
    return work / "matrix.yaml"


def timed_sweep(matrix: Path, out: Path, cache: Path, ray: str | None, force: bool) -> dict:
    import modelexport
    os.environ["MODELEXPORT_CACHE_DIR"] = str(cache)
    t0 = time.perf_counter()
    res = modelexport.sweep(matrix, out, force=force, workers=2 if ray is None else None, ray=ray)
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 3), "summary": res["summary"],
            "cells": {f"{r['model']}/{r['target']}/{r['precision']}": {k: r.get(k) for k in ("status", "bytes", "htp_share", "sqnr_db")}
                      for r in res["cells"]}}


def main() -> None:
    import ray
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    matrix = build_matrix(work)
    res: dict = {"matrix": matrix.read_text(), "cells": 16, "slots": 2,
                 "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "ray": ray.__version__,
                             "load_avg_at_start": os.getloadavg()}}
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 2**20)
    res["ray_init_s"] = round(time.perf_counter() - t0, 3)
    try:
        cold_local = timed_sweep(matrix, work / "local", work / "cache-local", None, False)
        cold_ray = timed_sweep(matrix, work / "ray", work / "cache-ray", "auto", False)
        res["cold"] = {"local_wall_s": cold_local["wall_s"], "ray_wall_s": cold_ray["wall_s"],
                       "ray_over_local": round(cold_ray["wall_s"] / cold_local["wall_s"], 3),
                       # bytes aside: ONNX Runtime names each EPContext partition with a per-process hash
                       "same_status_share_sqnr": all({k: v for k, v in a.items() if k != "bytes"} ==
                                                     {k: v for k, v in cold_ray["cells"][c].items() if k != "bytes"}
                                                     for c, a in cold_local["cells"].items()),
                       "max_bytes_difference": max(abs((a["bytes"] or 0) - (cold_ray["cells"][c]["bytes"] or 0))
                                                   for c, a in cold_local["cells"].items()),
                       "local_summary": cold_local["summary"], "ray_summary": cold_ray["summary"]}
        warm = {"local": [], "ray": []}
        for _ in range(WARM_ROUNDS):
            warm["local"].append(timed_sweep(matrix, work / "local", work / "cache-local", None, True)["wall_s"])
            warm["ray"].append(timed_sweep(matrix, work / "ray", work / "cache-ray", "auto", True)["wall_s"])
        med = {k: sorted(v)[len(v) // 2] for k, v in warm.items()}
        res["warm_force_on_filled_cache"] = {"local_wall_s": warm["local"], "ray_wall_s": warm["ray"],
                                             "median_local_s": med["local"], "median_ray_s": med["ray"],
                                             "ray_over_local": round(med["ray"] / med["local"], 3)}
        res["cells_table"] = cold_local["cells"]
    finally:
        ray.shutdown()
    res["machine"]["load_avg_at_end"] = os.getloadavg()
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("ray_init_s", "cold", "warm_force_on_filled_cache")}, indent=2))


if __name__ == "__main__":
    main()
