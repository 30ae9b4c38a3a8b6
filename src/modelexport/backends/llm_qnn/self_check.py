"""Compile's own numerics check of an LLM bundle, before it is written.

The float decoder's logits on a window of the calibration text compile did not read were recorded
with the quantized graphs (llm/export/reference.py). The compiled graphs (each target's host twins)
run the same tokens on the HTP simulator through the generation loop's own runner: one call of the
largest arN graph, then one decode step of the smallest on the cache it wrote. The logits are scored
against float with the precision's pass mark (or --min-sqnr). Below it, the same tokens through the
QDQ graphs on the CPU say which side loses them: quantization (the QDQ graphs are as far from float)
or the compile (they are not). The result is manifest.numerics; `--strict-numerics` refuses the
bundle on it (exit 7).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...core.numerics import compare
from ...llm.export.reference import CheckWindow, read_reference
from ...llm.run.static_runner import StaticRunner
from .session import apply_lora, open_forwards

REFERENCE = "the float decoder (PyTorch, CPU), recorded when the graphs were quantized"
RUNTIME = "the HTP simulator (libQnnHtp.so) on the host twins, through the generation loop's runner"


@dataclass
class WindowRun:
    """What the check ran on a target's host twins: the tokens, each row's logits, the calls, and the
    caches after the first call (what the next call read). The ExecuTorch program's check replays it."""
    ids: list[int]
    logits: np.ndarray               # [tokens, vocab]
    calls: list[str]                 # "ar{N}_cl{C}" per call
    first_call_tokens: int
    k_after_first: list[np.ndarray]  # per layer, float
    v_after_first: list[np.ndarray]


def check_bundle(staged, entry: Path, threshold: float, say: Callable[[str], None],
                 runs: dict[str, WindowRun] | None = None) -> dict[str, Any]:
    """→ manifest.numerics: every target's compiled graphs against the recorded float logits (the
    first failing target's record, else the first's, with a line per target). `runs`, when given,
    receives each target's WindowRun on the simulator."""
    ref = read_reference(entry)
    if ref is None:
        return {"not_checked": "the bundle has only the full-context graph: the check runs the arN graphs"}
    window, logits = ref
    checks = [check_target(staged, window, logits, target, threshold, say, runs) for target in staged.manifest.targets]
    first = next((c for c in checks if not c["passed"]), checks[0])
    return first | {"graphs": [{"part": c["part"], "target": c["target"], "passed": c["passed"]} for c in checks]}


def check_target(staged, window: CheckWindow, ref: np.ndarray, target: str, threshold: float,
                 say: Callable[[str], None], runs: dict[str, WindowRun] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    say(f"checking the {target} graphs on the simulator ({len(window.ids)} tokens of held-out text)")
    num: dict[str, Any] = {
        "kind": "llm", "threshold_db": threshold, "samples": len(window.ids), "first_token": window.first_token,
        "inputs": "held-out text token" if window.held_out else "calibration text token", "text": window.note,
        "part": "decoder", "target": target, "precision": staged.manifest.precision, "reference": REFERENCE,
        "runtime": RUNTIME}
    try:
        run = simulate_window(staged, "htp-sim", target, window.ids)
        got, calls = run.logits, run.calls
    except Exception as e:   # noqa: BLE001 - the simulator's own errors (ONNX Runtime's Fail) are not ours
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return num | {"outputs": [], "passed": False, "run_error": text[:300], "run_error_on": "htp",
                      "seconds": round(time.perf_counter() - t0, 1)}
    if runs is not None:
        runs[target] = run
    row = _score(ref, got, threshold)
    num |= {"outputs": [row], "passed": row["passed"], "calls": calls}
    if not row["passed"]:
        say("below the pass mark: the same tokens through the QDQ graphs on the CPU")
        fq, _ = run_window(staged, "fake-quant", target, window.ids)
        num["fake_quant"] = {k: v for k, v in _score(ref, fq, threshold).items() if k != "name"}
        num["compiled_vs_fake_quant_db"] = _score(fq, got, threshold)["sqnr_db"]
    num["seconds"] = round(time.perf_counter() - t0, 1)
    return num


def run_window(staged, stage: str, target: str, ids: list[int]) -> tuple[np.ndarray, list[str]]:
    """The bundle's graphs at `stage` over `ids` from an empty cache → (logits [tokens, vocab], the calls)."""
    run = simulate_window(staged, stage, target, ids)
    return run.logits, run.calls


def simulate_window(staged, stage: str, target: str, ids: list[int]) -> WindowRun:
    """The bundle's graphs at `stage` over `ids` from an empty cache, in the generation loop's calls."""
    forwards, spec, max_seq_len = open_forwards(staged, stage, target, every_variant=True)
    apply_lora(staged, forwards, None)           # a --lora bundle: zeros, the base alone
    runner = StaticRunner(forwards, spec, max_seq_len)
    after_first: dict[str, list[np.ndarray]] = {}

    def keep_first(done: int, _total: int) -> None:
        if done and not after_first:
            after_first["k"] = [k.numpy().copy() for k in runner.k_store]
            after_first["v"] = [v.numpy().copy() for v in runner.v_store]
    logits = runner.feed(ids, on_chunk=keep_first).float().numpy()
    return WindowRun(list(ids), logits, [f"ar{n}_cl{c}" for n, c in zip(runner.chunks, runner.lengths)],
                     min(runner.chunks[0], len(ids)), after_first["k"], after_first["v"])


def _score(ref: np.ndarray, got: np.ndarray, threshold: float) -> dict[str, Any]:
    c = compare(ref, got)
    db = float(c["sqnr_db"])
    sqnr = round(db, 2) if np.isfinite(db) else (999.0 if db > 0 else None)    # identical: 999, as ONNX checks write
    agree = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    return {"name": "logits", "sqnr_db": sqnr, "cosine": None if c["cosine"] is None else round(c["cosine"], 5),
            "max_abs_error": round(float(c["max_abs_error"]), 4), "argmax_agreement": round(agree, 4),
            "passed": sqnr is not None and sqnr >= threshold}
