"""A GGUF's quantized weights carried into the CPU program as the file stores them.

The program is built from the HF model transformers makes of the GGUF (weights dequantized to
float32, q/k rows permuted for HF's RoPE layout, q|k|v and gate|up later stacked by our fusions).
Every row of such a weight is one row of a GGUF tensor, dequantized exactly, so a weight's rows
are found again by content: each row of every GGUF matrix of a layout below is dequantized once
with `gguf.quants.dequantize` and indexed by a hash of its float32 bytes. A Linear whose rows are
all found in one layout gets those rows' stored blocks (the row order of the HF weight, whatever
permutation or stacking made it), and our kernels compute them exactly; anything else (a K-quant,
F16, rows of different layouts) is left to the caller's re-quantization, counted, and its loss
measured against the file's values (`requantized`, shown by `inspect`).

Layouts kept as stored (llama.cpp's ggml-common.h; 32 weights per block):
- Q4_0: d (float16), 16 bytes of nibbles u: W = d * (u - 8)
- Q4_1: d, m (float16), 16 bytes of nibbles u: W = d * u + m
- Q8_0: d (float16), 32 int8 values q: W = d * q (also the token embedding, as an 8-bit lookup)
The nibble order (byte j: value j low, value 16 + j high) is the one our 4-bit kernel reads.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK = 32


@dataclass(frozen=True)
class BlockLayout:
    name: str
    block_bytes: int
    module: Callable     # (blocks uint8 [N, K/32, block_bytes], bias) → the Linear's module


def _f16(blocks: np.ndarray, at: int):
    import torch
    return torch.from_numpy(np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].copy())


def _nibbles(blocks: np.ndarray, at: int):
    import torch
    n = blocks.shape[0]
    return torch.from_numpy(np.ascontiguousarray(blocks[..., at:at + 16]).reshape(n, -1).copy())


def _q4_0(blocks, bias):
    from .kernels.linear_q4_op import Q4Linear
    return Q4Linear.from_blocks(_nibbles(blocks, 2), _f16(blocks, 0), None, bias)


def _q4_1(blocks, bias):
    from .kernels.linear_q4_op import Q4Linear
    return Q4Linear.from_blocks(_nibbles(blocks, 4), _f16(blocks, 0), _f16(blocks, 2), bias)


def _q8_values(blocks):
    import torch
    n = blocks.shape[0]
    return torch.from_numpy(np.ascontiguousarray(blocks[..., 2:34]).view(np.int8).reshape(n, -1).copy())


def _q8_0(blocks, bias):
    from .kernels.linear_q4_op import Q8Linear
    return Q8Linear(_q8_values(blocks), _f16(blocks, 0), bias)


LAYOUTS = {layout.name: layout for layout in (
    BlockLayout("Q4_0", 18, _q4_0),
    BlockLayout("Q4_1", 20, _q4_1),
    BlockLayout("Q8_0", 34, _q8_0),
)}


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
        self._loss = [0.0, 0.0]                   # re-quantized weights: sum of w^2, sum of (w' - w)^2
        self._worst_db: float | None = None

    def blocks_of(self, weight) -> tuple[str, np.ndarray] | None:
        """(layout name, uint8 [N, K/32, block bytes]) holding `weight` [N, K] exactly, or None."""
        w = weight.detach().float().contiguous().numpy()
        if w.ndim != 2 or w.shape[1] % BLOCK:
            return None
        found = [self._rows.get(_row_key(row)) for row in w]
        if not found or any(f is None for f in found):
            return None
        layouts = {self._tensors[name][0] for name, _ in found}
        if len(layouts) != 1:
            return None
        layout = LAYOUTS[layouts.pop()]
        rows = np.stack([self._tensors[name][1][i] for name, i in found])
        return layout.name, rows.reshape(w.shape[0], w.shape[1] // BLOCK, layout.block_bytes)

    def linear(self, linear):
        """Our kernel's module for `linear` from its stored blocks, or None (the caller re-quantizes)."""
        got = self.blocks_of(linear.weight)
        if got is None:
            return None
        name, blocks = got
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.used[name] += 1
        return LAYOUTS[name].module(blocks, bias)

    def embedding(self, embedding):
        """An 8-bit lookup holding a Q8_0 token embedding as stored, or None."""
        import torch
        from executorch.examples.models.llama.source_transformation.quantize import (
            QuantizedGroupEmbedding,
        )

        got = self.blocks_of(embedding.weight)
        if got is None or got[0] != "Q8_0":
            return None
        blocks = got[1]
        vocab, dim = embedding.weight.shape
        emb = QuantizedGroupEmbedding(device="cpu", vocab_size=vocab, embedding_dim=dim, group_size=BLOCK,
                                      dtype=torch.float32, packed=False, bitwidth=8)
        emb.weight = _q8_values(blocks)
        emb.scales = _f16(blocks, 0)
        self.used["Q8_0 embedding"] += 1
        return emb

    def requantized(self, weight, approx) -> None:
        """Count a weight the program re-quantizes (`approx`: the values it computes instead), and
        its loss: the file's values against ours, as a signal-to-noise ratio."""
        import math
        w, e = weight.detach().double(), approx.detach().double() - weight.detach().double()
        signal, noise = float((w * w).sum()), float((e * e).sum())
        self.used["requantized"] += 1
        self._loss[0] += signal
        self._loss[1] += noise
        db = 10 * math.log10(signal / noise) if noise > 0 else math.inf
        self._worst_db = db if self._worst_db is None else min(self._worst_db, db)

    def summary(self) -> dict:
        """What the program holds, for its metadata: per layout, how many weights kept as stored,
        and what re-quantizing the others lost (weight SQNR in dB: all of them, and the worst)."""
        import math
        out = {"file_types": dict(self.types), "kept_as_stored": dict(self.used)}
        if self._worst_db is not None:
            signal, noise = self._loss
            out["requantized_weight_sqnr_db"] = {
                "all": round(10 * math.log10(signal / noise), 2) if noise > 0 else None,
                "worst": round(self._worst_db, 2) if math.isfinite(self._worst_db) else None}
        return out
