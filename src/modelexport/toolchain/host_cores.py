"""Holding the calling thread (and the threads it starts) on one host core.

The x86 HTP simulator runs a graph on a second thread that mostly waits for the first: left free it
took 148 CPU-s for 75 s of wall time on SmolLM2's check window, held on one core 87 CPU-s for 87 s
(bench/results/sim_threads_llm.json). Held, it leaves the other core to work running beside it, and
its cycle counts move less (profiling/ort_profile.py)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


class one_host_core:   # noqa: N801 - used as a context manager, like contextlib's
    """`with one_host_core() as held:` this thread on one of its allowed cores (the lowest, or with
    `last` the highest); threads it starts meanwhile inherit that. `held.release()` (any thread may
    call it) and the end of the block give every thread of the process its cores back."""

    def __init__(self, last: bool = False):
        self.allowed = os.sched_getaffinity(0)
        self.core = max(self.allowed) if last else min(self.allowed)

    def __enter__(self) -> one_host_core:
        os.sched_setaffinity(0, {self.core})        # pid 0: this thread only
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        for tid in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError, ValueError):   # a thread that ended meanwhile
                os.sched_setaffinity(int(tid.name), self.allowed)
