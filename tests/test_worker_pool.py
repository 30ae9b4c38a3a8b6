"""The worker pool's one error channel: what a job raises comes back as the same error; a worker
that dies comes back as a ToolchainError naming the stage. Fast: no toolchain is loaded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_a_dead_worker_is_a_toolchain_error_naming_the_stage():
    [err] = run_jobs("the test compile", [(exit_hard, 0)], 1)
    assert type(err) is ToolchainError
    assert "a worker process died during the test compile" in err.problem
    assert err.fix


def test_a_worker_killed_as_the_out_of_memory_killer_kills_is_said_so_with_the_stages_fix():
    """SIGKILL is what the kernel's OOM killer sends: the user reads that, and the stage's own way out."""
    [err] = run_jobs("the test compile", [(kill_self, 0)], 1, memory_fix="compile with -O 1")
    assert type(err) is ToolchainError
    assert "was killed during the test compile (SIGKILL" in err.problem and "out-of-memory killer" in err.problem
    assert err.fix == "compile with -O 1"


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


UNGUARDED = """
import onnx
from onnx import TensorProto, helper
import modelexport

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "relu.onnx")
modelexport.compile("relu.onnx", output="out", precision="fp16", target=["SM8650", "SM8750"])
"""

GUARDED = """
from modelexport.toolchain.worker_pool import run_jobs


def main():
    print(run_jobs("a test stage", [(abs, -2), (abs, -3)], 2))


if __name__ == "__main__":
    main()
"""


def test_an_unguarded_script_is_told_to_guard_its_call_before_any_worker_starts(tmp_path):
    """A spawned worker imports the user's script first: an unguarded call would run again there and
    the worker die (Python refuses a new process during its bootstrap), which the user saw as 'a worker
    process died ... run again with --jobs 1'."""
    (tmp_path / "script.py").write_text(UNGUARDED)
    proc = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()
    assert "InputError: modelexport was called at the top level of script.py (line 10)" in proc.stderr, proc.stderr[-2000:]
    assert last[-1].strip().startswith('fix: put the call under `if __name__ == "__main__":`')
    assert "BrokenProcessPool" not in proc.stderr and "bootstrapping" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_guarded_script_starts_its_workers():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        Path(d, "script.py").write_text(GUARDED)
        proc = subprocess.run([sys.executable, "script.py"], cwd=d, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[2, 3]"
