"""A GGUF's quantized weights carried into the CPU program as the file stores them.

The program is built from the HF model transformers makes of the GGUF (weights dequantized to
float32, q/k rows permuted for HF's RoPE layout, q|k|v and gate|up later stacked by our fusions).
Every row of such a weight is one row of a GGUF tensor, dequantized exactly, so a weight's rows
are found again by content: each row of every GGUF matrix of a layout below is dequantized once
with `gguf.quants.dequantize` and indexed by a hash of its float32 bytes. A Linear whose rows are
all found in the layouts below gets those rows' stored values, scales and mins (in the row
order of the HF weight, whatever permutation or stacking made it; rows of several layouts, e.g.
a Q4_K_M file's Q5_0 q/k beside its Q8_0 v, are joined exactly: float16 scales widened to
float32, a min of 0 or -8d made explicit, 4-bit rows held by the 8-bit kernel when 8-bit rows
are beside them), and our kernels compute them exactly. A Q6_K row (a scale per 16 weights: no
block of 32 holds it with one scale) is the one layout re-quantized on the way, to the nearest
our kernels hold, 8 bits per 32 (its loss measured and stated, ~20 dB below Q6_K's own
rounding); anything else (F16, Q2_K, Q3_K, IQ*) is left to the caller's 4-bit re-quantization,
counted, and its loss measured against the file's values (`requantized`, shown by `inspect`).

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

import hashlib
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


def _row_key(row: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.float32).tobytes(), digest_size=16).digest()


class GgufBlocks:
    """The stored blocks of a GGUF's matrices in a layout of `LAYOUTS`, found by a weight's rows."""

    def __init__(self, path: str | Path):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        from ...frontends.gguf_file import read_gguf_matrices

        self.types: Counter = Counter()          # GGML type of every matrix in the file
        self._tensors: dict[str, tuple[str, np.ndarray]] = {}
        self._rows: dict[bytes, tuple[str, int]] = {}
        for name, (type_name, data) in read_gguf_matrices(path).items():
            self.types[type_name] += 1
            if type_name not in LAYOUTS:
                continue
            self._tensors[name] = (type_name, data)
            values = dequantize(np.asarray(data), GGMLQuantizationType[type_name])
            for i, row in enumerate(values):
                self._rows.setdefault(_row_key(row), (name, i))
        self.used: Counter = Counter()           # what the program got: layout name or "requantized"
        self._requantized = WeightLoss()          # weights the caller re-quantized (4-bit)
        self._nearest = WeightLoss()              # weights holding rows re-quantized to 8-bit here

    def blocks_of(self, weight) -> tuple[str, StoredRows] | None:
        """(the layouts' names, joined by +, a re-quantized one marked "as 8-bit"; the stored rows
        of `weight` [N, K] in its row order), or None when a row is not in a layout of `LAYOUTS`."""
        w = weight.detach().float().contiguous().numpy()
        if w.ndim != 2 or w.shape[1] % BLOCK:
            return None
        found = [self._rows.get(_row_key(row)) for row in w]
        if not found or any(f is None for f in found):
            return None
        by_tensor: dict[str, list[int]] = {}
        for position, (name, _) in enumerate(found):
            by_tensor.setdefault(name, []).append(position)
        kinds = {self._tensors[name][0] for name in by_tensor}
        parts, positions = [], []
        for name, where in by_tensor.items():
            kind, data = self._tensors[name]
            layout = LAYOUTS[kind]
            raw = np.asarray(data)[[found[p][1] for p in where]]
            parts.append(layout.decode(raw.reshape(len(where), -1, layout.block_bytes)))
            positions.extend(where)
        joined = join_rows(parts)
        order = np.argsort(np.asarray(positions))             # back to the weight's row order
        if not np.array_equal(order, np.arange(len(order))):
            joined = StoredRows(joined.kernel, joined.values[order], joined.scales[order],
                                None if joined.mins is None else joined.mins[order])
        return "+".join(sorted(k if LAYOUTS[k].exact else f"{k} as 8-bit" for k in kinds)), joined

    def _record(self, label: str, weight, rows: StoredRows) -> None:
        """Count what a module got; where rows were re-quantized on the way, their loss."""
        self.used[label] += 1
        if "as 8-bit" in label:
            self._nearest.add(weight.detach().double(), torch_of(rows_weight(rows)))

    def linear(self, linear):
        """Our kernel's module for `linear` from its stored blocks, or None (the caller re-quantizes)."""
        got = self.blocks_of(linear.weight)
        if got is None:
            return None
        name, rows = got
        bias = None if linear.bias is None else linear.bias.detach().float()
        self._record(name, linear.weight, rows)
        return kernel_module(rows, bias)

    def embedding(self, embedding):
        """An 8-bit lookup holding a token embedding stored as 8-bit values with a float16 scale
        per 32 and no min (Q8_0, Q5_0), or None."""
        import torch
        from executorch.examples.models.llama.source_transformation.quantize import (
            QuantizedGroupEmbedding,
        )

        got = self.blocks_of(embedding.weight)
        if got is None or got[1].kernel != "q8" or got[1].mins is not None or got[1].scales.dtype != np.float16:
            return None
        name, rows = got
        vocab, dim = embedding.weight.shape
        emb = QuantizedGroupEmbedding(device="cpu", vocab_size=vocab, embedding_dim=dim, group_size=BLOCK,
                                      dtype=torch.float32, packed=False, bitwidth=8)
        emb.weight = torch.from_numpy(rows.values.copy())
        emb.scales = torch.from_numpy(rows.scales.copy())
        self._record(f"{name} embedding", embedding.weight, rows)
        return emb

    def requantized(self, weight, approx) -> None:
        """Count a weight the program re-quantizes (`approx`: the values it computes instead), and
        its loss: the file's values against ours, as a signal-to-noise ratio."""
        self.used["requantized"] += 1
        self._requantized.add(weight.detach().double(), approx.detach().double())

    def summary(self) -> dict:
        """What the program holds, for its metadata: per layout, how many weights kept as stored,
        and what re-quantizing the others lost (weight SQNR in dB: all of them, and the worst):
        to 4 bits by the caller, to 8 bits here (Q6_K rows)."""
        out = {"file_types": dict(self.types), "kept_as_stored": dict(self.used)}
        for key, loss in (("requantized_weight_sqnr_db", self._requantized),
                          ("nearest_8bit_weight_sqnr_db", self._nearest)):
            if loss.count:
                out[key] = loss.summary()
        return out


def torch_of(a: np.ndarray):
    import torch
    return torch.from_numpy(np.ascontiguousarray(a)).double()


class WeightLoss:
    """What replacing weights by other values lost, over all of them and at the worst: SQNR in dB."""

    def __init__(self):
        self.count, self.signal, self.noise = 0, 0.0, 0.0
        self.worst_db = math.inf

    def add(self, weight, approx) -> None:
        e = approx - weight
        signal, noise = float((weight * weight).sum()), float((e * e).sum())
        self.count += 1
        self.signal += signal
        self.noise += noise
        self.worst_db = min(self.worst_db, 10 * math.log10(signal / noise) if noise > 0 else math.inf)

    def summary(self) -> dict:
        return {"all": round(10 * math.log10(self.signal / self.noise), 2) if self.noise > 0 else None,
                "worst": round(self.worst_db, 2) if math.isfinite(self.worst_db) else None}
