"""The 4-bit weight roundings offered for LLM graphs (`compile --rounding NAME`), one row each.

Each turns a float MatMul weight [K, N] (and, for the data-aware ones, H = X^T X of its real
inputs) into a `BlockWeight` exactly representable by the graph's DequantizeLinear: LPBQ blocks
of `block` input channels (16a4w_block) or one scale per output channel (16a4w, block = K).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.errors import InputError
from .block_weights import _QMAX, _QMIN, BlockWeight, quantize_blocks
from .gptq import gptq_round_many
from .seqmse import search_block_scales, search_channel_scales


def nearest_channel(w: np.ndarray, importance: np.ndarray | None = None) -> BlockWeight:
    """Per-output-channel int4: the scale that fits the column on the grid, or with `importance`
    ([K], each input's mean square) the fraction of it (clipping the largest weights) with the
    smallest importance-weighted error."""
    wt = w.astype(np.float32)
    fit = np.maximum(np.maximum(wt.max(0) / _QMAX, wt.min(0) / _QMIN), np.finfo(np.float32).tiny).astype(np.float32)
    best = best_err = None
    for f in (CHANNEL_CLIP_FACTORS if importance is not None else (1.0,)):
        scale = (fit * f).astype(np.float32)
        q = np.clip(np.round(wt / scale), _QMIN, _QMAX)
        err = (((q * scale - wt) ** 2) * importance[:, None]).sum(0) if importance is not None else 0.0
        if best is None:
            best, best_err = (q, scale), err
        else:
            better = err < best_err
            best = (np.where(better[None], q, best[0]), np.where(better, scale, best[1]))
            best_err = np.minimum(err, best_err)
    return BlockWeight(best[0].astype(np.int8), np.ones((1, w.shape[1]), np.uint8), best[1].astype(np.float32))


CHANNEL_CLIP_FACTORS = tuple(np.linspace(0.5, 1.0, 11).tolist())


def input_importance(h) -> np.ndarray:
    """Each input channel's weight in the error: its mean square on the calibration text, H's diagonal."""
    import torch
    return torch.diag(h).float().numpy()


def _nearest(w, h, block):
    return quantize_blocks(w, block) if block < w.shape[0] else nearest_channel(w)


# the column's scale of scales shrunk to clip its largest block, when that lowers the weighted error
# (SmolLM2, then GPTQ: 1.05x float's held-out perplexity with these, 1.08x with 1.0 alone; without GPTQ
# they do worse, 1.15x against 1.12x, but the GPTQ start is what they are for)
IMATRIX_CHANNEL_FACTORS = (1.0, 0.95, 0.9, 0.85, 0.8)


def _imatrix(w, h, block):
    imp = input_importance(h)
    return (quantize_blocks(w, block, imp, IMATRIX_CHANNEL_FACTORS) if block < w.shape[0]
            else nearest_channel(w, imp))


def _seqmse(w, h, block):
    return search_block_scales(w, h, block) if block < w.shape[0] else search_channel_scales(w, h)


def _in_threads(fn: Callable) -> Callable:
    """fn over many weights on every core: numpy's array loops release the GIL, and the imatrix
    search (15 levels x 5 scale factors per block) is ~45 CPU-seconds for SmolLM2."""
    def many(ws, hs, blocks):
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return list(pool.map(fn, ws, hs, blocks))
    return many


def _gptq_from(scales: Callable) -> Callable:
    def many(ws, hs, blocks):
        return gptq_round_many(ws, hs, _in_threads(scales)(ws, hs, blocks), blocks)
    return many


@dataclass(frozen=True)
class Rounding:
    name: str
    needs_activations: bool
    fn: Callable | None   # (w [K, N], H [K, K] torch or None, block) → BlockWeight
    what: str
    many: Callable | None = None   # ([w], [H], [block]) → [BlockWeight], when batching pays (GPTQ)

    def round_all(self, ws: list, hs: list, blocks: list[int]) -> list[BlockWeight]:
        if self.many is not None:
            return self.many(ws, hs, blocks)
        return [self.fn(w, h, b) for w, h, b in zip(ws, hs, blocks)]

    def round_one(self, w, h, block: int) -> BlockWeight:
        return self.round_all([w], [h], [block])[0]


ROUNDINGS = {r.name: r for r in (
    Rounding("nearest", False, _nearest, "round to nearest; per block the integer scale with the smallest weight error"),
    Rounding("imatrix", True, _imatrix, "per block the integer scale with the smallest error weighted by each "
             "input's mean square on the calibration text (llama.cpp's imatrix)", _in_threads(_imatrix)),
    Rounding("seqmse", True, _seqmse, "scales searched for the smallest layer output error on the calibration activations"),
    Rounding("gptq", True, None, "imatrix scales; integers by GPTQ error compensation with the inputs' X^T X",
             _gptq_from(_imatrix)),
    Rounding("seqmse-gptq", True, None, "scales by the output-error search, then integers by GPTQ", _gptq_from(_seqmse)),
)}
# SmolLM2-135M 16a4w_block, weights only, held-out perplexity / float (docs/llm_export.md): nearest
# 1.26x, gptq (from imatrix scales) 1.05x; a default that a short text cannot feed falls
# back to nearest (backends/llm_qnn/compile.py). Whatever the model's size the input moments are
# recorded one decoder layer at a time (llm/layerwise_rounding.py), so memory does not bound it.
DEFAULT_ROUNDING = "gptq"
# ... but time does: GPTQ's work grows with rows x cols^2 of every 4-bit linear (`gptq_work`).
# SmolLM2-135M is 8.7e10: moments + GPTQ 41 s on 2 quiet cores, +10% on its 398 s cold compile
# (the issue allows +30%); a Llama-3.2-1B is 3.6e12: its first 2 of 16 layers took 81 s quiet,
# ~11 min for all, more than its whole 9.3-minute compile (bench/results/llm_rounding.json). Above
# this budget the default is nearest and the manifest says why; `--rounding gptq` still asks for it.
DEFAULT_GPTQ_WORK = 4e11
ROUNDING_ABOVE_WORK = "nearest"


def _layer_linears(shape: dict) -> list[tuple[int, int]] | None:
    """(rows, cols) of one decoder layer's linears, those reading one tensor as one (q|k|v,
    gate|up), from the config's shape; None when the shape is not known."""
    try:
        h, heads, inter = (int(shape[k]) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
    except (KeyError, TypeError, ValueError):
        return None
    hd = int(shape.get("head_dim") or h // heads)
    kv = int(shape.get("num_key_value_heads") or heads)
    return [((heads + 2 * kv) * hd, h), (h, heads * hd), (2 * inter, h), (h, inter)]


def gptq_work(shape: dict) -> float | None:
    """rows x cols^2 summed over the decoder's linears (GPTQ's Python loop runs over cols, each step
    updating rows x (the cols left)), from the config's shape; None when the shape is not known."""
    linears = _layer_linears(shape)
    if linears is None or "num_hidden_layers" not in shape:
        return None
    return float(int(shape["num_hidden_layers"]) * sum(r * c * c for r, c in linears))


def default_rounding(shape: dict) -> tuple[str, str]:
    """The default rounding for a model of this shape, and why (recorded in the manifest)."""
    work = gptq_work(shape)
    if work is not None and work > DEFAULT_GPTQ_WORK:
        return ROUNDING_ABOVE_WORK, (f"the default; {DEFAULT_ROUNDING} would cost ~{work / 8.7e10:.0f}x SmolLM2-135M's "
                                     f"~1 minute of GPTQ on 2 cores: --rounding {DEFAULT_ROUNDING} asks for it "
                                     "(its memory is one layer's moments)")
    return DEFAULT_ROUNDING, "the default"


def layer_moments_bytes(shape: dict) -> int | None:
    """float32 bytes of one decoder layer's input moments, what the data-aware roundings hold at a
    time (q/k/v and gate/up share their input's: Llama-3.2-1B 319 MB, its down_proj's 8192^2 most
    of it), from the config's shape; None when the shape is not known."""
    linears = _layer_linears(shape)
    return None if linears is None else 4 * sum(c * c for _, c in linears)


# tokens of calibration text the data-aware roundings need for X^T X: fewer leaves H rank-deficient
# for the widest inputs (SmolLM2's down_proj reads 1536 channels)
MIN_ROUNDING_TOKENS = 512
ROUNDING_TOKENS = 2048


def get_rounding(name: str) -> Rounding:
    r = ROUNDINGS.get(str(name).lower())
    if r is None:
        raise InputError(f"--rounding {name!r} is not known", f"use one of: {', '.join(ROUNDINGS)}")
    return r


def output_error(w: np.ndarray, bw: BlockWeight, h, block: int) -> float:
    """Relative output error of a rounding on the recorded inputs: tr(D^T H D) / tr(W^T H W)."""
    import torch
    d = torch.from_numpy(bw.dequantized(block) - w.astype(np.float32))
    wt = torch.from_numpy(w.astype(np.float32))
    hh = h.float()
    return float((d * (hh @ d)).sum().double() / (wt * (hh @ wt)).sum().double().clamp_min(1e-30))
