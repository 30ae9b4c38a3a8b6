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
our kernels hold, 8 bits per 32 (its loss measured and stated); anything else (F16, Q2_K, Q3_K, IQ*) is left to the caller's 4-bit re-quantization,
counted, and its loss measured against the file's values (`requantized`, shown by `inspect`).

The layouts and how each becomes one of our kernels' modules: `gguf_layouts.py`.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter
from pathlib import Path

import numpy as np

from ...frontends.gguf_file import read_gguf_matrices
from .gguf_layouts import (
    BLOCK,
    LAYOUTS,
    StoredRows,
    join_rows,
    kernel_module,
    rows_weight,
)


def _row_key(row: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.float32).tobytes(), digest_size=16).digest()


class GgufBlocks:
    """The stored blocks of a GGUF's matrices in a layout of `LAYOUTS`, found by a weight's rows."""

    def __init__(self, path: str | Path):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

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
