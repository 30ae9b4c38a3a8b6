"""The LLM compile's context-binary jobs hand the host twins over while the shared binaries still
compile (backends/llm_qnn/ctx_compile.py). Fast: the jobs are plain functions in real worker processes."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import wait
from pathlib import Path
from types import SimpleNamespace

import pytest

from modelexport.backends.llm_qnn.ctx_compile import ContextCompile, job_order
from modelexport.core.cache import Cache
from modelexport.core.errors import InputError
from modelexport.toolchain.host_cores import one_host_core


def slow(job: dict) -> dict:
    time.sleep(job["sleep"])
    return {"entry": f"/nonexistent/{job['key']}", "meta": {"compile_seconds": job["sleep"]}, "hit": False,
            "ended": time.time()}


def refuse(job: dict) -> dict:
    raise InputError(f"{job['key']} is wrong", "give another one")


def _jobs(shared_sleep: float, twin_fn=slow) -> list:
    shared = [(slow, {"kind": "shared", "part": p, "target": "SM8650", "key": f"s{p}", "sleep": shared_sleep})
              for p in (1, 2)]
    twins = [(twin_fn, {"kind": "twin", "graph": f"g{i}", "target": "SM8650", "key": f"t{i}", "sleep": 0.1})
             for i in (1, 2)]
    return shared + twins


def _compile(jobs, timings):
    plan = SimpleNamespace(jobs=2, block_size=None)
    return ContextCompile(jobs, plan, Cache(Path("/nonexistent"), enabled=False), lambda *a: None, timings)


def test_the_workers_take_the_first_shared_binary_then_the_twins_then_the_rest():
    assert job_order(_jobs(0)) == [0, 2, 3, 1]
    in_parts = [(fn, {**j, "n_parts": 2}) for fn, j in _jobs(0)]      # the check outlasts the compile
    assert job_order(in_parts) == [2, 3, 0, 1]


def test_the_twins_come_back_while_a_shared_binary_still_compiles():
    timings: dict = {}
    with _compile(_jobs(4.0), timings) as c:
        early = c.twins()
        handed = time.time()
        assert early is not None
        twins, results = early
        assert [j["graph"] for _, j in twins] == ["g1", "g2"]
        jobs, all_results = c.results()
        assert not multiprocessing.active_children()                        # the workers ended with the jobs
    assert [j["key"] for _, j in jobs] == ["s1", "s2", "t1", "t2"]          # the caller's order
    assert all_results[2:] == results
    assert min(r["ended"] for r in all_results[:2]) > handed                  # both shared still ran then
    assert timings["compile_stage_s"] >= 4.0
    assert set(timings["context_binaries"]) == {"SM8650/decoder/shared_1", "SM8650/decoder/shared_2",
                                                "SM8650/decoder/twin_g1", "SM8650/decoder/twin_g2"}


def test_nothing_is_handed_early_when_every_job_has_ended_or_a_twin_failed():
    with _compile(_jobs(0.0), {}) as c:
        wait(c._all_futures())
        assert c.twins() is None            # nothing left to run beside a check
        assert len(c.results()[1]) == 4
    with _compile(_jobs(2.0, refuse), {}) as c:
        assert c.twins() is None
        with pytest.raises(InputError, match="t1 is wrong"):
            c.results()


def test_when_done_runs_once_every_job_has_ended():
    called: list[float] = []
    with _compile(_jobs(2.0), {}) as c:
        c.when_done(lambda: called.append(time.time()))
        assert not called
        c.results()
        time.sleep(0.2)                      # the pool's thread calls it
        assert len(called) == 1
        c.when_done(lambda: called.append(time.time()))   # all ended: called at once
        assert len(called) == 2


def test_one_host_core_holds_the_threads_started_inside_and_release_frees_them():
    allowed = os.sched_getaffinity(0)
    seen: dict[str, set] = {}
    with one_host_core(last=True) as held:
        assert os.sched_getaffinity(0) == {max(allowed)}
        go = threading.Event()
        t = threading.Thread(target=lambda: (seen.__setitem__("before", os.sched_getaffinity(0)), go.wait(10),
                                             seen.__setitem__("after", os.sched_getaffinity(0))))
        t.start()
        time.sleep(0.2)
        held.release()
        go.set()
        t.join()
    assert seen == {"before": {max(allowed)}, "after": allowed}
    assert os.sched_getaffinity(0) == allowed
