"""The automatic mixed-precision recipe (`compile --max-ppl-ratio R`): raise the fewest 4-bit
modules to 8-bit weights until the quantized model's perplexity is within R x float.

Modules are ranked by their measured sensitivity: the relative output error of their 4-bit
rounding on the calibration activations, tr(D^T H D) / tr(W^T H W) (the per-layer loss each one
adds, the same quantity per-layer SQNR reports, from the recorded moments); at equal error the
smaller module (cheaper to widen) first. The count is then found on perplexity itself, on
held-out text: doubling until the budget is met, then bisecting, so about 2 log2(n) evaluations.
"""
from __future__ import annotations

import re
import time
from typing import Callable

from ..core.errors import InputError

BYTES_4BIT, BYTES_8BIT = 0.5, 1.0


def override_flag(module: str, precision: str) -> str:
    return f"^{re.escape(module)}$={precision}"


def choose_overrides(names: list[str], errors: dict[str, float], sizes: dict[str, int], max_ratio: float,
                     float_ppl: float, quantized_ppl: Callable[[set[str]], float], override_precision: str,
                     n_params: int | None = None) -> dict:
    """→ the recipe: overrides (flags), the perplexities reached, the evaluations made. Raises an
    InputError naming the best reached when even every module raised misses the budget."""
    t0 = time.perf_counter()
    order = sorted(names, key=lambda n: (-errors.get(n, 0.0), sizes[n]))
    seen: dict[int, float] = {}

    def ratio(k: int) -> float:
        if k not in seen:
            seen[k] = quantized_ppl(set(order[:k])) / float_ppl
        return seen[k]

    total = n_params or sum(sizes.values())

    def cost(k: int) -> float:    # bytes per parameter added by widening the first k modules
        return sum(sizes[n] for n in order[:k]) * (BYTES_8BIT - BYTES_4BIT) / total

    k_pass = None
    k = 0
    while True:
        if ratio(k) <= max_ratio:
            k_pass = k
            break
        if k == len(order):
            break
        k = min(len(order), max(1, 2 * k))
    if k_pass is None:
        best = min(seen, key=seen.get)
        raise InputError(f"--max-ppl-ratio {max_ratio:g} cannot be met: the best reached is {seen[best]:.3f}x float "
                         f"perplexity ({float_ppl:.2f}) with {best} of {len(order)} modules at {override_precision} "
                         f"(+{cost(best):.3f} bytes/param)",
                         f"allow at least --max-ppl-ratio {seen[best]:.3f}, or compile with --precision 16a8w")
    lo = max((x for x in seen if x < k_pass and seen[x] > max_ratio), default=-1)
    while k_pass - lo > 1:
        mid = (lo + k_pass) // 2
        if ratio(mid) <= max_ratio:
            k_pass = mid
        else:
            lo = mid
    chosen = order[:k_pass]
    return {"max_ppl_ratio": max_ratio, "float_ppl": round(float_ppl, 4),
            "quantized_ppl": round(seen[k_pass] * float_ppl, 4), "ratio": round(seen[k_pass], 4),
            "ratio_before": round(seen[0], 4), "raised": chosen, "precision": override_precision,
            "overrides": [override_flag(n, override_precision) for n in chosen],
            "added_bytes_per_param": round(cost(k_pass), 4),
            "evaluations": [{"raised": k, "ratio": round(v, 4)} for k, v in sorted(seen.items())],
            "ranking": "relative output error of the 4-bit rounding on the calibration activations, largest first",
            "seconds": round(time.perf_counter() - t0, 2)}
