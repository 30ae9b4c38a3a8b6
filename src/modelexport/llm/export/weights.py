"""The 4-bit weights of an LLM compile: the rounding (nearest, or a
data-aware one from the calibration text's layer-wise moments: llm/layerwise_rounding.py) and the
quality recipe of `--max-ppl-ratio` (llm/weight_quality.py), chosen before any graph is quantized.
The graphs read the rounded weights from `graph_file`; the manifest records `rounding` and `recipe`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...quant.llm_graphs import parse_overrides
from ...quant.precision import get_precision
from ...quant.weight_rounding import MIN_ROUNDING_TOKENS, ROUNDING_TOKENS, ROUNDINGS, get_rounding
from ..run.text import TextSource, dialog_start, tokenize
from ..weight_quality import HELD_OUT_TOKENS, four_bit_linears, plan_weights as round_weights
from .plan import QualityOptions


@dataclass(frozen=True)
class WeightPlan:
    """What the graphs are quantized with: the overrides (a recipe's first), the rounded weights'
    file (None: the workers round to nearest themselves), and the manifest's record."""
    overrides: tuple
    rounding: dict | None = None          # the manifest's `weight_rounding`
    recipe: dict | None = None            # the manifest's `quality_recipe` (--max-ppl-ratio)
    extra_overrides: tuple[str, ...] = ()   # the recipe's modules raised to 8 bits, as REGEX=PRECISION
    graph_file: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightRequest:
    """What `plan_weights` rounds: the precision's 4-bit linears under `overrides`, blocks of `block_size`."""
    precision: str
    overrides: Any
    block_size: int
    max_seq_len: int
    quality: QualityOptions | None


def _short_text_falls_back(quality: QualityOptions, n_tokens: int, report) -> tuple[QualityOptions, str]:
    """The default is the best rounding the text allows: a short text is no error unless a data-aware
    rounding was asked for by name."""
    if not get_rounding(quality.rounding).needs_activations or quality.rounding_given or n_tokens >= MIN_ROUNDING_TOKENS:
        return quality, ""
    note = (f" (the default --rounding {quality.rounding} needs {MIN_ROUNDING_TOKENS}+ calibration tokens, "
            f"the text has {n_tokens})")
    report(f"4-bit weights rounded to nearest{note}")
    return QualityOptions("nearest", quality.max_ppl_ratio, quality.rounding_given, "the default" + note), note


def plan_weights(model, tok, text: TextSource, req: WeightRequest, tmp: Path,
                 report: Callable[[str], None]) -> WeightPlan:
    """Data-aware rounding and the quality recipe (llm/weight_quality.py), for 4-bit precisions."""
    quality = req.quality
    if not quality:
        return WeightPlan(tuple(req.overrides))
    t0 = time.perf_counter()
    names = four_bit_linears(model, get_precision(req.precision).weight_bits, req.overrides)
    ids = tokenize(tok, text.text, ROUNDING_TOKENS + HELD_OUT_TOKENS)
    quality, note = _short_text_falls_back(quality, len(ids), report)
    if quality.rounding == "nearest" and not quality.max_ppl_ratio:
        # the workers round to nearest themselves, as before: nothing to compute here
        return WeightPlan(tuple(req.overrides), {"method": "nearest", "what": ROUNDINGS["nearest"].what + note,
                                                 "why": quality.rounding_why, "modules": len(names)})
    plan = round_weights(model, ids, min(req.max_seq_len, 1024), names, quality.rounding, req.block_size,
                         tmp / "rounding", quality.max_ppl_ratio, report, lead=tuple(dialog_start(tok)))
    plan.rounding["why"] = quality.rounding_why
    extra = parse_overrides(plan.extra_overrides, req.precision)
    rounded = str(plan.rounded_path) if quality.rounding != "nearest" else None
    return WeightPlan(tuple(extra + list(req.overrides)), plan.rounding, plan.recipe, tuple(plan.extra_overrides),
                      rounded, {"weight_plan_s": round(time.perf_counter() - t0, 2)})
