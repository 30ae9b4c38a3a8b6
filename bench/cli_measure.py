"""Run one `modelexport` CLI command in a fresh process, as a user does, and measure it: wall time,
time inside main(), and peak RSS of the process and of its children (the compile pool)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_WRAPPER = """
import json, resource, sys, time
from modelexport.cli.main import main
t = time.perf_counter(); rc = main(sys.argv[2:]); dt = time.perf_counter() - t
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so it would report the bench's own size
ru_self = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
ru_kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
# CPU seconds of the process and its children: less sensitive than wall time to a host shared with others
cpu = sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
open(sys.argv[1], "w").write(json.dumps({"rc": rc, "in_process_s": dt, "cpu_s": cpu, "peak_rss_mb": ru_self / 1024,
                                         "peak_child_rss_mb": ru_kids / 1024}))
sys.exit(rc)
"""


def measured_cli(args: list[str], env: dict | None = None) -> dict:
    """{rc, in_process_s, cpu_s, peak_rss_mb, peak_child_rss_mb, wall_s, stdout}; exits with the command's
    output if it fails."""
    with tempfile.TemporaryDirectory(prefix="mx-bench-cli-") as tmp:
        stats = Path(tmp) / "stats.json"
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _WRAPPER, str(stats), *args], capture_output=True, text=True,
                              env=env if env is not None else dict(os.environ))
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise SystemExit(f"modelexport {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        s = json.loads(stats.read_text())
    return {**s, "wall_s": wall, "stdout": proc.stdout}
