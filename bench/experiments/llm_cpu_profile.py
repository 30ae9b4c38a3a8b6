"""Where a decode step's time goes: our CPU program and llama.cpp on the same Q4_1 GGUF, by `perf`.

Each engine runs in its own process: it loads, prefills the bench prompt, decodes a few warm-up
steps, then `perf record` attaches to it for `--steps` decode steps only (no load, no prefill in
the samples). The samples are grouped by what the symbol does (`CATEGORIES`: the Q4_1 layer
matmuls, the Q8_0 lm_head, attention, the thread pool's waiting, ...), at each `--threads`.
Shares of samples, not times: on a shared host the wall time moves with the load, the split of
one process's CPU time much less. Needs `perf` (linux-tools) and the llama.cpp venv of
bench/llm_cpu_decode.py.

    .venv/bin/python bench/experiments/llm_cpu_profile.py [--pte model.pte] [--threads 1 2] [--steps 200]
writes bench/results/llm_cpu_profile.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]    # bench/: results/ and the sibling llm_cpu_decode.py
sys.path.insert(0, str(HERE))
from llm_cpu_decode import CACHE, GGUF, LLAMACPP_PY, PROMPT  # noqa: E402

RESULTS = HERE / "results" / "llm_cpu_profile.json"

# (category, regex over "dso symbol"), first match wins; the rest is "other"
CATEGORIES = [
    ("linear Q4_1 (layers)", r"PairQ4|ggml_vec_dot_q4_1_q8_1"),
    ("linear Q8_0 (lm_head)", r"PairQ8|ggml_vec_dot_q8_0_q8_0"),
    ("linear, other parts", r"rows_avx2|rows_generic|parallel_chunks|linear_q4_out|swiglu|ggml_compute_forward_mul_mat"),
    ("activation quantize, norm, epilogue", r"run_q4|quantize_row|rms_norm|expf|ggml_compute_forward_rms_norm|"
                                            r"ggml_compute_forward_(swiglu|silu|glu)|ggml_vec_swiglu|ggml_vec_silu|"
                                            r"ggml_compute_forward_(add|mul)\b|ggml_vec_(add|mul)"),
    ("attention", r"attend_|sdpa|ggml_compute_forward_(flash_attn|soft_max)|ggml_vec_dot_f16|ggml_vec_mad"),
    ("rope, KV-cache copies", r"xnn|XNN|Xnnpack|update_cache|rope|ggml_compute_forward_(rope|cpy|set_rows|dup)"),
    ("thread pool wait and wake", r"thread_main|pthreadpool|libgomp|ggml_barrier|ggml_graph_compute_thread|"
                                  r"futex|finish_task_switch|_raw_spin|schedule|sched_yield|syscall"),
    ("runtime: ExecuTorch / ggml graph", r"libexecutorch|ggml_graph_compute|ggml_backend|llama_|libllama|libggml"),
    ("python, numpy, logits copy", r"libpython|numpy|_multiarray|memmove|memcpy"),
]

OURS = r"""
import sys, time
from modelexport.llm.cpu.session import ExecuTorchSession
import torch
pte, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = ExecuTorchSession(pte, threads=threads)
m = s.module
ids = [int(t) for t in sys.argv[4].split(",")]
m.forward((torch.tensor([ids]), torch.tensor([0])), False)
tok, pos = torch.tensor([[ids[-1]]]), len(ids)
for _ in range(8):                        # warm-up
    m.forward((tok, torch.tensor([pos])), False); pos += 1
print("READY", flush=True); sys.stdin.readline()
t0 = time.perf_counter()
for _ in range(steps):
    m.forward((tok, torch.tensor([pos])), False); pos += 1
print("DONE", (time.perf_counter() - t0) / steps, flush=True)
"""

LLAMACPP = r"""
import sys, time
from llama_cpp import Llama
gguf, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ids = [int(t) for t in sys.argv[4].split(",")]
llm = Llama(model_path=gguf, n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
llm.eval(ids)
tok = ids[-1]
for _ in range(8):
    llm.eval([tok])
print("READY", flush=True); sys.stdin.readline()
t0 = time.perf_counter()
for _ in range(steps):
    llm.eval([tok])
print("DONE", (time.perf_counter() - t0) / steps, flush=True)
"""


def profile(cmd: list[str], out_dir: Path, tag: str) -> dict:
    """Run `cmd` (one of the scripts above), record its decode steps, and group the samples."""
    data = out_dir / f"{tag}.data"
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("READY"):
            break
    else:
        raise SystemExit(f"{tag}: the engine did not start ({p.wait()})")
    perf = subprocess.Popen(["perf", "record", "-F", "2000", "-p", str(p.pid), "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    load0 = os.getloadavg()[0]
    p.stdin.write("go\n")
    p.stdin.flush()
    step_s = next(float(l.split()[1]) for l in p.stdout if l.startswith("DONE"))
    perf.send_signal(signal.SIGINT)
    perf.wait()
    p.wait()
    rep = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", "dso,sym", "-F", "overhead,dso,sym",
                          "--percent-limit", "0"], capture_output=True, text=True).stdout
    shares: dict[str, float] = {}
    top = []
    for line in rep.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*)", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3)
        text = f"{dso} {sym}"
        cat = next((c for c, rx in CATEGORIES if re.search(rx, text)), "other")
        shares[cat] = shares.get(cat, 0.0) + pct
        top.append({"percent": pct, "dso": dso, "symbol": sym[:120], "category": cat})
    return {"wall_ms_per_step": round(step_s * 1e3, 2), "loadavg_1min": round(load0, 2),
            "shares_percent": {k: round(v, 1) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])},
            "top_symbols": sorted(top, key=lambda t: -t["percent"])[:15]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pte", type=Path, help="our program (default: the cached build of bench/llm_cpu_decode.py)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (apt-get install linux-tools-generic)")
    from modelexport.llm.cpu.export import CpuExportOptions, build_cached
    pte = a.pte
    if pte is None:
        entry, _, _ = build_cached(GGUF, CpuExportOptions(quant="8da4w"), cache_dir=CACHE)
        pte = entry / "model.pte"
    from modelexport.llm.cpu.session import ExecuTorchSession  # noqa: F401  (fail here, not in the child)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(Path(pte).parent))
    ids = ",".join(str(i) for i in tok(PROMPT)["input_ids"])
    result = {"bench": "llm_cpu_profile", "model": GGUF.name, "pte": str(pte), "steps": a.steps,
              "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "engines": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.threads:
            result["engines"][f"modelexport/{n}t"] = profile(
                [sys.executable, "-c", OURS, str(pte), str(n), str(a.steps), ids], Path(tmp), f"ours{n}")
            if not a.skip_llamacpp and LLAMACPP_PY.exists():
                result["engines"][f"llamacpp/{n}t"] = profile(
                    [str(LLAMACPP_PY), "-c", LLAMACPP, str(GGUF), str(n), str(a.steps), ids], Path(tmp), f"llama{n}")
    result["loadavg_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    for k, v in result["engines"].items():
        print(k, v["wall_ms_per_step"], "ms/step at load", v["loadavg_1min"], v["shares_percent"])
    print("wrote", a.out)


if __name__ == "__main__":
    main()
