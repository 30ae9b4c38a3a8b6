"""The static decoder's attention: q/k/v from HF's projections (fused ones split into views), RoPE,
the KV cache joined, GQA heads repeated, the sliding-window bias, and the float core."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)
from torch import nn

from ...frontends.llm_families import LLMFamily
from .graph_io import DecoderSpec, StaticDecoderConfig
from .rope import apply_rope

def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, kv, a, b] -> [B, kv*n_rep, a, b], each KV head repeated n_rep times in a row."""
    if n_rep == 1:
        return x
    b, kv, s1, s2 = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s1, s2).reshape(b, kv * n_rep, s1, s2)


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


class WindowBias(nn.Module):
    """The extra additive mask [1, 1, N, C] of a sliding-window layer: closes every column whose
    position is `window` or more behind the row's.

    Genie feeds one attention_mask, so a local layer's mask is derived in the graph from the
    positions instead of being a second input: cache column j holds position j (see the module
    docstring), the last N columns the chunk's own positions. Only ops the HTP runs in float:
    a Gather of the positions as floats, Sub, Clip, Mul. Positions are exact in fp32 and up to
    2048 in fp16; beyond that an fp16 graph may move the window's edge by one position.
    """

    def __init__(self, window: int, cfg: StaticDecoderConfig):
        super().__init__()
        self.window = int(window)
        self.mask_value = cfg.mask_value
        self.register_buffer("positions", torch.arange(cfg.max_seq_len, dtype=torch.float32)[:, None],
                             persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        q = F.embedding(position_ids, self.positions)                       # [1, N, 1]
        cache_len = self.positions.shape[0] - position_ids.shape[-1]       # static once exported; any N eagerly
        k = torch.cat([self.positions[:cache_len, 0][None], q[:, :, 0]], dim=-1)  # [1, C]
        too_old = torch.clamp(q - k[:, None, :] - (self.window - 1), 0.0, 1.0)  # 1 where q - k >= window
        return (too_old * self.mask_value).unsqueeze(1)                     # [1, 1, N, C]


@dataclass(frozen=True)
class LayerPlan:
    """What one layer does, resolved from the family's row and the model's config."""

    rope_slot: int | None      # index into PositionInputs' tables; None = no position encoding (NoPE)
    window_bias: int | None    # the window whose bias this layer adds to the mask; None = the global mask


class AttentionCore(nn.Module):
    """softmax(q.k^T * scaling (soft-capped) + mask) . v, heads joined: its own module so the compiled
    graphs can keep it float (`/self_attn/core/`, quant/llm_graphs.FLOAT_NODES). The HTP takes the
    second input of a MatMul of two 16-bit activations at 8 bits (bench/experiments/htp_matmul_precision.py)."""
    def __init__(self, scaling: float, softcap: float | None):
        super().__init__()
        self.scaling = float(scaling)
        self.softcap = softcap

    def forward(self, q, keys, values, mask):
        b, _, n, _ = q.shape
        scores = soft_cap(torch.matmul(q, keys) * self.scaling, self.softcap) + mask      # [B, H, N, C]
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, values).transpose(1, 2).reshape(b, n, q.shape[1] * q.shape[3])


class StaticAttention(nn.Module):
    def __init__(self, hf_attn: nn.Module, family: LLMFamily, spec: DecoderSpec, plan: LayerPlan,
                 norm: functools.partial, scaling: float, softcap: float | None):
        super().__init__()
        # HF's own projection modules, under HF's names; a fused one (Phi-3's qkv_proj) is split into
        # q/k/v views of its rows (see `split_rows`)
        n_q, n_kv = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
        q_k_v = (split_rows(hf_attn.qkv_proj, [n_q, n_kv, n_kv]) if family.fused_qkv
                 else (hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj))
        self.q_proj, self.k_proj, self.v_proj = q_k_v
        self.o_proj = hf_attn.o_proj
        if family.qk_norm:
            self.q_norm, self.k_norm = norm(hf_attn.q_norm.weight), norm(hf_attn.k_norm.weight)
        self.qk_norm = family.qk_norm
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.n_rep = spec.n_heads // spec.n_kv_heads
        self.core = AttentionCore(scaling, softcap)
        self.plan = plan

    def forward(self, x, rope, window_bias, mask, k_cache, v_cache):
        b, n, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, n, self.n_heads, self.head_dim)
        k = k.view(b, n, self.n_kv_heads, self.head_dim)
        if self.qk_norm:   # over each head, before RoPE (Qwen3, Gemma 3)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)                                       # [B, H|KV, N, D]
        v = v.view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)                 # [B, KV, N, D]
        if self.plan.rope_slot is not None:
            cos, sin = rope[self.plan.rope_slot]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_new = k.transpose(2, 3)                                                         # [B, KV, D, N]
        if k_cache is None:   # the full-context graph: the chunk is the whole context
            keys, values = repeat_kv(k_new, self.n_rep), repeat_kv(v, self.n_rep)
        else:
            keys = repeat_kv(torch.cat([k_cache, k_new], dim=-1), self.n_rep)            # [B, H, D, C]
            values = repeat_kv(torch.cat([v_cache, v], dim=2), self.n_rep)               # [B, H, C, D]
        if self.plan.window_bias is not None:
            mask = mask + window_bias[self.plan.window_bias]
        return self.o_proj(self.core(q, keys, values, mask)), k_new, v


def split_rows(fused: nn.Linear, sizes: list[int]) -> list[nn.Linear]:
    """A fused projection as one Linear per block of rows, each weight a view of the fused one (no copy).

    Why not one matmul and a Split: ONNX Runtime's quantizer gives a Split's outputs its input's
    scale, so v would leave the graph with the q|k|v range, one per graph, while Genie needs each
    cache tensor quantized alike in every graph ("Non-identical quantization parameters"). Separate
    matmuls also give q, k, v (gate, up) their own ranges."""
    weights = fused.weight.detach().split(sizes)
    biases = fused.bias.detach().split(sizes) if fused.bias is not None else [None] * len(sizes)
    out = []
    for w, b in zip(weights, biases):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
        lin.weight = nn.Parameter(w, requires_grad=False)
        if b is not None:
            lin.bias = nn.Parameter(b, requires_grad=False)
        out.append(lin)
    return out
