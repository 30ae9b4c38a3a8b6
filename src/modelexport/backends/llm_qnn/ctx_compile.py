"""The context-binary jobs of one LLM compile, in worker processes, ordered for compile's numerics check.

The check reads the host twins only, so the twins come early (job_order): `twins()` hands them over
as soon as they are compiled, and the check runs on the simulator while the workers go on with the
shared binaries; `results()` waits for the rest, and the workers end then. Everything cached: the jobs are read here,
without a child process, and there is nothing to overlap.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import as_completed
from pathlib import Path

from ...core.cache import Cache
from ...core.errors import ModelExportError, ToolchainError
from ...core.targets import get_target
from ...llm.export.plan import LlmPlan
from ...quant.block_weights import DEFAULT_BLOCK
from ...toolchain.worker_pool import WorkerPool, raise_first_error, run_jobs
from ..ort_qnn import worker as ort_qnn_worker
from .ctx_jobs import SHARED_NAMESPACE, simulator_smoke_run

NAMESPACE = {"shared": SHARED_NAMESPACE, "twin": ort_qnn_worker.CACHE_NAMESPACE}


def job_order(jobs: list) -> list[int]:
    """The jobs' indexes in the order the workers take them. A decoder in one part: its shared binary
    first (the longest job: SmolLM2-135M's took 170 CPU-s, each twin 20), then the twins. In several
    parts the check outlasts the compile (a Llama-3.2-1B shape: 512 s against 314), so the twins first."""
    shared = [i for i, (_, j) in enumerate(jobs) if j["kind"] != "twin"]
    twins = [i for i, (_, j) in enumerate(jobs) if j["kind"] == "twin"]
    one_part = all(j.get("n_parts", 1) == 1 for _, j in jobs if j["kind"] != "twin")
    return shared[:1] + twins + shared[1:] if one_part else twins + shared


class ContextCompile:
    """`jobs` ((function, job) pairs, as compile.py's `_context_jobs` lists them): the cached ones read here
    at once, the others in up to `plan.jobs` workers."""

    def __init__(self, jobs: list, plan: LlmPlan, cache: Cache, say, timings: dict):
        self.jobs, self.plan, self.cache, self.say, self.timings = jobs, plan, cache, say, timings
        self._cached = [i for i, (_, j) in enumerate(jobs) if cache.get(NAMESPACE[j["kind"]], j["key"])]
        pending = len(jobs) - len(self._cached)
        self._pool = WorkerPool("the context-binary compile", min(pending, plan.jobs)) if pending else None
        self._said = 0
        self._smoked = False
        self._entries: list[Path] = []
        self._when_done: list = []
        self._lock = threading.Lock()
        say(f"compiling {len(jobs)} context binaries ({pending} not cached)", 2, 4)

    def __enter__(self) -> ContextCompile:
        if self._pool:
            self._pool.__enter__()
        self._t0 = time.perf_counter()
        self.ended_at = self._t0          # perf_counter() when the last job ended (the pool's thread sets it)
        self._hits = {i: _here(*self.jobs[i]) for i in self._cached}          # cache reads: no child process
        self._handles = {i: self._pool.submit(*self.jobs[i]) for i in job_order(self.jobs)
                         if i not in self._hits} if self._pool else {}
        self._futures = {i: self._pool.future(h) for i, h in self._handles.items()}
        for f in self._all_futures():
            f.add_done_callback(self._ended)
        return self

    def __exit__(self, *exc) -> None:
        if self._pool:
            pool, self._pool = self._pool, None
            pool.__exit__(*exc)

    def twins(self) -> tuple[list, list] | None:
        """(the twin jobs, their results) once every twin is compiled while other jobs still run; None when
        nothing would run beside the check (all cached, or every job ended) or a twin failed (results() says)."""
        idx = [i for i, (_, j) in enumerate(self.jobs) if j["kind"] == "twin"]
        futures = [self._futures[i] for i in idx if i in self._futures]
        for _ in as_completed(futures):
            self._progress()
        if any(f.exception() is not None for f in futures) or not self.running():
            return None
        results = [self._hits[i] if i in self._hits else self._futures[i].result() for i in idx]
        if any(isinstance(r, ModelExportError) for r in results):
            return None
        twins = [self.jobs[i] for i in idx]
        self._entries = [Path(r["entry"]) for r in results]
        self._smoke(twins, results)
        return twins, results

    def results(self) -> tuple[list, list]:
        """(jobs, results) in `jobs`' order, once all have ended (the workers end then: each holds about
        1 GB after a 1B model's binaries); the first failed job's error."""
        outcomes = self._pool.outcomes(lambda r: self._progress()) if self._pool else []
        self.__exit__(None, None, None)
        by_index = self._hits | {i: outcomes[h] for i, h in self._handles.items()}
        results = raise_first_error([by_index[i] for i in range(len(self.jobs))])
        self._entries = [Path(r["entry"]) for r in results]
        if not self._handles:
            self.ended_at = time.perf_counter()
        self.timings["compile_stage_s"] = round(self.ended_at - self._t0, 3)
        self.timings["context_binaries"] = _job_seconds(self.jobs, results)
        self._smoke(self.jobs, results)
        return self.jobs, results

    def entries(self) -> list[Path]:
        """The cache entries of the jobs handed over so far (temporary folders when the cache is off)."""
        return self._entries

    def running(self) -> bool:
        """Some job has not ended yet."""
        return not all(f.done() for f in self._all_futures())

    def when_done(self, call) -> None:
        """`call()` once every job has ended (now, if they have), from the pool's thread."""
        with self._lock:
            pending = self.running()
            if pending:
                self._when_done.append(call)
        if not pending:
            call()

    def _ended(self, _future) -> None:
        with self._lock:
            self.ended_at = max(self.ended_at, time.perf_counter())
            calls = self._when_done if not self.running() else []
            self._when_done = [] if calls else self._when_done
        for call in calls:
            call()

    def _all_futures(self) -> list:
        return list(self._futures.values())

    def _progress(self) -> None:
        done = len(self._hits) + sum(f.done() for f in self._all_futures())
        if done > self._said:
            self._said = done
            self.say(f"compiled {done}/{len(self.jobs)} context binaries", 2 + done / max(1, len(self.jobs)), 4)

    def _smoke(self, jobs: list, results: list) -> None:
        if not self._smoked and self.plan.block_size and self.plan.block_size != DEFAULT_BLOCK:
            _check_twins_load(jobs, results, self.cache, self.plan.block_size, self.say)   # the default: the tests check it
        self._smoked = True


def _here(fn, job):
    """A cached job, read in this process: its result, or the ModelExportError it ended with."""
    try:
        return fn(job)
    except ModelExportError as e:
        return e


def _job_seconds(jobs, results) -> dict:
    """Each context-binary job's compile seconds, wall and CPU (its worker's threads), as its cache entry
    recorded them (a cache hit shows the build that made it): where the compile stage's time went."""
    out = {}
    for (_, job), r in zip(jobs, results):
        meta = r["meta"]
        what = f"twin_{job['graph']}" if job["kind"] == "twin" else \
            f"shared_{job['part']}{'_full' if job.get('full_context') else ''}"
        wall, cpu = meta.get("compile_seconds"), meta.get("compile_cpu_seconds")
        if isinstance(wall, dict):   # a weight-shared job: one session per graph, in order
            wall, cpu = sum(wall.values()), (sum(cpu.values()) if cpu else None)
        out[f"{job['target']}/{job.get('role', 'decoder')}/{what}"] = {"wall_s": wall, "cpu_s": cpu, "hit": bool(r.get("hit"))}
    return out


def _check_twins_load(jobs, results, cache: Cache, block_size: int, say) -> None:
    """LPBQ twins of a non-default block size are loaded and run once on the simulator in child
    processes first (cached by the twin's key; ~100 s for SmolLM2's two graphs): a binary that
    crashes it fails the build here, not the user's process later."""
    checks = []
    for (_, job), r in zip(jobs, results):
        if job["kind"] == "twin" and not cache.get("sim-smoke", job["key"]):
            checks.append((simulator_smoke_run, {"epcontext": str(Path(r["entry"]) / f"{job['graph']}_ctx.onnx"),
                                                 "soc_model": get_target(job["target"]).soc_model,
                                                 "graph": job["graph"], "key": job["key"]}))
    if not checks:
        return
    say(f"running {len(checks)} host twins once on the simulator", 3.2, 4)
    for (_, job), r in zip(checks, run_jobs("the simulator check of the host twins", checks, min(2, len(checks)))):
        crashed = isinstance(r, ModelExportError)
        if crashed or not r.get("ok"):
            raise ToolchainError(f"the compiled {job['graph']} (16a4w_block, --block-size {block_size}) "
                                 f"{'crashed' if crashed else 'gave non-finite outputs on'} the x86 HTP simulator "
                                 f"when loaded from its context binary (a simulator defect seen with 64-wide blocks)",
                                 "use --block-size 32 (the default), or --precision 16a8w")
        cache.get_or_create("sim-smoke", job["key"], lambda tmp, r=r: r)
