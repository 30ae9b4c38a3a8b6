"""Does the HTP simulator use this host's two cores? Compile's own LLM check (one arN call and one
ar1 step on the host twins) timed left free, held on one core, and as two processes held on one
core each at the same time.

If one core is nearly as fast as two, the simulator's threads mostly wait on each other, and two
checks (or the two halves of one) could run side by side; if it takes twice as long, they cannot.

usage: python bench/experiments/sim_threads_llm.py BUNDLE [--tokens 33]
Writes bench/results/sim_threads_llm.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]    # bench/
OUT = ROOT / "results" / "sim_threads_llm.json"


def one(bundle: str, core: int | None, tokens: int) -> dict:
    """In this process: the check window's tokens through the bundle's host twins on the simulator."""
    from modelexport.backends.llm_qnn.self_check import run_window
    from modelexport.contract import open_bundle
    if core is not None:
        os.sched_setaffinity(0, {core})          # the simulator's threads inherit it
    b = open_bundle(bundle)
    ids = list(range(1000, 1000 + tokens))
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    _, calls = run_window(b, "htp-sim", b.manifest.targets[0], ids)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"core": core, "tokens": tokens, "calls": calls, "wall_s": round(time.perf_counter() - t0, 1),
            "cpu_s": round(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, 1)}


def spawn(bundle: str, core: int | None, tokens: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, bundle, "--tokens", str(tokens), "--one",
                             "free" if core is None else str(core)], stdout=subprocess.PIPE, text=True)


def collect(procs: list[subprocess.Popen]) -> list[dict]:
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=33)
    ap.add_argument("--one", help="internal: run one window in this process (free or a core number)")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.bundle, None if args.one == "free" else int(args.one), args.tokens)))
        return
    t0 = time.perf_counter()
    free = collect([spawn(args.bundle, None, args.tokens)])[0]
    pinned = collect([spawn(args.bundle, 0, args.tokens)])[0]
    pair_t0 = time.perf_counter()
    pair = collect([spawn(args.bundle, 0, args.tokens), spawn(args.bundle, 1, args.tokens)])
    pair_wall = round(time.perf_counter() - pair_t0, 1)
    result = {"bundle": args.bundle, "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
              "free": free, "one_core": pinned, "two_side_by_side": {"runs": pair, "wall_s": pair_wall},
              "one_core_vs_free": round(pinned["wall_s"] / free["wall_s"], 2),
              "two_side_by_side_vs_two_free_in_turn": round(pair_wall / (2 * free["wall_s"]), 2),
              "seconds": round(time.perf_counter() - t0, 1)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
