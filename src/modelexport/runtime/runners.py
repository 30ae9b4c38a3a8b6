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

from ..core.registry import Registry
from ..core.vocab import BundleKind, Format


@dataclass(frozen=True)
class Runner:
    format: str
    run: Callable[..., object]        # (bundle, inputs, random, part, target, perf_profile, repeat) -> RunResult
    verify: Callable[..., object]     # (bundle, inputs, part, target, min_sqnr, max_samples) -> VerifyReport
    profile: Callable[..., object]    # (bundle, runs, level, part, target, inputs, trace, keep_dir) -> ProfileReport


RUNNERS: Registry[Runner] = Registry("runtime")
DEFAULT_FORMAT = Format.CONTEXT_BINARY


def runner(fmt: str):
    def add(r: Runner) -> Runner:
        RUNNERS.register(fmt)(r)
        return r
    return add


def _ctx_run(*a, **k):
    from ..backends.ort_qnn.run import run_bundle
    return run_bundle(*a, **k)


def _ctx_verify(*a, **k):
    from ..backends.ort_qnn.verify import verify_bundle
    return verify_bundle(*a, **k)


def _ctx_profile(*a, **k):
    from ..profiling.ort_profile import profile_ort
    return profile_ort(*a, **k)


def _pte_run(*a, **k):
    from ..backends.executorch_qnn.run import run_pte
    return run_pte(*a, **k)


def _pte_verify(*a, **k):
    from ..backends.executorch_qnn.run import verify_pte
    return verify_pte(*a, **k)


def _pte_profile(bundle, runs, level, part, target, inputs, trace, keep_dir=None):
    from ..profiling.pte_profile import profile_pte
    return profile_pte(bundle, runs, level, part, target, inputs, trace)


def _llm_pte_verify(*a, **k):
    from .llm_pte_verify import verify_llm_pte
    return verify_llm_pte(*a, **k)


def _llm_pte_refuse(verb: str):
    def refuse(*a, **k):
        from .llm_pte_verify import not_for_llm_pte
        return not_for_llm_pte(verb)(*a, **k)
    return refuse


def _llm_ctx_verify(*a, **k):
    """An LLM context-binary bundle has no one float graph to set beside its decoders; a vision-language
    bundle's vision part has one, and is what plain `verify` compares (else a refusal naming the ways)."""
    from ..backends.llm_qnn.vision_verify import verify_vision_part
    return verify_vision_part(*a, **k)


def kind_key(fmt: str, kind: str) -> str:
    """The key of a runner for one kind of bundle of a format (an LLM's .pte is not a model's)."""
    return f"{fmt}/{kind}"


runner(Format.CONTEXT_BINARY)(Runner(Format.CONTEXT_BINARY, _ctx_run, _ctx_verify, _ctx_profile))
runner(Format.PTE)(Runner(Format.PTE, _pte_run, _pte_verify, _pte_profile))
runner(kind_key(Format.CONTEXT_BINARY, BundleKind.LLM))(Runner(Format.CONTEXT_BINARY, _ctx_run, _llm_ctx_verify,
                                                               _ctx_profile))
runner(kind_key(Format.PTE, BundleKind.LLM))(Runner(Format.PTE, _llm_pte_refuse("run"), _llm_pte_verify,
                                                    _llm_pte_refuse("profile")))


def _manifest_fields(path: str | Path) -> dict:
    try:
        data = json.loads((Path(path) / "manifest.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}                  # the default runner reports what is wrong with the path


def format_of(path: str | Path) -> str:
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".pte":
        return Format.PTE
    return _manifest_fields(p).get("format") or DEFAULT_FORMAT


def runner_for(path: str | Path) -> Runner:
    """The runner of the bundle's format and kind, else of its format, else the default."""
    fmt = format_of(path)
    for key in (kind_key(fmt, _manifest_fields(path).get("kind") or BundleKind.MODEL), fmt, DEFAULT_FORMAT):
        if key in RUNNERS:
            return RUNNERS.get(key)
    return RUNNERS.get(DEFAULT_FORMAT)


def profile_bundle(bundle: str | Path, runs: int = 5, level: str = "basic", part: str | None = None,
                   target: str | None = None, inputs=None, trace: str | Path | None = None,
                   keep_dir: str | Path | None = None):
    """Per-op times of a bundle's compiled graph on the HTP simulator → ProfileReport."""
    from ..core.errors import InputError
    from ..profiling.report import check_arguments
    check_arguments(level, runs)
    if keep_dir is not None and Path(keep_dir).exists() and not Path(keep_dir).is_dir():
        raise InputError(f"--keep {keep_dir} is a file: it names the folder the raw profiles are kept in",
                         "give a folder path (it is made if missing)")
    return runner_for(bundle).profile(bundle, runs, level, part, target, inputs, trace, keep_dir)


def check_verify_arguments(min_sqnr: float | None, max_samples: int | None, threshold_db: float | None = None) -> None:
    from ..core.arguments import at_least, finite
    finite("--min-sqnr", min_sqnr, "20")
    finite("--threshold-db", threshold_db, "20")
    at_least("--samples", max_samples, 1, "4")
