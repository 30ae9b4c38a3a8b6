"""What of an LLM compile's memory is the model's own (anonymous) and what is its checkpoint mapped
from disk (file-backed pages the kernel can drop and read again), by progress stage: the process
tree's RssAnon and RssFile from /proc, sampled every 0.3 s.

Question: does a bf16 Hugging Face checkpoint's compile hold its weights in memory of its own, as
llm/job_estimate.py counted them (the model, plus the checkpoint's pages while it is read)?

    .venv/bin/python bench/experiments/llm_memory_kinds.py FOLDER [--out bench/results/llm_memory_kinds.json]

FOLDER: a bf16 HF folder (the result's was a Llama-3.2-1B-shaped one: random weights, 1.24 B
parameters, written with transformers' save_pretrained); it is compiled cold (--no-cache) with the
defaults into a temporary bundle.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

OUT = Path(__file__).resolve().parents[1] / "results" / "llm_memory_kinds.json"


def rss(pid: int) -> dict:
    d = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon", "RssFile")):
                    k, v = line.split(":")
                    d[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return d


def gb(b: int) -> float:
    return round(b / 2**30, 2)


def sample(cmd: list[str]) -> dict:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stage = {"line": "(start)"}
    peaks: dict[str, dict] = {}

    def watch() -> None:
        while proc.poll() is None:
            try:
                procs = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                break
            tree = [rss(p.pid) for p in procs]
            e = peaks.setdefault(stage["line"], {"tree_anon": 0, "tree_file": 0, "parent_anon": 0, "parent_file": 0})
            e["tree_anon"] = max(e["tree_anon"], sum(d.get("RssAnon", 0) for d in tree))
            e["tree_file"] = max(e["tree_file"], sum(d.get("RssFile", 0) for d in tree))
            e["parent_anon"] = max(e["parent_anon"], tree[0].get("RssAnon", 0))
            e["parent_file"] = max(e["parent_file"], tree[0].get("RssFile", 0))
            time.sleep(0.3)
    threading.Thread(target=watch, daemon=True).start()
    t0 = time.time()
    for line in proc.stdout:
        if line.startswith("["):
            stage["line"] = line.rstrip().split("] ", 1)[-1][:60]
    proc.wait()
    stages = {k: {kk: gb(vv) for kk, vv in v.items()} for k, v in peaks.items()}
    return {"wall_s": round(time.time() - t0, 1), "rc": proc.returncode, "stages_gb": stages,
            "peak_tree_anon_gb": max(v["tree_anon"] for v in stages.values()),
            "peak_tree_file_gb": max(v["tree_file"] for v in stages.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="memory-kinds-"))
    load0 = os.getloadavg()
    try:
        cmd = [sys.executable, "-m", "modelexport", "compile", args.folder, "-o", str(out / "b"), "--no-cache"]
        result = {"source": args.folder, "command": "modelexport compile FOLDER -o OUT --no-cache (defaults)",
                  **sample(cmd), "host": {"cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in load0],
                                          "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
