"""The worker pool's one error channel: what a job raises comes back as the same error; a worker
that dies comes back as a ToolchainError naming the stage. Fast: no toolchain is loaded."""
from __future__ import annotations

import os
import signal
import time

import pytest

from modelexport.core.errors import InputError, ToolchainError
from modelexport.toolchain import worker_pool
from modelexport.toolchain.worker_pool import WorkerPool, raise_first_error, run_jobs


def double(x: int) -> int:
    return 2 * x


def refuse(x: int) -> int:
    raise InputError(f"input {x} is wrong", "give another one")


def exit_hard(x: int) -> int:
    os._exit(3)


def kill_self(x: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return x


def buggy(x: int) -> int:
    return {}["missing"]


@pytest.mark.parametrize("in_process", [False, True])
def test_an_error_comes_back_as_the_same_class_with_problem_and_fix(in_process):
    out = run_jobs("a test stage", [(double, 1), (refuse, 2), (double, 3)], 2, in_process=in_process)
    assert out[0] == 2 and out[2] == 6
    err = out[1]
    assert type(err) is InputError
    assert (err.problem, err.fix) == ("input 2 is wrong", "give another one")
    with pytest.raises(InputError) as raised:
        raise_first_error(out)
    assert raised.value is err and raised.value.__cause__ is None


@pytest.mark.parametrize("die", [exit_hard, kill_self])
def test_a_dead_worker_is_a_toolchain_error_naming_the_stage(die):
    [err] = run_jobs("the test compile", [(die, 0)], 1)
    assert type(err) is ToolchainError
    assert "a worker process died during the test compile" in err.problem
    assert err.fix


def test_results_raise_the_first_error_in_submission_order_once_all_ended():
    seen = []
    with WorkerPool("a test stage", 2) as pool:
        for fn, x in [(double, 1), (refuse, 2), (refuse, 3), (double, 4)]:
            pool.submit(fn, x)
        with pytest.raises(InputError, match="input 2 is wrong"):
            pool.results(seen.append)
    assert len(seen) == 4


def test_a_bug_in_a_job_keeps_its_traceback():
    with pytest.raises(KeyError):
        run_jobs("a test stage", [(buggy, 0)], 1)


def sleep_then_double(x: int) -> int:
    import time
    time.sleep(x)
    return 2 * x


def test_wait_returns_once_that_job_ended_and_its_outcome_is_kept():
    with WorkerPool("a test stage", 2) as pool:
        slow = pool.submit(sleep_then_double, 1)
        pool.submit(double, 5)
        pool.wait(slow)
        assert pool._submitted[slow].done()
        assert pool.results() == [2, 10]
    with WorkerPool("a test stage", 1, in_process=True) as pool:
        pool.wait(pool.submit(double, 3))         # nothing runs before outcomes() in process
        assert pool.results() == [6]


def test_an_interrupt_while_a_worker_starts_is_taken_once_it_has_started():
    """A signal that arrives while submit starts a worker is not lost and does not cut the start
    short (the child would print an EOFError traceback): it is raised right after."""
    taken: list[str] = []

    def on_term(signum, frame):
        taken.append("raised")
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with pytest.raises(KeyboardInterrupt):
            with worker_pool._signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                taken.append("started")
        assert taken == ["started", "raised"]
        assert signal.getsignal(signal.SIGTERM) is on_term
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_interrupt_while_the_workers_are_waited_for_stops_them_and_forgets_the_pool(monkeypatch):
    """SIGTERM landing in the pool's last wait (shutdown(wait=True)): the workers are terminated and
    the pool's manager leaves the exit hook's list, so Python's exit prints no OSError traceback."""
    from concurrent.futures import process
    from modelexport.core.errors import Interrupted
    pool = WorkerPool("test", 1)
    pool.wait(pool.submit(double, 2))
    manager = pool._pool._executor_manager_thread
    workers = list(pool._pool._processes.values())
    real_shutdown = pool._pool.shutdown

    def interrupted(wait=True, cancel_futures=False):
        if wait:
            raise Interrupted(signal.SIGTERM)
        real_shutdown(wait=wait, cancel_futures=cancel_futures)
    monkeypatch.setattr(pool._pool, "shutdown", interrupted)
    with pytest.raises(Interrupted):
        with pool:
            pass
    assert manager not in process._threads_wakeups
    for w in workers:
        w.join(timeout=10)
        assert not w.is_alive()
