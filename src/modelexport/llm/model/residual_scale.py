"""How much smaller the compiled decoder carries the residual stream: the power of two that keeps the
stream's peak on the calibration text below a quarter of fp16's maximum (the HTP runs the stream in
fp16 and clamps at 65,504; a quarter leaves room for text that peaks higher than the calibration's).

Measured: SmolLM2-135M peaks at 24,904 → 2 (under fp16's maximum, but not by 4x: an exact halving in
fp16); Gemma 3 270M near 103,000 in its middle layers on news text → 8. The static decoder applies it
(static_decoder.ResidualScale) and the manifest records it (`llm.residual_scale`) for whatever rebuilds
the float graph (verify --per-layer).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

FP16_MAX = 65504.0
HEADROOM = 4.0


@contextmanager
def watching_peak(backbone, peak: dict):
    """While the float static decoder runs (calibration), `peak["max"]` follows the largest |x| entering
    any layer or the final norm: the residual stream, at no extra forward."""
    def seen(_module, args):
        peak["max"] = max(peak.get("max", 0.0), float(args[0].detach().abs().amax()))
    hooks = [layer.register_forward_pre_hook(seen) for layer in backbone.layers]
    hooks.append(backbone.norm.register_forward_pre_hook(seen))
    try:
        yield peak
    finally:
        for h in hooks:
            h.remove()


def residual_scale_for(peak: float) -> float:
    """1, 2, 4, ...: the smallest power of two that brings `peak` under FP16_MAX / HEADROOM."""
    limit = FP16_MAX / HEADROOM
    return 1.0 if peak <= limit else float(2 ** math.ceil(math.log2(peak / limit)))
