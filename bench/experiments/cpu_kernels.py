"""The CPU runtime's own kernels against the ones they replace, side by side in one run, on
SmolLM2-135M 8da4w programs that differ only in that op:

- `--option attention`: our `modelexport::sdpa` (llm/native/sdpa.cpp) vs ExecuTorch's
  `llama::custom_sdpa` → bench/results/attention_kernel.json;
- `--option linear`: our `modelexport::linear_q4` (llm/native/linear_q4.cpp) vs XNNPACK's
  block-4-bit GEMM (qd8-f32-qb4w) → bench/results/linear_kernel.json.

For each cache position P: prefill to P, then time 32 decode steps at P..P+31; 3 rounds,
programs interleaved, median step time per program, and the ratio. Also the greedy tokens of
both programs for the decode bench's prompt (8da4w SmolLM2 is chaotic under float rounding:
they part early even for the same arithmetic; perplexity is left to `llm_cpu_decode.py`).

    .venv/bin/python bench/experiments/cpu_kernels.py --option attention|linear [--positions 32,128,512,1024,2000] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent           # bench/: results/ and the sibling llm_cpu_decode.py
# option → (ours, theirs, results file)
OPTIONS = {"attention": ("native", "executorch", "attention_kernel.json"),
           "linear": ("native", "xnnpack", "linear_kernel.json")}
STEPS = 32
ROUNDS = 3


def step_ms(session, position: int) -> float:
    """Median decode step time at positions position..position+STEPS-1 (cache filled before)."""
    if session.position < position:
        filler = [(i * 7919) % 40000 + 100 for i in range(position - session.position)]
        session.feed(filler)
    session.rewind(position)
    times = []
    for i in range(STEPS):
        t = time.perf_counter()
        session.feed([300 + i])
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", default="32,128,512,1024,2000")
    ap.add_argument("--option", choices=sorted(OPTIONS), required=True)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    ours, theirs, results_name = OPTIONS[a.option]
    out_path = a.out or BENCH / "results" / results_name
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sys
    sys.path.insert(0, str(BENCH))
    from llm_cpu_decode import CACHE, GGUF, PROMPT, THREADS

    import modelexport.llm as llm
    from modelexport.llm.cpu.session import ExecuTorchSession
    from modelexport.llm.cpu.export import CpuExportOptions, build_cached

    programs, result = {}, {"bench": results_name[:-5], "option": a.option, "model": GGUF.name, "threads": THREADS,
                            "steps_per_position": STEPS, "rounds": ROUNDS,
                            "host": {"cpus": os.cpu_count(), "machine": platform.machine(),
                                     "loadavg_start": os.getloadavg()}}
    for kernel in (ours, theirs):
        entry, meta, hit = build_cached(GGUF, CpuExportOptions(**{a.option: kernel}), cache_dir=CACHE)
        programs[kernel] = ExecuTorchSession(entry / meta["pte"], threads=THREADS)
        result.setdefault("build", {})[kernel] = {"cold_export_s": meta["export_seconds"], "this_run": "cache hit" if hit else "built now"}
    positions = [int(p) for p in a.positions.split(",")]
    for s in programs.values():
        step_ms(s, 8)   # warm-up: XNNPACK packs its weights on the first call
    runs: dict = {k: {p: [] for p in positions} for k in programs}
    for _ in range(ROUNDS):
        for p in positions:
            for k, s in programs.items():
                s.reset()
                runs[k][p].append(step_ms(s, p))
    result["decode_step_ms"] = {k: {str(p): round(statistics.median(v), 3) for p, v in per.items()} for k, per in runs.items()}
    speedup = f"speedup_{ours}_vs_{theirs}"
    result[speedup] = {str(p): round(result["decode_step_ms"][theirs][str(p)] / result["decode_step_ms"][ours][str(p)], 3)
                       for p in positions}
    # greedy agreement on the decode bench's prompt, 64 tokens
    tok = llm.load(GGUF, cache_dir=CACHE, threads=THREADS).tokenizer
    ids = tok.encode(PROMPT)
    outs = {}
    for k, s in programs.items():
        s.reset()
        logits, out = s.feed(ids), []
        for _ in range(64):
            t = int(logits.argmax())
            out.append(t)
            logits = s.feed([t])
        outs[k] = out
    same = next((i for i, (x, y) in enumerate(zip(outs[ours], outs[theirs])) if x != y), 64)
    result["greedy_agreement_tokens"] = {f"{ours}_vs_{theirs}": same, "of": 64}
    result["host"]["loadavg_end"] = os.getloadavg()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("decode_step_ms", speedup, "greedy_agreement_tokens")}, indent=1))
    print("wrote", out_path)


if __name__ == "__main__":
    main()
