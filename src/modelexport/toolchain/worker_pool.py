"""Jobs in spawned worker processes, with one way back for their errors.

Native toolchain work (the QNN EP, the x86 HTP simulator, ONNX Runtime's quantizer) runs in
children so that a crash in it never takes the user's process down; spawn, not fork, so no child
inherits a half-initialised QNN or ONNX Runtime. How a job ends, as its caller sees it:

- it returns: its result;
- it raises a `ModelExportError`: the same class with the same problem and fix (the exception
  pickles whole: BaseException keeps the instance's `__dict__`);
- its worker dies (killed, segfault: BrokenProcessPool): a `ToolchainError` naming the stage, and
  saying so when the worker was killed by SIGKILL (on Linux the kernel's out-of-memory killer), with
  the caller's `memory_fix`;
- it raises anything else: a bug, re-raised here with the child's traceback.

Workers never outlive the process that started them: an interrupt (Ctrl-C, SIGTERM) stops them as
the pool unwinds, and a parent that ends without unwinding (kill -9, the OOM killer, an interrupt
taken while native code held the main thread) takes them along through the kernel's parent-death
signal. Otherwise an idle worker waits for jobs forever: its queue's other end lives in the worker
too, so it never reads end-of-file.
"""
from __future__ import annotations

import ast
import ctypes
import os
import signal
import sys
import threading
from pathlib import Path
from contextlib import contextmanager
from concurrent.futures import Future, ProcessPoolExecutor, as_completed, wait
from concurrent.futures import process as _process_module
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, Callable, Iterable, Iterator

from ..core.errors import InputError, Interrupted, ModelExportError, ToolchainError

Job = tuple[Callable[[Any], Any], Any]

_in_job = False


def _on_sigint(signum, frame) -> None:
    # A worker's Ctrl-C (the terminal sends it to the whole process group) ends the job it runs,
    # which comes back to the parent as a KeyboardInterrupt, as Python API callers expect; an idle
    # worker ignores it (raising there would print the worker loop's traceback). The parent,
    # interrupted too, stops the pool.
    if _in_job:
        raise KeyboardInterrupt()


PR_SET_PDEATHSIG = 1   # linux/prctl.h


def _die_with(parent_pid: int) -> None:
    """SIGKILL this worker when its parent ends, however it ends. prctl's parent-death signal, not a
    thread polling os.getppid(): the kernel sends it at once, even while the worker is inside a
    native call that holds the GIL (a QNN compile: minutes), where a Python thread could not run.
    Linux only: where the HTP simulator runs. The signal follows the thread that started the worker,
    and that is the thread driving the pool (it submits and waits) for as long as the pool lives."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:   # the parent had already gone before the line above
        os._exit(1)


def _worker_init(parent_pid: int) -> None:
    _die_with(parent_pid)
    signal.signal(signal.SIGINT, _on_sigint)


def _run_job(fn: Callable[[Any], Any], job: Any) -> Any:
    global _in_job
    _in_job = True
    try:
        return fn(job)
    finally:
        _in_job = False


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while a worker is being started, then act on them. Starting one forks
    a child and then writes it the job's setup through a pipe; an interrupt raised between the two
    closes the pipe early, and the child prints multiprocessing's `EOFError` traceback to the user's
    terminal. Held here, the signal is taken a moment later, once the child is in the pool's list of
    workers that an interrupt stops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in dict.fromkeys(got):
            signal.raise_signal(s)


def unguarded_script_line() -> tuple[str, int] | None:
    """(script, line) when this call comes from the top level of the `__main__` script outside an
    `if __name__ == "__main__":` block: a spawned worker starts by importing that script, so it would
    run the call again (Python refuses it there and the worker dies). None otherwise (an interactive
    session, `python -c`, a guarded call)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name.split(".")[-1] == "__main__":
        return None        # `python -m package`: multiprocessing does not import a package's __main__ again
    if main is None or not path or not str(path).endswith(".py"):
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    guarded = any(isinstance(n, ast.If) and _is_main_test(n.test) and n.lineno <= line <= (n.end_lineno or n.lineno)
                  for n in tree.body)
    return None if guarded else (str(path), line)


def _is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"`, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides))


def _check_main_guard() -> None:
    found = unguarded_script_line()
    if found is not None:
        path, line = found
        raise InputError(f"modelexport was called at the top level of {os.path.basename(path)} (line {line}), outside "
                         "`if __name__ == \"__main__\":`; its worker processes start by importing that script and "
                         "would run the call again",
                         "put the call under `if __name__ == \"__main__\":` (Python's rule for scripts that start "
                         "worker processes)")


class _Recorded:
    """A multiprocessing context that keeps every Process it makes in `seen`, from the moment it is
    made: the pool forgets a worker that died before the caller could look."""

    def __init__(self, context, seen: list):
        self._context, self._seen = context, seen

    def __getattr__(self, name: str):
        return getattr(self._context, name)

    def Process(self, *args, **kwargs):     # noqa: N802 - multiprocessing's name
        proc = self._context.Process(*args, **kwargs)
        self._seen.append(proc)
        return proc


class WorkerPool:
    """Up to `workers` spawned processes for the jobs of one `stage` (said when a worker dies),
    each job submitted as soon as it is ready. `in_process` runs the jobs here, one by one, with
    the same outcomes: for work too small to be worth a child's start-up."""

    def __init__(self, stage: str, workers: int, in_process: bool = False, memory_fix: str = ""):
        self.stage, self.memory_fix = stage, memory_fix
        if not in_process:
            _check_main_guard()
        self._workers: list[Any] = []          # every worker process started: how each ended
        self._pool = None if in_process else ProcessPoolExecutor(max_workers=max(1, workers),
                                                                 mp_context=_Recorded(get_context("spawn"), self._workers),
                                                                 initializer=_worker_init,
                                                                 initargs=(os.getpid(),))
        self._submitted: list[Future | Job] = []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is None:
            return
        if exc[0] is not None and issubclass(exc[0], (Interrupted, KeyboardInterrupt)):
            self._stop_now()      # do not wait minutes for a compile nobody wants: stop the workers now
            return
        try:
            self._pool.shutdown(wait=True, cancel_futures=exc[0] is not None)
        except BaseException:     # Ctrl-C or SIGTERM while the workers were being waited for
            self._stop_now()
            raise

    def _stop_now(self) -> None:
        """Terminate the workers and forget the pool's manager. The manager thread closes its wakeup
        pipe as it ends, and Python 3.11's exit hook writes to that pipe without a lock: it may find
        it half closed and print an OSError traceback. The manager is woken by the shutdown here; the
        hook has nothing left to do, so it never sees this pool, whatever interrupts this."""
        manager = getattr(self._pool, "_executor_manager_thread", None)
        try:
            for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
                proc.terminate()
            self._pool.shutdown(wait=False, cancel_futures=True)
            if manager is not None:
                manager.join(timeout=5)
        finally:
            if manager is not None:
                _process_module._threads_wakeups.pop(manager, None)

    def submit(self, fn: Callable[[Any], Any], job: Any) -> int:
        """Queue the job; returns its handle for `wait`."""
        if self._pool is None:
            self._submitted.append((fn, job))
            return len(self._submitted) - 1
        try:
            with _signals_held():          # submit may start a worker
                self._submitted.append(self._pool.submit(_run_job, fn, job))
        except BrokenProcessPool as e:   # an earlier job's worker died: this job ends the same way
            failed: Future = Future()
            failed.set_exception(e)
            self._submitted.append(failed)
        return len(self._submitted) - 1

    def wait(self, handle: int) -> None:
        """Until the job `handle` has ended (its outcome still comes from `outcomes`); in-process jobs
        run only there, so nothing to wait for."""
        job = self._submitted[handle]
        if isinstance(job, Future):
            wait([job])

    def future(self, handle: int) -> Future:
        """The job's Future (spawned pools only), for a caller that waits on jobs of several pools
        at once (the sweep's cells); its worker's death is a BrokenProcessPool there."""
        job = self._submitted[handle]
        if not isinstance(job, Future):
            raise ValueError("an in-process pool runs its jobs in outcomes(); it has no futures")
        return job

    def outcomes(self, on_done: Callable[[Any], None] | None = None) -> list[Any]:
        """Per job, in submission order: its result or the `ModelExportError` it ended with.
        `on_done(outcome)` is called as each job ends."""
        out: list[Any] = [None] * len(self._submitted)
        if self._pool is None:
            for i, (fn, job) in enumerate(self._submitted):
                try:
                    out[i] = fn(job)
                except ModelExportError as e:
                    out[i] = e
                if on_done:
                    on_done(out[i])
            return out
        index = {f: i for i, f in enumerate(self._submitted)}
        for f in as_completed(index):
            try:
                out[index[f]] = f.result()
            except ModelExportError as e:
                e.__cause__ = None   # the child's traceback: the user sees problem and fix only
                out[index[f]] = e
            except BrokenProcessPool as e:
                out[index[f]] = self._worker_died(e)
            if on_done:
                on_done(out[index[f]])
        return out

    def _worker_died(self, e: BrokenProcessPool) -> ToolchainError:
        for proc in self._workers:
            proc.join(timeout=1)
        if any(proc.exitcode == -signal.SIGKILL for proc in self._workers):
            return ToolchainError(f"a worker process was killed during {self.stage} (SIGKILL: on Linux the kernel's "
                                  f"out-of-memory killer does that when the host's {_host_memory_gb():.0f} GB run out)",
                                  self.memory_fix or "close what else uses memory, or run on a host with more of it")
        return ToolchainError(f"a worker process died during {self.stage}: {type(e).__name__}: {e}",
                              "run again with --jobs 1; report the model if it persists")

    def results(self, on_done: Callable[[Any], None] | None = None) -> list[Any]:
        """Every job's result, or once all have ended the first failed job's error (in
        submission order, so the same error whatever order they finished in)."""
        return raise_first_error(self.outcomes(on_done))


def _host_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def run_jobs(stage: str, jobs: Iterable[Job], workers: int, on_done: Callable[[Any], None] | None = None,
             in_process: bool = False, memory_fix: str = "") -> list[Any]:
    """`WorkerPool.outcomes` of (function, job) pairs known up front."""
    with WorkerPool(stage, workers, in_process, memory_fix) as pool:
        for fn, job in jobs:
            pool.submit(fn, job)
        return pool.outcomes(on_done)


def raise_first_error(outcomes: list[Any]) -> list[Any]:
    for r in outcomes:
        if isinstance(r, ModelExportError):
            raise r
    return outcomes
