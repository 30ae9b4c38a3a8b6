"""Per-process CPU and memory of a running process tree, sampled from /proc (Linux): which process
(the parent, each quantization or compile worker) spent how many CPU seconds, and when it lived.

    python bench/process_cpu_sampler.py PID OUT.json [--every 0.5]

Runs until PID exits; writes {pid: {cmd, first_s, last_s, cpu_s, peak_rss_gb}} with times from the
sampler's start, so a process lines up with the compile's progress lines (their `[  t s]` stamps).
A process's CPU is its utime + stime at its last sample (threads included), so a process that lives
less than one interval is missed: the compile's workers live for seconds to minutes.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children(p)
    return seen


def sample(pid: int) -> tuple[float, int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK       # utime + stime
        rss = int(fields[21]) * PAGE
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
        return cpu, rss, cmd
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    root, out = int(sys.argv[1]), Path(sys.argv[2])
    every = float(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else 0.5
    t0 = time.time()
    procs: dict[int, dict] = {}
    while Path(f"/proc/{root}").exists():
        now = round(time.time() - t0, 2)
        for p in tree(root):
            s = sample(p)
            if s is None:
                continue
            rec = procs.setdefault(p, {"cmd": s[2], "first_s": now, "peak_rss_gb": 0.0})
            rec.update(last_s=now, cpu_s=round(s[0], 2))
            rec["peak_rss_gb"] = max(rec["peak_rss_gb"], round(s[1] / 2**30, 2))
        time.sleep(every)
    out.write_text(json.dumps({"sampler_start_epoch": t0, "processes": procs}, indent=1))


if __name__ == "__main__":
    main()
