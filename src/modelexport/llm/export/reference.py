"""The float decoder's logits on a window of the calibration text that compile did not read,
recorded beside the quantized graphs (`reference/` in the `llm-qdq` entry). Compile's own numerics
check (backends/llm_qnn/self_check.py) runs the compiled graphs on the same tokens on the simulator
and compares: the float model is never loaded a second time, which an 8B model could not afford.

The window is one call of the largest arN graph and one decode step of the smallest: both kinds
of graph run, the decode step on the cache the prefill wrote.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...quant.weight_rounding import ROUNDING_TOKENS
from ..model.static_decoder import StaticDecoderConfig, build_static_decoder
from ..run.static_runner import StaticRunner
from ..run.text import dialog_start, tokenize
from ..weight_quality import HELD_OUT_TOKENS
from .plan import LlmPlan
from .weight_dtype import float32_per_module

REFERENCE_DIR = "reference"
LOGITS_FILE, WINDOW_FILE = "logits.npy", "window.json"


@dataclass(frozen=True)
class CheckWindow:
    """The tokens the check runs, where in the text they start, and whether compile read them."""
    ids: list[int]
    first_token: int
    held_out: bool
    note: str

    def to_dict(self) -> dict:
        return {"ids": self.ids, "first_token": self.first_token, "held_out": self.held_out, "note": self.note}


def cached_variants(plan: LlmPlan) -> list[int]:
    """The arN graphs a generation loop runs (the full-context graph keeps no cache)."""
    return sorted(n for n in plan.variants if n != plan.max_seq_len)


def tokens_compile_read(calibration_tokens: int, rounding_tokens: int, quality: bool) -> int:
    """How far into its calibration text compile reads: the calibration samples, the 4-bit rounding's
    input moments and, with a quality recipe, its held-out span after those. The check (here) and
    `eval` (runtime/evaluate.held_out_span) both start after it."""
    return max(calibration_tokens, rounding_tokens, ROUNDING_TOKENS + HELD_OUT_TOKENS if quality else 0)


def check_window(plan: LlmPlan, tok, calibration_tokens: int) -> CheckWindow | None:
    """One largest-arN call and one smallest-arN step, after every token compile reads of the text
    (the calibration windows, the 4-bit rounding's span, the quality recipe's held-out span), begun
    as a dialog begins (BOS first when the tokenizer puts one: text.dialog_start); None when the
    bundle has only the full-context graph."""
    variants = cached_variants(plan)
    if not variants:
        return None
    need = min(variants[-1] + (1 if len(variants) > 1 else 0), min(plan.lengths))
    start = tokens_compile_read(calibration_tokens, ROUNDING_TOKENS, bool(plan.quality))
    lead = dialog_start(tok)
    body = need - len(lead)
    ids = tokenize(tok, plan.text.text, start + body)
    if len(ids) >= start + body:
        first = "BOS, then " if lead else ""
        return CheckWindow(lead + ids[start:start + body], start, True,
                           f"{plan.text.path.name}, {first}tokens {start}-{start + body - 1}, after every token compile read")
    return CheckWindow(ids[:need], 0, False,
                       f"{plan.text.path.name}, its first {need} tokens: the text is too short to hold out a window "
                       f"after the {start} tokens compile read")


def record_reference(model, plan: LlmPlan, window: CheckWindow | None, dest: Path) -> dict | None:
    """The float decoder's logits on `window` into `dest`/reference/ → the stage record's entry."""
    if window is None:
        return None
    variants = cached_variants(plan)
    dec = build_static_decoder(model, StaticDecoderConfig(variants[-1], plan.max_seq_len))
    runner = StaticRunner.from_decoder(dec, variants)
    with float32_per_module(dec):     # a bf16-held model: one float32 layer at a time
        logits = runner.feed(window.ids).float().numpy()
    folder = dest / REFERENCE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / LOGITS_FILE, logits)
    (folder / WINDOW_FILE).write_text(json.dumps({**window.to_dict(), "calls": runner.chunks}))
    return {"folder": REFERENCE_DIR, "tokens": len(window.ids), "calls": runner.chunks,
            "first_token": window.first_token, "held_out": window.held_out, "note": window.note}


def read_reference(entry: Path) -> tuple[CheckWindow, np.ndarray] | None:
    """(window, float logits [tokens, vocab]) from a stage entry; None when it has none."""
    folder = entry / REFERENCE_DIR
    if not (folder / LOGITS_FILE).is_file():
        return None
    w = json.loads((folder / WINDOW_FILE).read_text())
    return CheckWindow(w["ids"], w["first_token"], w["held_out"], w["note"]), np.load(folder / LOGITS_FILE)
