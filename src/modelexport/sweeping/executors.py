"""Where cells run: spawned local processes, or Ray tasks. Both give a `concurrent.futures.Future`
per submitted cell and say which errors mean "the cell's worker died" (the sweep then runs it
again once); everything else — the order of cells, how many are in flight, retries, progress, the
results — is the sweep's own and the same for both (run.py). The table at the bottom picks one.
"""
from __future__ import annotations

import logging
import os
import socket
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlparse

from ..core.arguments import at_least
from ..core.cache import cache_root
from ..core.errors import InputError, ToolchainError, clip
from ..toolchain.worker_pool import WorkerPool
from .cells import Cell, run_cell
from .resources import GB, cell_resources

STAGE = "the sweep's cells"


def _done(outcome: dict[str, Any]) -> Future:
    f: Future = Future()
    f.set_result(outcome)
    return f


class LocalCells:
    """Up to `workers` spawned processes (toolchain/worker_pool.py), reused from cell to cell. When
    a worker dies the pool is broken: the cells it held come back as lost and are run again, each in
    a process of its own, so a cell that kills its worker again fails alone."""
    name = "local"

    def __init__(self, workers: int | None, address: str | None = None):
        self.slots = max(1, workers or os.cpu_count() or 1)
        self._stack = ExitStack()
        self._pool = None

    def __enter__(self) -> "LocalCells":
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

    def _new_pool(self, workers: int):
        return self._stack.enter_context(WorkerPool(STAGE, workers))

    def submit(self, job: dict[str, Any], cell: Cell, attempt: int) -> Future:
        pool = self._new_pool(1) if attempt > 1 else (self._pool or self._shared())
        return pool.future(pool.submit(run_cell, job))

    def _shared(self):
        self._pool = self._new_pool(self.slots)
        return self._pool

    def lost(self, error: BaseException) -> str | None:
        if isinstance(error, BrokenProcessPool):
            self._pool = None            # broken for good: the next cells get a fresh pool
            return f"its worker process died ({type(error).__name__})"
        return None

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "workers": self.slots}


def _reachable(address: str) -> None:
    """A Ray address that is host:port (or ray://host:port) must accept a connection: checked in a
    second, before ray.init, which would otherwise wait for it (and nothing is started)."""
    if address == "auto":
        return
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or not parsed.port:
        raise InputError(f"--ray {address!r} is not a Ray address",
                         "give HOST:PORT of the head node (e.g. --ray 10.0.0.5:6379), ray://HOST:10001, or --ray auto")
    try:
        socket.create_connection((parsed.hostname, parsed.port), timeout=3).close()
    except OSError as e:
        raise InputError(f"cannot reach a Ray cluster at {address} ({e.strerror or e}); nothing was started",
                         "start a cluster first (`ray start` with its head flag, on the head node, prints the "
                         "address), check the address, or leave --ray out to run the cells locally (--workers N)") from None


class RayCells:
    """Each cell a `ray.remote` task declaring its CPUs and memory (resources.py). Connects on
    creation — an unreachable cluster is an InputError before anything is written — unless this
    process is connected already (then that connection is used and left open)."""
    name = "ray"

    def __init__(self, workers: int | None, address: str | None):
        try:
            import ray
        except ImportError:
            ray = None
        self._started = False
        if ray is None or not ray.is_initialized():
            _reachable(address or "auto")
            if ray is None:
                raise ToolchainError("--ray needs the `ray` package, which is not installed",
                                     "pip install ray==2.60.0 (requirements.txt pins it), or leave --ray out")
            try:
                # the workers' own output stays in Ray's logs: stdout is the sweep's (--json)
                ray.init(address=address or "auto", log_to_driver=False, logging_level=logging.ERROR)
            except (ConnectionError, RuntimeError, ValueError) as e:
                what = ("--ray auto found no Ray cluster started on this machine" if (address or "auto") == "auto"
                        else f"cannot connect to the Ray cluster at {address}: {clip(str(e), 300)}")
                raise InputError(f"{what}; nothing was started",
                                 "start a cluster first (`ray start` with its head flag, on the head node, prints "
                                 "the address), check the address, or leave --ray out to run the cells locally (--workers N)") from None
            self._started = True
        self.ray = ray
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        self.largest = {"CPU": max((n.get("CPU", 0) for n in nodes), default=0),
                        "memory": max((n.get("memory", 0) for n in nodes), default=0)}
        self.slots = max(1, workers or int(sum(n.get("CPU", 0) for n in nodes)) or 1)
        self._remote = ray.remote(run_cell)
        self._refs: list[Any] = []

    def __enter__(self) -> "RayCells":
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if exc_type is not None:          # interrupted or failed: nothing left running on the cluster
            for ref in self._refs:
                self.ray.cancel(ref, force=True)
        if self._started:
            self.ray.shutdown()

    def submit(self, job: dict[str, Any], cell: Cell, attempt: int) -> Future:
        need = cell_resources(cell)
        if need.num_cpus > self.largest["CPU"] or need.memory_bytes > self.largest["memory"]:
            return _done({"cell": cell.key, "status": "failed", "error": "ResourceError", "exit_code": 2,
                          "reason": f"needs {need.num_cpus} CPU(s) and {need.memory_bytes / GB:.1f} GB ({need.source}); "
                                    f"the largest Ray node has {self.largest['CPU']:g} CPU(s) and "
                                    f"{self.largest['memory'] / GB:.1f} GB", "fix": "add a larger node to the cluster"})
        ref = self._remote.options(num_cpus=need.num_cpus, memory=need.memory_bytes, max_retries=0, name=cell.key,
                                   runtime_env={"env_vars": {"MODELEXPORT_CACHE_DIR": str(cache_root())}}).remote(job)
        self._refs.append(ref)
        return ref.future()

    def lost(self, error: BaseException) -> str | None:
        from ray.exceptions import RayError
        if isinstance(error, RayError):
            return clip(f"its Ray worker died ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})", 300)
        return None

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "slots": self.slots, "ray": self.ray.__version__,
                "largest_node": {"CPU": self.largest["CPU"], "memory_gb": round(self.largest["memory"] / GB, 1)}}


EXECUTORS = {"local": LocalCells, "ray": RayCells}


def open_executor(workers: int | None, ray_address: str | None):
    """The local runner, or Ray when an address (or `auto`) is given."""
    at_least("--workers", workers, 1, "2")
    return EXECUTORS["ray" if ray_address else "local"](workers, ray_address)
