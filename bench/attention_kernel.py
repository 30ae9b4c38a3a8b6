"""The CPU runtime's attention: our kernel (`modelexport::sdpa`, llm/native/sdpa.cpp) against
ExecuTorch's `llama::custom_sdpa`, side by side in one run, on SmolLM2-135M 8da4w programs that
differ only in that op.

For each cache position P: prefill to P, then time 32 decode steps at P..P+31; 3 rounds,
programs interleaved, median step time per program, and the ratio. Also the greedy tokens of
both programs for the decode bench's prompt (they should agree: same arithmetic up to float
rounding) and each program's perplexity span check is left to `llm_cpu_decode.py`.

    .venv/bin/python bench/attention_kernel.py [--positions 32,128,512,1024,2000] [--out FILE]
writes bench/results/attention_kernel.json
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
RESULTS = HERE / "results" / "attention_kernel.json"
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
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sys
    sys.path.insert(0, str(HERE))
    from llm_cpu_decode import CACHE, GGUF, PROMPT, THREADS

    import modelexport.llm as llm
    from modelexport.llm.cpu_runtime import ExecuTorchSession
    from modelexport.llm.xnnpack_export import CpuExportOptions, build_cached

    programs, result = {}, {"bench": "attention_kernel", "model": GGUF.name, "threads": THREADS,
                            "steps_per_position": STEPS, "rounds": ROUNDS,
                            "host": {"cpus": os.cpu_count(), "machine": platform.machine(),
                                     "loadavg_start": os.getloadavg()}}
    for kernel in ("native", "executorch"):
        entry, meta, hit = build_cached(GGUF, CpuExportOptions(attention=kernel), cache_dir=CACHE)
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
    result["speedup_native_vs_executorch"] = {
        str(p): round(result["decode_step_ms"]["executorch"][str(p)] / result["decode_step_ms"]["native"][str(p)], 3)
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
    same = next((i for i, (x, y) in enumerate(zip(outs["native"], outs["executorch"])) if x != y), 64)
    result["greedy_agreement_tokens"] = {"native_vs_executorch": same, "of": 64}
    result["host"]["loadavg_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("decode_step_ms", "speedup_native_vs_executorch", "greedy_agreement_tokens")}, indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
