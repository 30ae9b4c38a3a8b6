"""Which runtime runs and verifies a bundle: a registry keyed by the bundle's format.

`context-binary` bundles (ONNX Runtime QNN EP, EPContext models) and `pte` bundles (ExecuTorch)
register here; `modelexport.run` / `verify` look the runner up, so a new artifact format is one
registration, not a branch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..registry import Registry


@dataclass(frozen=True)
class Runner:
    format: str
    run: Callable[..., object]        # (bundle, inputs, random, part, target, perf_profile, repeat) -> RunResult
    verify: Callable[..., object]     # (bundle, inputs, part, target, min_sqnr, max_samples) -> VerifyReport


RUNNERS: Registry[Runner] = Registry("runtime")
DEFAULT_FORMAT = "context-binary"


def runner(fmt: str):
    def add(r: Runner) -> Runner:
        RUNNERS.register(fmt)(r)
        return r
    return add


def _ctx_run(*a, **k):
    from .simulator import run_bundle
    return run_bundle(*a, **k)


def _ctx_verify(*a, **k):
    from .verify import verify_bundle
    return verify_bundle(*a, **k)


def _pte_run(*a, **k):
    from .et_run import run_pte
    return run_pte(*a, **k)


def _pte_verify(*a, **k):
    from .et_run import verify_pte
    return verify_pte(*a, **k)


runner("context-binary")(Runner("context-binary", _ctx_run, _ctx_verify))
runner("pte")(Runner("pte", _pte_run, _pte_verify))


def format_of(path: str | Path) -> str:
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".pte":
        return "pte"
    try:
        return json.loads((p / "manifest.json").read_text()).get("format") or DEFAULT_FORMAT
    except (OSError, ValueError):
        return DEFAULT_FORMAT      # the default runner reports what is wrong with the path


def runner_for(path: str | Path) -> Runner:
    fmt = format_of(path)
    return RUNNERS.get(fmt) if fmt in RUNNERS else RUNNERS.get(DEFAULT_FORMAT)
