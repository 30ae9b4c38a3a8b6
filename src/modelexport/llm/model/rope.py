"""RoPE as the static decoder computes it: cos/sin tables gathered by position (M-RoPE: by section
and axis) and HF's rotate-half form applied to the halves (see static_decoder.py's docstring)."""
from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)
from torch import nn

from ...core.errors import UnsupportedError
from .mrope import AXES

def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotate-half RoPE on [B, H, N, D] with half tables cos/sin [B, 1, N, R/2]: the first R
    dims rotate, the rest pass through (partial rotary, Phi-4-mini: R = 0.75 D)."""
    rot = 2 * cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)
    half = rot // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RotaryTables(nn.Module):
    """cos/sin [max_seq_len, rotary_dim/2] (attention scaling folded in), gathered by position."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float, max_seq_len: int):
        super().__init__()
        # the same float32 product HF's rotary embedding computes, so the values are bit-identical
        freqs = torch.arange(max_seq_len, dtype=torch.float32)[:, None] * inv_freq.float()[None, :]
        self.register_buffer("cos", freqs.cos() * attention_scaling, persistent=False)
        self.register_buffer("sin", freqs.sin() * attention_scaling, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.embedding(position_ids, self.cos).unsqueeze(1), F.embedding(position_ids, self.sin).unsqueeze(1)


class MRopeTables(nn.Module):
    """M-RoPE (Qwen2-VL): the half tables' columns in `sections`, section i gathered at axis i % 3 of the
    3-axis positions [3, 1, N] and concatenated (transformers' `recomposition_frequencies`). One Gather
    per section of a table sliced at build time; with equal axes it is RotaryTables' lookup."""

    def __init__(self, table: RotaryTables, sections: tuple[int, ...]):
        super().__init__()
        bounds = np.cumsum((0, *sections))
        if bounds[-1] != table.cos.shape[1]:
            raise UnsupportedError(f"M-RoPE sections {list(sections)} do not add up to the RoPE table's {table.cos.shape[1]} dims")
        for i, (a, b) in enumerate(itertools.pairwise(bounds)):
            self.register_buffer(f"cos_{i}", table.cos[:, a:b].clone(), persistent=False)
            self.register_buffer(f"sin_{i}", table.sin[:, a:b].clone(), persistent=False)
        self.n_sections = len(sections)

    def forward(self, rope_position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        axis = [rope_position_ids[i % AXES] for i in range(self.n_sections)]                  # each [1, N]
        cos = torch.cat([F.embedding(axis[i], getattr(self, f"cos_{i}")) for i in range(self.n_sections)], dim=-1)
        sin = torch.cat([F.embedding(axis[i], getattr(self, f"sin_{i}")) for i in range(self.n_sections)], dim=-1)
        return cos.unsqueeze(1), sin.unsqueeze(1)                                               # [1, 1, N, R/2]


def rope_frequencies(hf_rotary: nn.Module, slot: str, head_dim: int) -> tuple[torch.Tensor, float]:
    """inv_freq and attention_scaling of one table, as HF's rotary module computed them at init
    through transformers' ROPE_INIT_FUNCTIONS (per layer type: `<type>_inv_freq`). The
    `original_` copy is taken when there is one: the frequencies for contexts up to the original
    length (longrope's short factor), before any runtime update."""
    prefix = f"{slot}_" if slot else ""
    inv_freq = getattr(hf_rotary, f"{prefix}original_inv_freq", None)
    if inv_freq is None:
        inv_freq = getattr(hf_rotary, f"{prefix}inv_freq")
    scaling = getattr(hf_rotary, f"{prefix}attention_scaling", 1.0)
    if isinstance(scaling, dict):
        scaling = scaling[slot]
    inv_freq = inv_freq.detach()
    if inv_freq.numel() * 2 > head_dim:
        raise UnsupportedError(f"the RoPE table has {inv_freq.numel() * 2} dims, more than the head's {head_dim}")
    return inv_freq, float(scaling)
