"""The examples a user copies run as written, each in a fresh folder with its own cache.

Each takes well under a minute on 2 cores. vlm.sh (a tiny VLM end to end) runs under `make test-heavy`
only, to keep `make test` inside its time budget; llm_genie.sh runs with --tiny (a tiny Llama), since
its default, the bundled SmolLM2, takes minutes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
BIN = Path(sys.executable).parent


def run(tmp_path: Path, *argv: str, timeout: int = 600) -> str:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHON=sys.executable,
               MODELEXPORT=str(BIN / "modelexport"), MODELEXPORT_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(list(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    return out


def test_onnx_8a8w(tmp_path):
    out = run(tmp_path, "bash", str(EXAMPLES / "onnx_8a8w.sh"), "out")
    assert "integrity OK" in out and "on the phone" in out
    assert "PASS" in out and "FAIL" not in out          # verify: the compiled logits pass 8a8w's mark


def test_pytorch_pte(tmp_path):
    out = run(tmp_path, sys.executable, str(EXAMPLES / "pytorch_pte.py"), "out")
    assert "same top class: True" in out
    assert (tmp_path / "out" / "manifest.json").exists()


def test_sweep_yaml(tmp_path):
    out = run(tmp_path, str(BIN / "modelexport"), "sweep", str(EXAMPLES / "sweep.yaml"), "-o", "OUT", "--workers", "2")
    assert "8 of 8 cells compiled" in out and "none failed" in out
    assert (tmp_path / "OUT" / "results.json").exists()
    # a cell is the README's `compile examples/pytorch_pte.py:build ... --calibration random`: run it
    assert "argmax" in run(tmp_path, str(BIN / "modelexport"), "run", "OUT/smallnet/SM8650/8a8w", "--random")


def test_llm_genie_tiny(tmp_path):
    out = run(tmp_path, "bash", str(EXAMPLES / "llm_genie.sh"), "--tiny", "out")
    assert "fits this machine" in out
    assert "copy to the phone (keep the paths):" in out and "genie_config.json" in out
    assert "genie-t2t-run -c genie_config.json" in out


@pytest.mark.heavy
def test_vlm_tiny(tmp_path):
    out = run(tmp_path, "bash", str(EXAMPLES / "vlm.sh"), "", "out")
    assert "PASS" in out and "on the phone" in out
