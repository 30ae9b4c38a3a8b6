"""Shared test fixtures. Tests run the real libraries; nothing here mocks QNN."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Compiled-artifact caches go to a per-session temp folder, never the user's home."""
    cache = tmp_path_factory.getbasetemp() / "modelexport-cache"
    monkeypatch.setenv("MODELEXPORT_CACHE_DIR", str(cache))


def run_cli(*args: str, check: bool | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `modelexport` console entry in a child process, as a user would."""
    proc = subprocess.run([sys.executable, "-m", "modelexport", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=1800)
    if check is True and proc.returncode != 0:
        raise AssertionError(f"modelexport {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def cli():
    return run_cli


def invoke(argv: list[str]) -> tuple[int | str, str]:
    """The CLI's entry function in this process: (exit code, or "crash", and the traceback it would show)."""
    import traceback

    from modelexport.cli.main import main
    try:
        return main(argv), ""
    except SystemExit as e:
        return (e.code if isinstance(e.code, int) else 1), ""
    except Exception:              # a bug: what the user would have seen
        return "crash", traceback.format_exc()


@pytest.fixture
def cli_here(capfd, monkeypatch):
    """`cli` without a new interpreter (~2.5-5 CPU-s of imports each): the same entry function and
    exit code, what it printed (captured at the file descriptors) and any traceback in stderr;
    `check` and `env` as `cli`'s (env is set for the call only). Not for what a process reads
    once at start (QNN_LOG_LEVEL's library load, signals): keep one `cli` test per verb for the
    console entry itself."""
    def run(*args: str, check: bool | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        capfd.readouterr()
        with monkeypatch.context() as mp:
            for k, v in (env or {}).items():
                mp.setenv(k, v)
            rc, crash = invoke(list(args))
        out, err = capfd.readouterr()
        proc = subprocess.CompletedProcess(["modelexport", *args], 1 if rc == "crash" else rc, out, err + crash)
        if check is True and proc.returncode != 0:
            raise AssertionError(f"modelexport {' '.join(args)} failed ({proc.returncode}):\n{out}\n{err + crash}")
        return proc
    return run


@pytest.fixture(scope="module")
def one_torch_thread():
    """For files of tiny models (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): they
    gain nothing from threads, and 2 OpenMP threads on 2 cores shared with other test workers run
    ~10x slower than one."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF, from its installed asset package (`make setup`)."""
    from modelexport.zoo.assets import asset_path
    return asset_path("smollm2_gguf")


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF (Google's base model), assembled once per session from its
    chunk packages (`make setup`) into a session cache."""
    from modelexport.zoo.assets import asset_path
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "assets-cache"))
        return asset_path("gemma3_270m_gguf")


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """A user's mistake: non-zero exit, a message naming it, and no Python traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    text = proc.stderr + proc.stdout
    for n in needles:
        assert n.lower() in text.lower(), text


REPO = Path(__file__).resolve().parents[1]


# The files that take longest, longest first (measured with `--durations`): under `--dist loadfile`
# a worker takes whole files in collection order, so starting with these packs the two workers
# evenly instead of leaving one to finish a long file alone at the end.
SLOW_FILES = ("test_llm_generate_smollm2.py", "test_llm_real_gemma3.py", "test_llm_generate_cpu.py", "test_llm_export_smollm2_layers.py",
              "test_llm_export.py", "test_sweep.py", "test_et_mobilenet.py", "test_real_torch.py", "test_et_audit.py",
              "test_et_inputs.py", "test_llm_families.py", "test_verify_per_layer.py", "test_et_locate.py",
              "test_llm_cpu_families.py", "test_gguf_kquants.py", "test_examples.py")


def pytest_collection_modifyitems(items):
    """Slow files first (stable sort, see SLOW_FILES). Tests marked heavy run only under
    `make test-heavy` (MODELEXPORT_HEAVY_TESTS=1): one rule here."""
    import os
    if not os.environ.get("MODELEXPORT_HEAVY_TESTS"):
        skip = pytest.mark.skip(reason="minutes-long: make test-heavy")
        for item in items:
            if item.get_closest_marker("heavy"):
                item.add_marker(skip)
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
