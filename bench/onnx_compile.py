"""Benchmark the ONNX → QNN path on the real MobileNetV2 (ImageNet weights).

Measures (each CLI command in a fresh process, as a user runs it):
- compile 8a8w for SM8650: wall time and peak RSS, cold (empty cache) vs cached (same inputs);
- 4 targets in one command vs 4 separate commands (both without the cache);
- the HTP simulator's load and run time;
- SQNR / cosine / top-1 agreement of each precision against the float model (verify).
Writes bench/results/onnx_compile.json. Timings on this x86 host say nothing about a phone.
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
from pathlib import Path


from cli_measure import measured_cli

ROOT = Path(__file__).resolve().parent
RESULT = ROOT / "results" / "onnx_compile.json"
TARGETS4 = ["SM8550", "SM8650", "SM8750", "SM8850"]
PRECISIONS = ["fp16", "8a8w", "16a8w", "16a16w", "16a4w"]

def cli(work: Path, *args: str, cache: Path | None = None) -> dict:
    env = dict(os.environ)
    if cache is not None:
        env["MODELEXPORT_CACHE_DIR"] = str(cache)
    return measured_cli(list(args), env)


def rounded(d: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items() if k != "stdout"}


def main() -> None:
    from modelexport.zoo.imagenet import save_sample_photos
    from modelexport.zoo.mobilenet_v2 import export_onnx
    work = Path(tempfile.mkdtemp(prefix="bench-onnx-"))
    model = export_onnx(work / "mobilenet_v2.onnx")
    calib = work / "calib"
    images = sorted(save_sample_photos(calib))   # the same photos the tests calibrate and check on
    res: dict = {"model": "MobileNetV2 (torchvision ImageNet weights), 1x3x224x224, exported with torch.onnx (TorchScript)",
                 "calibration": f"{len(images)} real photos ({', '.join(images)})",
                 "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_at_start": os.getloadavg()}}
    base = ["compile", str(model), "--precision", "8a8w", "--calibration", str(calib), "--json"]

    cache = work / "cache"
    cold = cli(work, *base, "-o", str(work / "cold"), "-t", "SM8650", cache=cache)
    warms = [cli(work, *base, "-o", str(work / f"warm{i}"), "-t", "SM8650", cache=cache) for i in range(3)]
    warm = sorted(warms, key=lambda r: r["wall_s"])[1]          # the median of three
    res["compile_8a8w_sm8650"] = {
        "cold": rounded(cold), "cached": rounded(warm), "cached_runs_wall_s": [round(w["wall_s"], 3) for w in warms],
        "cached_over_cold_wall": round(warm["wall_s"] / cold["wall_s"], 4),
        "cached_over_cold_in_process": round(warm["in_process_s"] / cold["in_process_s"], 4),
        "cold_timings": json.loads(cold["stdout"])["timings"], "cached_cache": json.loads(warm["stdout"])["cache"]}

    targets_args = [a for t in TARGETS4 for a in ("-t", t)]
    one = cli(work, *base, "-o", str(work / "four"), *targets_args, "--no-cache")
    sep = [cli(work, *base, "-o", str(work / f"sep-{t}"), "-t", t, "--no-cache") for t in TARGETS4]
    res["four_targets"] = {"targets": TARGETS4, "one_command": rounded(one),
                           "separate_commands_wall_s": round(sum(s["wall_s"] for s in sep), 3),
                           "separate": [rounded(s) for s in sep],
                           "htp_arch": json.loads(one["stdout"])["htp_arch"],
                           "speedup": round(sum(s["wall_s"] for s in sep) / one["wall_s"], 3)}

    run = cli(work, "run", str(work / "cold"), "-i", str(calib / "chelsea.npy"), "--repeat", "5", "--json")
    out = json.loads(run["stdout"])
    res["simulator_run"] = {"load_s": out["load_s"], "run_s": out["run_s"], "top1_chelsea": out["outputs"]["logits"]["argmax"],
                            "wall_s": round(run["wall_s"], 3)}

    res["precisions"] = {}
    for p in PRECISIONS:
        c = cli(work, "compile", str(model), "--precision", p, "--calibration", str(calib), "-o", str(work / f"p-{p}"),
                "-t", "SM8650", "--json", cache=cache)
        v = cli(work, "verify", str(work / f"p-{p}"), "--json", "--min-sqnr", "-100")
        o = json.loads(v["stdout"])["graphs"][0]["outputs"][0]
        binsize = sum(f["size"] for f in json.loads(c["stdout"])["files"] if f["path"].endswith(".bin"))
        res["precisions"][p] = {"sqnr_db": round(o["sqnr_db"], 2), "cosine": round(o["cosine"], 5),
                                "max_abs_error": round(o["max_abs_error"], 4), "top1_agreement": o["argmax_agreement"],
                                "samples": len(images), "compile_wall_s": round(c["wall_s"], 2), "binary_bytes": binsize}
    res["load_avg_at_end"] = os.getloadavg()
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULT.with_suffix(".json.partial")
    tmp.write_text(json.dumps(res, indent=2))
    os.replace(tmp, RESULT)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
