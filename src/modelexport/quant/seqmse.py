"""SeqMSE-style scale search for 4-bit weights: per (block of input channels, output channel) the
scale that minimises the layer's *output* error on real activations, not the weight error.

For a block b of a column, the output error of a rounding D = Q(w) - w is D_b^T H_bb D_b with
H = X^T X the input second moment (cross-block terms are left out: each block's choice is made
alone, which is what makes the search a handful of batched products). Candidates:
- LPBQ (16a4w_block): every integer block scale 1..15, under a few per-column scales of scales
  (the column's largest block ideal / 15, times 1, 0.95, 0.9, 0.85): the grid the HTP stores;
- per channel (16a4w): the column's absmax scale times a grid of factors 0.5..1.
"""
from __future__ import annotations

import numpy as np

from .block_weights import _QMAX, _QMIN, _SCALE_LEVELS, BlockWeight

CHANNEL_FACTORS = (1.0, 0.95, 0.9, 0.85)            # LPBQ: scale of scales shrunk to clip the largest block
PER_CHANNEL_FACTORS = tuple(np.linspace(0.5, 1.0, 26).tolist())
HESSIAN_BLOCK = 32                                  # block-diagonal part of H used for per-channel errors


def _diag_blocks(h, k: int, hb: int):
    import torch
    return torch.stack([h[i:i + hb, i:i + hb] for i in range(0, k, hb)])        # [K/hb, hb, hb]


def _output_error(d, hblocks):
    """d [K/hb, hb, N] rounding errors → [K/hb, N] output error energy per block and column."""
    import torch
    return (d * torch.bmm(hblocks, d)).sum(dim=1)


def search_block_scales(w: np.ndarray, h, block: int) -> BlockWeight:
    """LPBQ weight [K, N] with block scales chosen by output error under H [K, K] (torch)."""
    import torch

    k, n = w.shape
    nb = k // block
    wb = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(nb, block, n)
    hb = _diag_blocks(h.float(), k, block)
    ideal = torch.maximum(wb.amax(1) / _QMAX, wb.amin(1) / _QMIN).clamp_min(torch.finfo(torch.float32).tiny)
    top = ideal.amax(0) / _SCALE_LEVELS                                         # [N]
    best_total = torch.full((n,), float("inf"))
    best_q = torch.zeros_like(wb)
    best_s = torch.ones(nb, n)
    best_ch = top.clone()
    for f in CHANNEL_FACTORS:
        ch = top * f
        err_f = torch.full((nb, n), float("inf"))
        q_f = torch.zeros_like(wb)
        s_f = torch.ones(nb, n)
        for s in range(1, _SCALE_LEVELS + 1):
            eff = s * ch                                                        # [N]
            q = torch.clamp(torch.round(wb / eff), _QMIN, _QMAX)
            err = _output_error(q * eff - wb, hb)                               # [nb, N]
            better = err < err_f
            err_f = torch.where(better, err, err_f)
            s_f = torch.where(better, torch.full_like(s_f, s), s_f)
            q_f = torch.where(better[:, None, :], q, q_f)
        total = err_f.sum(0)
        better = total < best_total
        best_total = torch.where(better, total, best_total)
        best_ch = torch.where(better, ch, best_ch)
        best_s = torch.where(better[None, :], s_f, best_s)
        best_q = torch.where(better[None, None, :], q_f, best_q)
    return BlockWeight(best_q.reshape(k, n).numpy().astype(np.int8), best_s.numpy().astype(np.uint8),
                       best_ch.numpy().astype(np.float32))


def search_channel_scales(w: np.ndarray, h) -> BlockWeight:
    """Per-output-channel int4 weight [K, N] (one block of K) with the scale chosen by output
    error under the block-diagonal part of H."""
    import torch

    k, n = w.shape
    hb_size = HESSIAN_BLOCK if k % HESSIAN_BLOCK == 0 else k
    wt = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    hb = _diag_blocks(h.float(), k, hb_size)
    top = torch.maximum(wt.amax(0) / _QMAX, wt.amin(0) / _QMIN).clamp_min(torch.finfo(torch.float32).tiny)   # [N]
    best_err = torch.full((n,), float("inf"))
    best_scale = top.clone()
    best_q = torch.zeros_like(wt)
    for f in PER_CHANNEL_FACTORS:
        sc = top * f
        q = torch.clamp(torch.round(wt / sc), _QMIN, _QMAX)
        err = _output_error((q * sc - wt).reshape(k // hb_size, hb_size, n), hb).sum(0)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, sc, best_scale)
        best_q = torch.where(better[None, :], q, best_q)
    return BlockWeight(best_q.numpy().astype(np.int8), np.ones((1, n), np.uint8), best_scale.numpy().astype(np.float32))
