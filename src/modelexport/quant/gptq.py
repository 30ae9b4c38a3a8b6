"""GPTQ-style 4-bit rounding: the input channels are rounded one at a time, and each one's
rounding error is spread over the channels not yet rounded through the inverse Hessian
(H = X^T X of the layer's real inputs), so the layer's output error, not each weight's, is what
is kept small (Frantar et al., "GPTQ", 2022).

The scales are fixed first (the LPBQ grid or the per-channel scale, from `start`), so the
result is exactly representable in the graph's DequantizeLinear; only the integers change.
Choices, as in the reference implementations: channels in decreasing order of H's diagonal (the
most active inputs first, "act order"; with static scales the order is free), damping of 1% of
the mean diagonal, dead inputs (H_ii = 0) zeroed, and the updates applied lazily in blocks of
128 channels (the rest of the matrix is touched once per block, not once per channel).

The loop over input channels is Python, so matrices of one shape (the same projection of every
layer) go through it together, batched: one loop of K steps for the 30 q_proj of SmolLM2, not 30
(SmolLM2's 210 linears: 44 s one by one, a few seconds batched, on a quiet 2-core host).
"""
from __future__ import annotations

import numpy as np

from .block_weights import _QMAX, _QMIN, BlockWeight

DAMPING = 0.01
LAZY_BLOCK = 128
BATCH_ELEMENTS = 40_000_000     # weights in one batch (float32 x 3 copies: ~0.5 GB)


def _damped_cholesky(h, damping: float, mean_diag: float):
    """Lower Cholesky factor of `h` (float32) with `damping` x the mean diagonal added to its
    diagonal (in place), damping more if it is not positive definite."""
    import torch
    diag = h.diagonal().clone()
    for extra in (1, 10, 100):
        h.diagonal().copy_(diag + damping * extra * mean_diag)
        l_, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0:
            return l_
    raise ValueError("the input second moment is not positive definite even with 100x damping")


_TRIANGLE_LEAF = 512


def _lower_inverse(l_):
    """L^-1 of a lower triangular L, by halves: [[A, 0], [B, C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1, C^-1]],
    the off-diagonal block by two triangular solves. K^3/3 operations, LAPACK's trtri's count, which
    torch does not expose (solve_triangular against the identity is K^3); L is overwritten."""
    import torch
    k = l_.shape[0]
    if k <= _TRIANGLE_LEAF:
        return torch.linalg.solve_triangular(l_, torch.eye(k, dtype=l_.dtype), upper=False)
    m = k // 2
    a, b, c = l_[:m, :m], l_[m:, :m], l_[m:, m:]
    b.copy_(torch.linalg.solve_triangular(a, b, upper=False, left=False))      # B A^-1
    b.copy_(torch.linalg.solve_triangular(c, b, upper=False).neg_())           # -C^-1 B A^-1
    a.copy_(_lower_inverse(a))
    c.copy_(_lower_inverse(c))
    return l_


def _prepared(h, damping: float):
    """(channel order, dead inputs, upper Cholesky factor U of the permuted H^-1, H^-1 = U^T U) of
    one H. One Cholesky and one triangular inverse: with J the reversal, L = chol(J H J) is lower
    and J L^-1 J is upper with (J L^-1 J)^T (J L^-1 J) = J (J H J)^-1 J = H^-1, so by the factor's
    uniqueness it is what GPTQ's reference code gets from cholesky, cholesky_inverse, cholesky
    (2/3 K^3 operations, not 4/3). In float32, as the reference implementations: a 1B down_proj's
    8192^2 took 24 s and three 0.5 GB copies in float64."""
    import torch
    d = torch.diag(h).double()
    dead = d == 0
    d[dead] = 1.0
    perm = torch.argsort(d, descending=True)
    rev = perm.flip(0)
    hh = h[rev[:, None], rev].float()          # one gather, rows and columns, in reversed order
    hh.diagonal()[dead[rev]] = 1.0
    l_ = _damped_cholesky(hh, damping, float(d.mean()) or 1.0)
    del hh
    return perm, dead, _lower_inverse(l_).flip(0, 1)


def gptq_round(w: np.ndarray, h, start: BlockWeight, block: int, damping: float = DAMPING) -> BlockWeight:
    """`start` (a BlockWeight of w [K, N]: its scales are kept) with its integers re-chosen by
    GPTQ under H [K, K] (torch). `block` is the block size of `start` (K for per channel)."""
    return gptq_round_many([w], [h], [start], [block], damping)[0]


def gptq_round_many(ws: list[np.ndarray], hs: list, starts: list[BlockWeight], blocks: list[int],
                    damping: float = DAMPING) -> list[BlockWeight]:
    """`gptq_round` of many weights, those of one shape and block size batched. Weights sharing
    one H object (q/k/v, gate/up) share its factorisation."""
    groups: dict[tuple, list[int]] = {}
    for i, (w, blk) in enumerate(zip(ws, blocks)):
        groups.setdefault((*w.shape, blk), []).append(i)
    prepared: dict[int, tuple] = {}
    out: list = [None] * len(ws)
    for (k, n, blk), idx in groups.items():
        per = max(1, BATCH_ELEMENTS // (k * n))
        for c in range(0, len(idx), per):
            chunk = idx[c:c + per]
            for i in chunk:
                if id(hs[i]) not in prepared:
                    prepared[id(hs[i])] = _prepared(hs[i], damping)
            qs = _gptq_batch([ws[i] for i in chunk], [prepared[id(hs[i])] for i in chunk],
                             [starts[i] for i in chunk], blk)
            for i, q in zip(chunk, qs):
                out[i] = BlockWeight(q, starts[i].block_scales, starts[i].channel_scale)
    return out


def _gptq_batch(ws, preps, starts, block: int) -> list[np.ndarray]:
    """The GPTQ loop over L weights [K, N] of one shape at once; returns their int8 [K, N]. A row
    per (permuted) input channel: the channel rounded and the rank-1 update of the block's rows
    after it are contiguous rows of N (as columns of a [N, K] layout they were strided, and the
    update's broadcast product was most of the loop: 0.73 of 1.42 s on a 2048 x 1024 weight)."""
    import torch

    k, n = ws[0].shape
    lb = len(ws)
    wt = torch.empty(lb, k, n)           # a row per (permuted) input, a column per output
    scale = torch.empty(lb, k, n)        # each weight's scale, permuted like it
    # the factors, one per weight; a lone weight's is used as it is (a 1B down_proj's: 256 MB)
    hinv = preps[0][2][None] if lb == 1 else torch.empty(lb, k, k)
    for j, (w, (perm, dead, hi), st) in enumerate(zip(ws, preps, starts)):
        x = torch.from_numpy(np.array(w, dtype=np.float32))
        x[dead] = 0.0
        wt[j] = x[perm]
        s = torch.from_numpy(st.block_scales.astype(np.float32) * st.channel_scale)     # [K/block, N]
        scale[j] = s.repeat_interleave(block, dim=0)[perm]
        if lb > 1:
            hinv[j] = hi
    q_out = torch.empty(lb, k, n, dtype=torch.int8)
    for i1 in range(0, k, LAZY_BLOCK):
        i2 = min(i1 + LAZY_BLOCK, k)
        w1 = wt[:, i1:i2]                # updated in place: these rows are not read after the block
        err1 = torch.empty_like(w1)
        h1 = hinv[:, i1:i2, i1:i2]
        for i in range(i2 - i1):
            row = w1[:, i]
            sc = scale[:, i1 + i]
            q = torch.clamp(torch.round(row / sc), _QMIN, _QMAX)
            q_out[:, i1 + i] = q
            e = (row - q * sc) / h1[:, i, i][:, None]
            w1[:, i + 1:] -= h1[:, i, i + 1:][:, :, None] * e[:, None, :]
            err1[:, i] = e
        if i2 < k:       # in place: no [L, K, N] temporary per block
            wt[:, i2:].baddbmm_(hinv[:, i1:i2, i2:].transpose(1, 2), err1, alpha=-1)
    out = []
    for j, (perm, _, _) in enumerate(preps):
        q = torch.empty(k, n, dtype=torch.int8)
        q[perm] = q_out[j]
        out.append(q.numpy())
    return out
