"""The 4-bit weight roundings offered for LLM graphs (`compile --rounding NAME`), one row each.

Each turns a float MatMul weight [K, N] (and, for the data-aware ones, H = X^T X of its real
inputs) into a `BlockWeight` exactly representable by the graph's DequantizeLinear: LPBQ blocks
of `block` input channels (16a4w_block) or one scale per output channel (16a4w, block = K).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .block_weights import _QMAX, _QMIN, BlockWeight, quantize_blocks


def nearest_channel(w: np.ndarray) -> BlockWeight:
    """Per-output-channel int4, round to nearest, the scale that fits the column on the grid."""
    wt = w.astype(np.float32)
    scale = np.maximum(np.maximum(wt.max(0) / _QMAX, wt.min(0) / _QMIN), np.finfo(np.float32).tiny).astype(np.float32)
    q = np.clip(np.round(wt / scale), _QMIN, _QMAX).astype(np.int8)
    return BlockWeight(q, np.ones((1, w.shape[1]), np.uint8), scale)


def _nearest(w, h, block):
    return quantize_blocks(w, block) if block < w.shape[0] else nearest_channel(w)


def _seqmse(w, h, block):
    from .seqmse import search_block_scales, search_channel_scales
    return search_block_scales(w, h, block) if block < w.shape[0] else search_channel_scales(w, h)


def _gptq(w, h, block):
    from .gptq import gptq_round
    return gptq_round(w, h, _nearest(w, h, block), block)


def _seqmse_gptq(w, h, block):
    from .gptq import gptq_round
    return gptq_round(w, h, _seqmse(w, h, block), block)


@dataclass(frozen=True)
class Rounding:
    name: str
    needs_activations: bool
    fn: Callable          # (w [K, N], H [K, K] torch or None, block) → BlockWeight
    what: str


ROUNDINGS = {r.name: r for r in (
    Rounding("nearest", False, _nearest, "round to nearest; per block the integer scale with the smaller weight error"),
    Rounding("seqmse", True, _seqmse, "scales searched for the smallest layer output error on the calibration activations"),
    Rounding("gptq", True, _gptq, "nearest scales; integers by GPTQ error compensation with the inputs' X^T X"),
    Rounding("seqmse-gptq", True, _seqmse_gptq, "scales by the output-error search, then integers by GPTQ"),
)}
# today's rounding stays the default until a data-aware one is measured to pay on SmolLM2 (perplexity,
# bytes/param, compile time: bench/llm_quality.py); the host was too loaded to finish that measurement
DEFAULT_ROUNDING = "nearest"
# tokens of calibration text the data-aware roundings need for X^T X: fewer leaves H rank-deficient
# for the widest inputs (SmolLM2's down_proj reads 1536 channels)
MIN_ROUNDING_TOKENS = 512
ROUNDING_TOKENS = 2048


def get_rounding(name: str) -> Rounding:
    from ..core.errors import InputError
    r = ROUNDINGS.get(str(name).lower())
    if r is None:
        raise InputError(f"--rounding {name!r} is not known", f"use one of: {', '.join(ROUNDINGS)}")
    return r


def output_error(w: np.ndarray, bw: BlockWeight, h, block: int) -> float:
    """Relative output error of a rounding on the recorded inputs: tr(D^T H D) / tr(W^T H W)."""
    import torch
    d = torch.from_numpy(bw.dequantized(block) - w.astype(np.float32)).double()
    wt = torch.from_numpy(w.astype(np.float32)).double()
    hh = h.double()
    return float((d * (hh @ d)).sum() / (wt * (hh @ wt)).sum().clamp_min(1e-30))
