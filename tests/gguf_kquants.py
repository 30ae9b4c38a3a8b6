"""A small K-quant encoder for test files (gguf-py dequantizes Q4_K, Q5_K and Q6_K but cannot
quantize them): float32 rows → the super-blocks of 256 weights llama.cpp's ggml-common.h lays
out, with plain min/max scales (not llama.cpp's searched ones). What it writes is checked only by
`gguf.quants.dequantize`, the reader every consumer uses."""
from __future__ import annotations

import numpy as np

QK = 256
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
FILE_TYPES = {"Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M", "Q6_K": "MOSTLY_Q6_K"}


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per super-block [n, 8] → the 12 bytes Q4_K/Q5_K store."""
    lo, hi = slice(0, 4), slice(4, 8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, lo] | ((sc[:, hi] >> 4) << 6)
    out[:, 4:8] = mn[:, lo] | ((mn[:, hi] >> 4) << 6)
    out[:, 8:12] = (sc[:, hi] & 15) | ((mn[:, hi] & 15) << 4)
    return out


def _min_scale_blocks(x: np.ndarray, qmax: int):
    """[n, 256] → (d, dmin float16 [n], sc, mn uint8 [n, 8], q uint8 [n, 8, 32] in 0..qmax)."""
    sub = x.reshape(-1, 8, 32)
    low = np.minimum(sub.min(-1), 0.0)                            # W = d sc q - dmin mn, mn >= 0
    scale = (sub.max(-1) - low) / qmax
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = (-low.min(-1) / 63).astype(np.float16)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(scale, d32, out=np.zeros_like(scale), where=d32 > 0)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(np.divide(-low, dmin32, out=np.zeros_like(low), where=dmin32 > 0)), 0, 63).astype(np.uint8)
    step = (d32 * sc)[..., None]
    shifted = sub + (dmin32 * mn)[..., None]
    q = np.clip(np.round(np.divide(shifted, step, out=np.zeros_like(sub), where=step > 0)), 0, qmax).astype(np.uint8)
    return d, dmin, sc, mn, q


def _nibbles(q: np.ndarray) -> np.ndarray:
    """[n, 8, 32] values → 128 bytes: per pair of sub-blocks, the first low, the second high."""
    pairs = (q & 15).reshape(-1, 4, 2, 32)
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)


def _q4_k(x):
    d, dmin, sc, mn, q = _min_scale_blocks(x, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales(sc, mn), _nibbles(q)], axis=1)


def _q5_k(x):
    d, dmin, sc, mn, q = _min_scale_blocks(x, 31)
    high = ((q >> 4) & 1) << np.arange(8, dtype=np.uint8)[None, :, None]           # bit j: sub-block j
    qh = np.bitwise_or.reduce(high, axis=1)                                       # [n, 32]
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales(sc, mn), qh, _nibbles(q)], axis=1)


def _q6_k(x):
    sub = x.reshape(-1, 16, 16)
    scale = np.abs(sub).max(-1) / 32                                             # q in -32..31
    d = (scale.max(-1) / 127).astype(np.float16)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(scale, d32, out=np.zeros_like(scale), where=d32 > 0)), -128, 127).astype(np.int8)
    step = (d32 * sc)[..., None]
    q = np.clip(np.round(np.divide(sub, step, out=np.zeros_like(sub), where=step != 0)), -32, 31)
    v = (q + 32).astype(np.uint8).reshape(-1, 2, 128)                            # two halves of 128
    ql = (v[:, :, :64] & 15) | ((v[:, :, 64:] & 15) << 4)                        # [n, 2, 64]
    quarters = (v >> 4).reshape(-1, 2, 4, 32) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    qh = np.bitwise_or.reduce(quarters, axis=2)                                  # [n, 2, 32]
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), _f16_bytes(d)], axis=1)


ENCODERS = {"Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def quantize_k(values: np.ndarray, kind: str) -> np.ndarray:
    """float32 [rows, cols] (cols a multiple of 256) → uint8 [rows, cols / 256 * block bytes]."""
    rows, cols = values.shape
    if cols % QK:
        raise ValueError(f"a {kind} row holds super-blocks of {QK} weights, not {cols}")
    blocks = ENCODERS[kind](np.asarray(values, np.float32).reshape(-1, QK))
    assert blocks.shape[1] == BLOCK_BYTES[kind]
    return np.ascontiguousarray(blocks.reshape(rows, -1))
