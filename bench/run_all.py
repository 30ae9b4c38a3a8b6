"""Run the benchmarks one after another (never side by side: they share 2 cores) → bench/results/*.json.

    python bench/run_all.py            # the quick ones (minutes each)
    python bench/run_all.py --all      # also the SmolLM2 exports (tens of minutes, several GB)
    python bench/run_all.py onnx_compile profile_cost    # by name

The other goal benchmarks in bench/ run by hand (each says how in its docstring); concluded one-off
experiments are in bench/experiments/ (README.md there), and none of them runs here.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent

# name → (script, heavy?, what it measures)
BENCHES: dict[str, tuple[str, bool, str]] = {
    "onnx_compile": ("onnx_compile.py", False, "MobileNetV2 compile cold/cached, 4 targets at once vs apart, SQNR per precision"),
    "profile_cost": ("profile_cost.py", False, "profiling overhead on the simulator; verify vs verify --per-layer"),
    "et_compile": ("et_compile.py", False, "ExecuTorch .pte lowering vs the plain ExecuTorch script"),
    "llm_vocab_pairs": ("llm_vocab_pairs.py", False, "tokenizer/model vocabulary checks on the bundled models"),
    "llm_cpu_decode": ("llm_cpu_decode.py", True, "SmolLM2 decode/prefill: modelexport CPU vs transformers vs llama.cpp"),
    "xnnpack_kernels": ("xnnpack_kernels.py", True, "XNNPACK matmul speed per weight layout on this CPU, and its SmolLM2 perplexity"),
    "llm_export": ("llm_export.py", True, "SmolLM2 → QNN context binaries: time, RSS, sizes, perplexity"),
}


def main(argv: list[str]) -> int:
    wanted = [a for a in argv if not a.startswith("-")]
    unknown = [w for w in wanted if w not in BENCHES]
    if unknown:
        print(f"unknown bench {', '.join(unknown)}; choose from: {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    names = wanted or [n for n, (_, heavy, _) in BENCHES.items() if "--all" in argv or not heavy]
    failed = []
    for name in names:
        script, _, what = BENCHES[name]
        print(f"== {name}: {what}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(HERE / script)])
        print(f"== {name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
