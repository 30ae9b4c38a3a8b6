"""The GGUF block layouts our CPU kernels hold, each decoded into the values, scales and mins
of one kernel (`StoredRows`), and the kernel module of such rows.

Layouts kept as stored (llama.cpp's ggml-common.h), each as one of our two kernels holds it per
block of 32 weights (values, scale d, min m: W = d * value + m):
- Q4_0: d (float16), nibbles u: W = d * (u - 8)                                   → 4-bit
- Q4_1: d, m (float16), nibbles u: W = d * u + m                                  → 4-bit
- Q4_K: super-blocks of 256: d, dmin (float16), 6-bit sc, mn per 32, nibbles u:
        W = (d * sc) * u - dmin * mn: a Q4_1 block whose scale and min are float32 (the product
        of a float16 and a 6-bit integer is exact in float32, not in float16)       → 4-bit
- Q8_0: d (float16), int8 q: W = d * q (also the token embedding, as an 8-bit lookup) → 8-bit
- Q5_0: d (float16), 5-bit x: W = d * (x - 16): an int8 value                     → 8-bit
- Q5_1: d, m (float16), 5-bit x: W = d * x + m                                    → 8-bit + mins
- Q5_K: as Q4_K with 5-bit values                                                  → 8-bit + mins
- Q6_K: 16 scales per 256, 6-bit values: re-quantized per row to 8-bit blocks of 32   → 8-bit
Not kept: F16, Q2_K, Q3_K, IQ* (re-quantized by the caller, to 4 bits).
The 4-bit kernel reads a block's nibbles as Q4_0 stores them (byte j: value j low, value 16 + j
high); Q4_K's (32 bytes: one sub-block low, the next high) are repacked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

BLOCK = 32
SUPER = 256                      # a K-quant super-block


@dataclass(frozen=True)
class StoredRows:
    """Rows of GGUF matrices as one of our kernels holds them, per block of 32 weights: W = scale *
    value + min. q4: values u uint8 0..15; q8: int8. scales [N, K/32] float16 or float32; mins
    of the same type, or None (q4: W = d (u - 8); q8: W = d q)."""
    kernel: str
    values: np.ndarray
    scales: np.ndarray
    mins: np.ndarray | None


@dataclass(frozen=True)
class BlockLayout:
    name: str
    block_bytes: int
    block_weights: int
    kernel: str          # "q4" (modelexport::linear_q4) | "q8" (modelexport::linear_q8)
    decode: Callable     # uint8 [N, blocks, block_bytes] → StoredRows
    exact: bool = True   # False: the decode re-quantizes (its loss is measured)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0]


def _low_high(qs: np.ndarray) -> np.ndarray:
    """16 bytes per block → the block's 32 nibbles: the low ones, then the high ones."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _flat(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v.reshape(v.shape[0], -1))


def _q4_0(b):
    return StoredRows("q4", _flat(_low_high(b[..., 2:18])), _f16(b, 0), None)


def _q4_1(b):
    return StoredRows("q4", _flat(_low_high(b[..., 4:20])), _f16(b, 0), _f16(b, 2))


def _q8_0(b):
    return StoredRows("q8", _flat(np.ascontiguousarray(b[..., 2:34]).view(np.int8)), _f16(b, 0), None)


def _five_bits(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: 4 bytes of high bits (bit i: value i) and 16 of nibbles → values 0..31."""
    high = (np.ascontiguousarray(qh).view(np.uint32) >> np.arange(32, dtype=np.uint32)) & 1
    return _low_high(qs) | (high.astype(np.uint8) << 4)


def _q5_0(b):
    x = _five_bits(b[..., 2:6], b[..., 6:22])
    return StoredRows("q8", _flat(x.astype(np.int8) - np.int8(16)), _f16(b, 0), None)


def _q5_1(b):
    return StoredRows("q8", _flat(_five_bits(b[..., 4:8], b[..., 8:24]).astype(np.int8)), _f16(b, 0), _f16(b, 2))


def _k_scales(b):
    """A K-quant super-block's 8 (scale, min) pairs as float32 products: d*sc, -(dmin*mn)."""
    from gguf.quants import Q4_K
    n, nb = b.shape[:2]
    sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(b[..., 4:16]).reshape(n * nb, 12))
    d, dmin = _f16(b, 0).astype(np.float32)[..., None], _f16(b, 2).astype(np.float32)[..., None]
    return (d * sc.reshape(n, nb, 8).astype(np.float32)).reshape(n, -1), \
        -(dmin * mn.reshape(n, nb, 8).astype(np.float32)).reshape(n, -1)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes → 256 values 0..15: per 32 bytes, one sub-block's in the low nibbles, the next's high."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return np.concatenate([chunks & 15, chunks >> 4], axis=-2)       # [..., 4, 2, 32]


def _q4_k(b):
    scales, mins = _k_scales(b)
    return StoredRows("q4", _flat(_k_nibbles(b[..., 16:144])), scales, mins)


def _q5_k(b):
    high = (b[..., 16:48][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1      # [..., 8, 32]
    x = _k_nibbles(b[..., 48:176]).reshape(*b.shape[:-1], 8, 32) | (high << 4)
    scales, mins = _k_scales(b)
    return StoredRows("q8", _flat(x.astype(np.int8)), scales, mins)


def to_8bit(w: np.ndarray) -> StoredRows:
    """float32 [N, K] → 8-bit blocks of 32 (a float16 scale max|w|/127 each): the nearest layout
    our kernels hold to one they cannot hold as stored."""
    blocks = w.reshape(w.shape[0], -1, BLOCK)
    scales = (np.abs(blocks).max(-1) / 127).astype(np.float16)
    s = scales.astype(np.float32)[..., None]
    q = np.clip(np.round(np.divide(blocks, s, out=np.zeros_like(blocks), where=s > 0)), -127, 127)
    return StoredRows("q8", _flat(q.astype(np.int8)), scales, None)


def _q6_k_as_8bit(b):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    return to_8bit(dequantize(np.ascontiguousarray(b).reshape(b.shape[0], -1), GGMLQuantizationType.Q6_K))


LAYOUTS = {layout.name: layout for layout in (
    BlockLayout("Q4_0", 18, BLOCK, "q4", _q4_0),
    BlockLayout("Q4_1", 20, BLOCK, "q4", _q4_1),
    BlockLayout("Q4_K", 144, SUPER, "q4", _q4_k),
    BlockLayout("Q8_0", 34, BLOCK, "q8", _q8_0),
    BlockLayout("Q5_0", 22, BLOCK, "q8", _q5_0),
    BlockLayout("Q5_1", 24, BLOCK, "q8", _q5_1),
    BlockLayout("Q5_K", 176, SUPER, "q8", _q5_k),
    BlockLayout("Q6_K", 210, SUPER, "q8", _q6_k_as_8bit, exact=False),
)}


def rows_weight(rows: StoredRows) -> np.ndarray:
    """The float32 weight [N, K] `rows` stand for: scale * value + min per block of 32."""
    n = rows.values.shape[0]
    v = rows.values.astype(np.float32).reshape(n, -1, BLOCK)
    s = rows.scales.astype(np.float32)
    m = _no_min(rows.kernel, s) if rows.mins is None else rows.mins.astype(np.float32)
    return (s[..., None] * v + m[..., None]).reshape(n, -1)


def _no_min(kernel: str, scales: np.ndarray) -> np.ndarray:
    """The min a layout without one stands for: -8d (4-bit, values stored +8), 0 (8-bit)."""
    return -8 * scales if kernel == "q4" else np.zeros_like(scales)


def _as_8bit(rows: StoredRows) -> StoredRows:
    """4-bit rows held by the 8-bit kernel, exactly (u in 0..15 is an int8; no min: u - 8)."""
    if rows.kernel == "q8":
        return rows
    values = rows.values.astype(np.int8) - np.int8(0 if rows.mins is not None else 8)
    return StoredRows("q8", values, rows.scales, rows.mins)


def join_rows(parts: list[StoredRows]) -> StoredRows:
    """Rows of several layouts as one weight, exactly: 4-bit rows as 8-bit beside 8-bit ones,
    float16 widened to float32 where the parts differ, a min made explicit where one part has mins."""
    if len(parts) == 1:
        return parts[0]
    if len({p.kernel for p in parts}) > 1:
        parts = [_as_8bit(p) for p in parts]
    kernel = parts[0].kernel
    wide = np.float32 if any(p.scales.dtype == np.float32 for p in parts) else np.float16
    any_mins = any(p.mins is not None for p in parts)
    scales = np.concatenate([p.scales.astype(wide) for p in parts])
    mins = None if not any_mins else np.concatenate([
        (p.mins if p.mins is not None else _no_min(kernel, p.scales.astype(np.float32))).astype(wide) for p in parts])
    return StoredRows(kernel, np.concatenate([p.values for p in parts]), scales, mins)


def kernel_module(rows: StoredRows, bias):
    """Our kernel's module computing `rows` as stored."""
    import torch

    from .kernels.linear_q4_op import Q4Linear, Q8Linear, pack_int4
    t = torch.from_numpy
    mins = None if rows.mins is None else t(rows.mins.copy())
    if rows.kernel == "q4":
        packed = pack_int4(t(rows.values.astype(np.int8) - np.int8(8)))
        return Q4Linear.from_blocks(packed, t(rows.scales.copy()), mins, bias)
    return Q8Linear(t(rows.values.copy()), t(rows.scales.copy()), bias, mins)


def module_of(name: str, blocks: np.ndarray, bias):
    """The module of one layout's blocks (uint8 [N, blocks, block bytes])."""
    return kernel_module(LAYOUTS[name].decode(blocks), bias)


