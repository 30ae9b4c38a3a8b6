"""Where a cold SmolLM2 compile's time goes, by stage and by process (issue 17: toward 2 minutes).

    python bench/experiments/llm_compile_profile.py [--work DIR] [--tag NAME] [--model smollm2|gemma3]   # a cold compile, profiled
    python bench/experiments/llm_compile_profile.py --from STDERR PROCS MANIFEST       # profile a run made elsewhere

The compile runs as a user runs it (`python -m modelexport compile GGUF --target SM8650 --variants ar1,ar32
--max-seq-len 512 --precision 16a4w_block`, a fresh cache); bench/process_cpu_sampler.py samples its
process tree from /proc. The stages are the progress lines' stamps (wall); each process's CPU seconds
and life span place it in them (the parent; the quantization workers; the context-binary workers).
The manifest's `timings` add what the parent measured itself (load, calibration, GPTQ moments and
rounding, export, quantization) and each context binary's compile seconds. Writes an entry of
bench/results/llm_compile_profile.json with the load average before and after: this host is shared.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]    # bench/: results/ and process_cpu_sampler.py
RESULT = ROOT / "results" / "llm_compile_profile.json"
STAMP = re.compile(r"^\[\s*([\d.]+) s\] (.*)$")


def stages(stderr: str) -> list[dict]:
    """The progress lines as stages: each from its stamp to the next line's."""
    lines = [(float(m.group(1)), m.group(2)) for m in map(STAMP.match, stderr.replace("\r", "\n").splitlines()) if m]
    return [{"stage": text, "from_s": t, "wall_s": round((lines[i + 1][0] if i + 1 < len(lines) else t) - t, 1)}
            for i, (t, text) in enumerate(lines)]


def processes(procs: dict, offset_s: float) -> list[dict]:
    """Each sampled process with its life on the compile's clock (sampler start + `offset_s`)."""
    out = []
    for pid, p in sorted(procs["processes"].items(), key=lambda kv: kv[1]["first_s"]):
        first, last = p["first_s"] + offset_s, p["last_s"] + offset_s
        role = ("parent" if "modelexport compile" in p["cmd"] else
                "worker" if "multiprocessing" in p["cmd"] or "spawn" in p["cmd"] else p["cmd"][:60])
        out.append({"pid": int(pid), "role": role, "from_s": round(first, 1), "to_s": round(last, 1),
                    "cpu_s": p["cpu_s"], "cores_busy": round(p["cpu_s"] / max(last - first, 0.5), 2),
                    "peak_rss_gb": p["peak_rss_gb"]})
    return out


def profile(stderr: str, procs: dict, manifest: dict, offset_s: float) -> dict:
    return {"stages": stages(stderr), "processes": processes(procs, offset_s), "timings": manifest.get("timings"),
            "weight_rounding": (manifest.get("llm") or {}).get("weight_rounding")}


# --model: the real GGUFs the compile is profiled on (zoo/assets.py names)
MODELS = {"smollm2": ("smollm2_gguf", "SmolLM2-135M Q4_1 GGUF"),
          "gemma3": ("gemma3_270m_gguf", "Gemma 3 270M (base) Q4_K_M GGUF, 262,144-token vocabulary")}


def run(work: Path, model: str) -> tuple[str, dict, dict, float]:
    from modelexport.zoo.assets import asset_path
    src = asset_path(MODELS[model][0])
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(work / f"cache_{int(time.time())}"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    out = work / "bundle"
    cmd = [sys.executable, "-m", "modelexport", "compile", str(src), "--target", "SM8650", "--variants", "ar1,ar32",
           "--max-seq-len", "512", "--precision", "16a4w_block", "-o", str(out), "--force"]
    err = work / "compile.err"
    with err.open("w") as f:
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=f)
        sampler = subprocess.Popen([sys.executable, str(ROOT / "process_cpu_sampler.py"), str(proc.pid),
                                    str(work / "procs.json")])
        rc = proc.wait()
        sampler.wait()
    if rc != 0:
        raise SystemExit(f"the compile failed (rc {rc}): {err.read_text()[-2000:]}")
    procs = json.loads((work / "procs.json").read_text())
    return err.read_text(), procs, json.loads((out / "manifest.json").read_text()), procs["sampler_start_epoch"] - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=None)
    ap.add_argument("--tag", default=None, help="the result's name (default: the model's)")
    ap.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    ap.add_argument("--from", dest="given", nargs=3, metavar=("STDERR", "PROCS", "MANIFEST"))
    ap.add_argument("--offset", type=float, default=0.0, help="with --from: the sampler's start on the compile's clock")
    a = ap.parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    if a.given:
        err, procs, manifest = Path(a.given[0]).read_text(), json.loads(Path(a.given[1]).read_text()), \
            json.loads(Path(a.given[2]).read_text())
        offset = a.offset
    else:
        work = Path(a.work or tempfile.mkdtemp(prefix="llm_profile_"))
        work.mkdir(parents=True, exist_ok=True)
        err, procs, manifest, offset = run(work, a.model)
    entry = {"options": f"{MODELS[a.model][1]}, SM8650, ar1 + ar32, cl 512, 16a4w_block (gptq), 2 workers",
             "host": {"cpus": os.cpu_count(), "load_avg_at_start": load_before,
                      "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]},
             **profile(err, procs, manifest, offset)}
    results = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    results[a.tag or a.model] = entry
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(results, indent=2))
    print(json.dumps(entry, indent=2))


if __name__ == "__main__":
    main()
