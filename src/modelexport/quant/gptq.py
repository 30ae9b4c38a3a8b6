"""GPTQ-style 4-bit rounding: the input channels are rounded one at a time, and each one's
rounding error is spread over the channels not yet rounded through the inverse Hessian
(H = X^T X of the layer's real inputs), so the layer's output error, not each weight's, is what
is kept small (Frantar et al., "GPTQ", 2022).

The scales are fixed first (the LPBQ grid or the per-channel scale, from `scales_from`), so the
result is exactly representable in the graph's DequantizeLinear; only the integers change.
Choices, as in the reference implementations: channels in decreasing order of H's diagonal (the
most active inputs first, "act order"; with static scales the order is free), damping of 1% of
the mean diagonal, dead inputs (H_ii = 0) zeroed, and the updates applied lazily in blocks of
128 channels (the rest of the matrix is touched once per block, not once per channel).
"""
from __future__ import annotations

import numpy as np

from .block_weights import _QMAX, _QMIN, BlockWeight

DAMPING = 0.01
LAZY_BLOCK = 128


def _inverse_cholesky(h, damping: float):
    """Upper Cholesky factor of H^-1, damping more if H is not positive definite."""
    import torch
    mean_diag = float(torch.diag(h).mean()) or 1.0
    eye = torch.eye(h.shape[0], dtype=h.dtype)
    for extra in (1, 10, 100):
        try:
            l_ = torch.linalg.cholesky(h + eye * damping * extra * mean_diag)
            return torch.linalg.cholesky(torch.cholesky_inverse(l_), upper=True)
        except RuntimeError:     # torch.linalg.LinAlgError: not positive definite at this damping
            continue
    raise ValueError("the input second moment is not positive definite even with 100x damping")


def gptq_round(w: np.ndarray, h, start: BlockWeight, block: int, damping: float = DAMPING) -> BlockWeight:
    """`start` (a BlockWeight of w [K, N]: its scales are kept) with its integers re-chosen by
    GPTQ under H [K, K] (torch). `block` is the block size of `start` (K for per channel)."""
    import torch

    k, n = w.shape
    scale = torch.from_numpy((start.block_scales.astype(np.float32) * start.channel_scale).T.copy())  # [N, K/block]
    wt = torch.from_numpy(np.ascontiguousarray(w.T, dtype=np.float32)).double()   # [N, K]: a column per input
    hh = h.double().clone()
    dead = torch.diag(hh) == 0
    hh[dead, dead] = 1.0
    wt[:, dead] = 0.0
    perm = torch.argsort(torch.diag(hh), descending=True)
    wt = wt[:, perm]
    hinv = _inverse_cholesky(hh[perm][:, perm], damping)
    group = (perm // block).tolist()
    scale = scale.double()
    q_out = torch.zeros(n, k, dtype=torch.float64)
    for i1 in range(0, k, LAZY_BLOCK):
        i2 = min(i1 + LAZY_BLOCK, k)
        w1 = wt[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        h1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = w1[:, i]
            sc = scale[:, group[i1 + i]]
            q = torch.clamp(torch.round(col / sc), _QMIN, _QMAX)
            q_out[:, i1 + i] = q
            e = (col - q * sc) / h1[i, i]
            w1[:, i:] -= e[:, None] * h1[i, i:][None, :]
            err1[:, i] = e
        wt[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    q_final = torch.empty_like(q_out)
    q_final[:, perm] = q_out
    return BlockWeight(q_final.T.contiguous().numpy().astype(np.int8), start.block_scales, start.channel_scale)
