"""The linear kernels' weight streaming outside any program, this revision against another.

One decode step's worth of SmolLM2-135M Q4_1 projections (30 layers) and its Q8_0 head (96 MB of
blocks, random values, from DRAM) through `linear_q4.cpp`'s row functions (bench/experiments/native/
linear_stream.cpp), built with the kernels' own flags against this checkout's source and against
`--ref`'s; one thread and ExecuTorch's pool (2 threads here); plus the roof: the same bytes
loaded with nothing computed. Programs interleaved, `--rounds` rounds, best of 20 steps each,
median over rounds. The host's load average is recorded: on a shared host the absolute numbers
move, the ratios within a round less so.

    .venv/bin/python bench/experiments/linear_kernel_stream.py [--ref 8f6da3d] [--rounds 5] [--out FILE]
writes bench/results/linear_kernel_stream.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]        # the repository
KERNEL = "src/modelexport/llm/cpu/kernels/linear_q4.cpp"
HEADER = "src/modelexport/llm/cpu/kernels/kernel_common.h"
PARTS = {"layers_q4_1": 1, "head_q8_0": 2, "roof_read_only": 3}
POOLS = {"one_thread": 0, "pool": 1}


def build(src_dir: Path, out: Path) -> Path:
    from modelexport.llm.cpu.kernels import LINK, _executorch_dirs, compile_flags
    inc, lib, torch_inc = _executorch_dirs()
    flags = [f for f in compile_flags() if f not in ("-shared", "-fPIC")]
    cmd = ["g++", *flags, f'-DKERNEL_SOURCE="{src_dir / "linear_q4.cpp"}"', f"-I{inc}",
           f"-I{inc}/executorch/runtime/core/portable_type/c10", "-idirafter", str(torch_inc),
           str(HERE / "native" / "linear_stream.cpp"), f"-L{lib}", *[f"-l{n}" for n in LINK], f"-Wl,-rpath,{lib}",
           "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def checkout(ref: str | None, into: Path) -> Path:
    into.mkdir(parents=True)
    for path in (KERNEL, HEADER):
        text = (ROOT / path).read_bytes() if ref is None else subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:{path}"], check=True, capture_output=True).stdout
        (into / Path(path).name).write_bytes(text)
    return into


def run(binary: Path, part: int, pool: int) -> float:
    p = subprocess.run([str(binary), "20", str(part), str(pool)], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["gb_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default="8f6da3d", help="the revision to compare with (its linear_q4.cpp)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "linear_kernel_stream.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        bins = {"this": build(checkout(None, t / "this"), t / "this.bin"),
                a.ref: build(checkout(a.ref, t / "ref"), t / "ref.bin")}
        result = {"bench": "linear_kernel_stream", "ref": a.ref, "rounds": a.rounds, "cpus": os.cpu_count(),
                  "loadavg_start": os.getloadavg(), "gb_per_s": {}}
        raw: dict = {}
        for _ in range(a.rounds):
            for part_name, part in PARTS.items():
                for pool_name, pool in POOLS.items():
                    for name, b in bins.items():
                        if part == 3 and name != "this":
                            continue          # the roof does not depend on the kernel
                        raw.setdefault(f"{part_name}/{pool_name}/{name}", []).append(run(b, part, pool))
        result["gb_per_s"] = {k: round(statistics.median(v), 2) for k, v in raw.items()}
        result["raw_gb_per_s"] = raw
        result["loadavg_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["gb_per_s"], indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
