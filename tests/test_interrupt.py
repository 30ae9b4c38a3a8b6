"""A compile stopped by SIGTERM, SIGINT (to the compile alone, not its process group) or SIGKILL
leaves no worker process running; stopped by a signal it can take, it says in one line what the next
identical command resumes from, exits 128 + the signal, and that command then completes from it."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from onnx_models import conv_relu

TARGETS = ("-t", "SM8650", "-t", "SM8750")   # two targets: two compile jobs, in two workers


def _is_worker(p: psutil.Process) -> bool:
    """A spawned pool worker (multiprocessing's resource tracker is not one)."""
    try:
        return "spawn_main" in " ".join(p.cmdline())
    except psutil.Error:       # ended meanwhile
        return False


def _workers(parent: psutil.Process) -> list[psutil.Process]:
    return [c for c in parent.children(recursive=True) if _is_worker(c)]


def _survivors(procs: list[psutil.Process], timeout: float = 10.0) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if _running(p)]


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_once_workers_run(args: list[str], env: dict, sig: int) -> tuple[subprocess.Popen, list[psutil.Process], int]:
    """Start the command, wait until two workers exist, send `sig` to the command's process alone;
    the command, every process under it then (the workers, the resource tracker) and how many of
    those were workers."""
    proc = subprocess.Popen([sys.executable, "-m", "modelexport", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    parent = psutil.Process(proc.pid)
    end = time.monotonic() + 300
    while proc.poll() is None and len(_workers(parent)) < 2 and time.monotonic() < end:
        time.sleep(0.02)
    tree = parent.children(recursive=True) if proc.poll() is None else []
    n_workers = sum(map(_is_worker, tree))
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    return proc, tree, n_workers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_interrupted_compile_leaves_no_worker_and_the_next_run_resumes(tmp_path, sig):
    model = conv_relu(tmp_path / "m.onnx", channels=32)
    out = tmp_path / "out"
    args = ["compile", str(model), "-o", str(out), *TARGETS, "--calibration", "random", "--json"]
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(tmp_path / "cache")}
    for _attempt in range(3):       # the compile may finish just as the signal is sent: try again
        proc, tree, n_workers = _signal_once_workers_run(args, env, sig)
        _, stderr = proc.communicate(timeout=120)
        if proc.returncode != 0:
            break
        shutil.rmtree(out)
    assert n_workers == 2
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig), stderr
    assert not _survivors(tree), "workers outlived the compile"
    assert not out.exists()
    if sig == signal.SIGKILL:
        return                     # nothing can be said, and what is left is swept on the next use
    assert "Traceback" not in stderr, stderr
    [line] = [ln for ln in stderr.splitlines() if ln.startswith("interrupted")]
    # the quantized model was finished before the workers started: what the next command reuses (on a busy
    # host one target's binary may also finish before the signal lands: "(1 ctx, 1 qdq)")
    assert re.match(r"interrupted; the next identical command resumes from the [12] cache entr", line), line
    assert re.search(re.escape(f"{tmp_path / 'cache'} (") + r"(1 ctx, )?1 qdq\)", line), line
    if sig == signal.SIGINT:
        return                     # the same path as SIGTERM from here: one completing run is enough
    again = subprocess.run([sys.executable, "-m", "modelexport", *args], env=env, capture_output=True, text=True,
                           timeout=300, check=False)
    assert again.returncode == 0, again.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["parts"][0]["cache_hit"]["quantize"] is True, m["parts"][0]["cache_hit"]


WORKER_PARENT = textwrap.dedent("""
    import sys, time
    from modelexport.toolchain.worker_pool import WorkerPool
    with WorkerPool("a test stage", 2) as pool:
        pool.submit(time.sleep, 600)     # busy with a job
        pool.submit(abs, 1)              # idle once this job is done
        print("started", flush=True)
        time.sleep(600)
""")


def test_workers_die_with_a_parent_killed_with_sigkill(tmp_path):
    """Killed with SIGKILL, the pool's process unwinds nothing: the workers, busy or idle, still end
    (the kernel's parent-death signal) instead of waiting for jobs forever."""
    proc = subprocess.Popen([sys.executable, "-c", WORKER_PARENT], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "started"
    parent = psutil.Process(proc.pid)
    end = time.monotonic() + 60
    while len(_workers(parent)) < 2 and time.monotonic() < end:
        time.sleep(0.02)
    tree = parent.children(recursive=True)
    assert len(_workers(parent)) == 2
    proc.kill()
    proc.wait()
    assert not _survivors(tree), [p.cmdline() for p in tree]


def test_an_interrupt_a_library_wrapped_still_ends_as_interrupted(monkeypatch, capsys):
    """Ctrl-C landing inside a pydantic serializer (sealing a bundle's manifest) comes back as
    pydantic's own error, not as `Interrupted`: the verb still says `interrupted` and exits 130."""
    from pydantic import BaseModel, model_serializer

    from modelexport.cli import main as cli_main

    class Sealed(BaseModel):
        x: int = 1

        @model_serializer(mode="wrap")
        def _ser(self, handler):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)        # the handler runs here, between bytecodes, and raises Interrupted
            return handler(self)

    monkeypatch.setattr(cli_main, "app", lambda **kw: Sealed().model_dump_json())
    assert cli_main.main(["compile"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
