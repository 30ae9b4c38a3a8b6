"""A large graph prepares in a child process, so that the HTP's graph preparation running out of host
memory (the kernel's OOM killer: SIGKILL) is one error the user reads, with a fix, and not "Killed"."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from modelexport.backends.ort_qnn import compile as ort_compile
from modelexport.core.errors import ToolchainError
from onnx_models import _save


def _matmul(path: Path) -> str:
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    return str(_save([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [numpy_helper.from_array(w, "w")], path))


def _workers() -> list[int]:
    """This process's spawned workers (not multiprocessing's resource tracker)."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        try:
            if (d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me
                    and b"spawn_main" in (d / "cmdline").read_bytes()):
                out.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _kill_children_until(stop: threading.Event) -> None:
    """What the OOM killer does to the graph preparation's worker: SIGKILL, as soon as it exists."""
    while not stop.is_set():
        for pid in _workers():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_large_graph_prepares_in_a_child(tmp_path, monkeypatch, size):
    seen = []
    real = ort_compile.run_jobs
    monkeypatch.setattr(ort_compile, "run_jobs", lambda *a, **kw: seen.append(kw["in_process"]) or real(*a, **kw))
    if size == "large":     # the 16 KB model counts as large
        monkeypatch.setattr(ort_compile, "IN_PROCESS_MAX_BYTES", 1024)
    b = modelexport.compile(_matmul(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="fp16",
                            use_cache=False)
    assert b.manifest.numerics["passed"]
    assert seen == [size == "small"]


def test_a_graph_preparation_killed_for_memory_is_a_clear_error_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(ort_compile, "IN_PROCESS_MAX_BYTES", 1024)
    stop = threading.Event()
    killer = threading.Thread(target=_kill_children_until, args=(stop,), daemon=True)
    killer.start()
    try:
        with pytest.raises(ToolchainError) as e:
            modelexport.compile(_matmul(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650",
                                precision="fp16", use_cache=False)
    finally:
        stop.set()
        killer.join()
    assert "killed during the QNN EP compile (SIGKILL" in e.value.problem, e.value.problem
    assert e.value.fix == ort_compile.OUT_OF_MEMORY_FIX
    assert not (tmp_path / "b").exists()
