"""`modelexport::sdpa`: the export-time side of `sdpa.cpp` (schema, reference, shape function)
and the module that puts it in place of ExecuTorch's `SDPACustom` in an LLM.

Same contract as `llama::custom_sdpa(q, k_cache, v_cache, start_pos, None, 0, True)`: the first
`q_heads` heads of query [1, n, >=q_heads, D] at positions start_pos..start_pos+n-1 over the KV
cache [1, S, Hkv, D] (already updated with the new entries), causal, scale 1/sqrt(D); out
[1, n, q_heads, D]. Taking the first heads only lets a fused q|k|v projection go in unsliced. The reference below
is what eager runs and what the tests compare the C++ kernel with.
"""
from __future__ import annotations

import math
import types

import torch

_LIB = torch.library.Library("modelexport", "FRAGMENT")
_LIB.define("sdpa(Tensor query, Tensor key_cache, Tensor value_cache, SymInt start_pos, int q_heads) -> Tensor")
_LIB.define("sdpa.out(Tensor query, Tensor key_cache, Tensor value_cache, SymInt start_pos, int q_heads, *, "
            "Tensor(a!) out) -> Tensor(a!)")


def sdpa_reference(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   start_pos: int, q_heads: int | None = None) -> torch.Tensor:
    query = query[:, :, :q_heads] if q_heads else query
    _, n, heads, dim = query.shape
    reps = heads // key_cache.shape[2]
    length = int(start_pos) + n
    k = key_cache[0, :length].repeat_interleave(reps, dim=1).float()     # [L, H, D]
    v = value_cache[0, :length].repeat_interleave(reps, dim=1).float()
    scores = torch.einsum("nhd,lhd->hnl", query[0].float(), k) / math.sqrt(dim)
    allowed = torch.arange(length)[None, :] <= (int(start_pos) + torch.arange(n))[:, None]   # [n, L]
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)
    return out.unsqueeze(0).to(query.dtype).contiguous()


@torch.library.impl(_LIB, "sdpa", "CompositeExplicitAutograd")
def _sdpa(query, key_cache, value_cache, start_pos, q_heads):
    return sdpa_reference(query, key_cache, value_cache, start_pos, q_heads)


@torch.library.impl(_LIB, "sdpa.out", "CompositeExplicitAutograd")
def _sdpa_out(query, key_cache, value_cache, start_pos, q_heads, *, out):
    ref = sdpa_reference(query, key_cache, value_cache, start_pos, q_heads)
    out.resize_(ref.shape).copy_(ref)
    return out


@torch.library.register_fake("modelexport::sdpa")
def _sdpa_fake(query, key_cache, value_cache, start_pos, q_heads):
    return query.new_empty((query.shape[0], query.shape[1], q_heads, query.shape[3]))


@torch.library.register_fake("modelexport::sdpa.out")
def _sdpa_out_fake(query, key_cache, value_cache, start_pos, q_heads, *, out):
    return out


def _fused_attention_forward(self, x, freqs_cos, freqs_sin, **kwargs):
    """ExecuTorch's `AttentionMHA.forward` (KV cache, dynamic shape, no mask) with one q|k|v
    projection: the q/k norms (if any) run once over all heads (the value heads get factor 1),
    then RoPE once over all heads (the value heads get cos 1, sin 0; a NoPE layer skips it), the
    cache is updated with the k and v heads, and `modelexport::sdpa` reads the q heads in place."""
    input_pos = kwargs["input_pos"]
    bsz, seqlen, _ = x.shape
    h, hkv, d = self.n_local_heads, self.n_local_kv_heads, self.head_dim
    rope = self.rope
    qkv = self.wqkv(x).view(bsz, seqlen, h + 2 * hkv, d)
    if self.qk_norm_weight is not None:   # RMSNorm of each q and k head, as ExecuTorch's q_norm_fn/k_norm_fn
        x4 = qkv.reshape(1, -1, d, 1)     # the mean over the inner dims of a 4-D view: what XNNPACK takes
        r = torch.rsqrt((x4 * x4).mean((2, 3), keepdim=True) + self.qk_norm_eps).reshape(bsz, -1, h + 2 * hkv, 1)
        qkv = qkv * (r * self.qk_norm_heads + self.qk_plain_heads) * self.qk_norm_weight
    if self.use_rope:
        cos = freqs_cos.unsqueeze(1) * rope.rotary_heads + rope.plain_heads     # [n, heads, d]
        sin = freqs_sin.unsqueeze(1) * rope.rotary_heads
        qkv = qkv * cos + torch.nn.functional.linear(qkv, rope.rotate_half_matrix) * sin
    start_pos = input_pos[-1].item()
    torch._check(start_pos >= 0)
    torch._check(start_pos < self.max_context_len)
    torch.ops.llama.update_cache(qkv[:, :, h:h + hkv], self.kv_cache.k_cache, start_pos)
    torch.ops.llama.update_cache(qkv[:, :, h + hkv:], self.kv_cache.v_cache, start_pos)
    if self.explicit_scores is None:
        out = torch.ops.modelexport.sdpa(qkv, self.kv_cache.k_cache, self.kv_cache.v_cache, start_pos, h)
    else:
        out = self.explicit_scores(qkv, self.kv_cache.k_cache, self.kv_cache.v_cache, start_pos, h)
    out = out.view(bsz, seqlen, h * d)
    residual = kwargs.get("residual")   # given by a fused block (linear_q4_op.fuse_blocks): wo adds it
    return (self.wo(out) if residual is None else self.wo(out, residual)), None


class ExplicitScores(torch.nn.Module):
    """`modelexport::sdpa`'s contract in torch ops, for the scores the kernel does not compute:
    a scale other than 1/sqrt(D), a tanh soft-cap (Gemma 2: cap * tanh(s / cap), before the mask
    as HF applies it) and a sliding window (a key `window` or more positions behind the query is
    masked). Attends over the whole cache (later positions masked): O(cache) per token."""

    def __init__(self, scale: float, softcap: float | None, window: int | None):
        super().__init__()
        self.scale, self.softcap, self.window = float(scale), softcap, window

    def describe(self) -> str:
        parts = [f"scale {self.scale:.6g}"]
        if self.softcap is not None:
            parts.append(f"soft-cap {self.softcap:g}")
        if self.window is not None:
            parts.append(f"window {self.window}")
        return ", ".join(parts)

    def forward(self, query, key_cache, value_cache, start_pos, q_heads: int):
        _, n, _, d = query.shape
        s, hkv = key_cache.shape[1], key_cache.shape[2]
        reps = q_heads // hkv
        q = query[0, :, :q_heads].reshape(-1, hkv, reps, d).permute(1, 2, 0, 3).reshape(hkv, -1, d)  # [kv, r*n, d]
        k = key_cache[0].permute(1, 2, 0)                                                          # [kv, d, S]
        scores = torch.bmm(q, k) * self.scale
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        key_pos = torch.arange(s)[None, :]
        query_pos = (torch.arange(n) + start_pos)[:, None]
        allowed = key_pos <= query_pos                                                              # [n, S]
        if self.window is not None:
            allowed = allowed & (query_pos - key_pos < self.window)
        scores = scores.view(hkv, reps, -1, s).masked_fill(~allowed, float("-inf"))
        probs = scores.softmax(-1).reshape(hkv, -1, s)
        out = torch.bmm(probs, value_cache[0].permute(1, 0, 2))                                    # [kv, r*n, d]
        return out.reshape(hkv, reps, -1, d).permute(2, 0, 1, 3).reshape(1, -1, q_heads, d).contiguous()


def _norm_weight(norm) -> torch.Tensor:
    """The factor ExecuTorch's RMSNorm multiplies by: w, or 1 + w (Gemma's offset)."""
    w = norm.weight.detach().float()
    return 1.0 + w if norm.add_unit_offset else w


def _qk_norms_fit(a) -> bool:
    """No q/k norms, or affine RMSNorms before RoPE with one eps and no extra query scale."""
    from executorch.examples.models.llama.norm import RMSNorm

    return not a.use_qk_norm or (type(a.q_norm_fn) is RMSNorm and type(a.k_norm_fn) is RMSNorm
                                 and a.qk_norm_before_rope and a.q_norm_fn.eps == a.k_norm_fn.eps
                                 and a.scale_query_by == 1.0)


def _qk_norm_buffers(a, h: int, hkv: int) -> None:
    """Per-head factors of the fused q|k|v rows: the q norm's weight on the q heads, the k norm's
    on the k heads, 1 on the v heads (which are not normalized: `qk_plain_heads` keeps them)."""
    a.register_buffer("qk_norm_weight", None)
    if not a.use_qk_norm:
        return
    d = a.head_dim
    weight = torch.cat([_norm_weight(a.q_norm_fn).expand(h, d), _norm_weight(a.k_norm_fn).expand(hkv, d),
                        torch.ones(hkv, d)])
    normed = torch.zeros(h + 2 * hkv, 1)
    normed[:h + hkv] = 1.0
    a.register_buffer("qk_norm_weight", weight.contiguous(), persistent=False)
    a.register_buffer("qk_norm_heads", normed, persistent=False)
    a.register_buffer("qk_plain_heads", 1.0 - normed, persistent=False)
    a.qk_norm_eps = float(a.q_norm_fn.eps)
    a.q_norm_fn = a.k_norm_fn = None


def fuse_qkv_attention(model: torch.nn.Module, explicit_scores: list | None = None) -> int:
    """Give every attention layer of ExecuTorch's `Transformer` (custom KV cache, HF rotate-half
    RoPE written as `rotate_half_matrix`, or none in a NoPE layer; q/k RMSNorms before RoPE
    allowed) one fused q|k|v linear and the forward above. The fused weight is the three stacked,
    so per-row quantization is unchanged; XNNPACK runs one wider GEMM instead of three (the k and
    v ones are narrow and slow), the q/k norms and RoPE once. Returns how many layers were fused
    (0: the model has something this does not cover). `explicit_scores`: per layer, None (the
    kernel) or an `ExplicitScores` to attend with instead."""
    from executorch.examples.models.llama.attention import AttentionMHA
    from executorch.examples.models.llama.source_transformation.custom_kv_cache import CustomKVCache

    rope = getattr(model, "rope", None)
    layers = [m for m in model.modules() if isinstance(m, AttentionMHA)]
    plain = all(type(a.kv_cache) is CustomKVCache and (a.rope is rope or getattr(a.rope, "is_identity", False))
                and a.enable_dynamic_shape and not (a.use_q_gate or a.use_attn_o_gate or a.use_attn_o_norm)
                and a.num_kv_shared_layers == 0 and _qk_norms_fit(a) for a in layers)
    if not layers or not plain or rope is None or not hasattr(rope, "rotate_half_matrix"):
        return 0
    h, hkv = layers[0].n_local_heads, layers[0].n_local_kv_heads
    rotary = torch.zeros(h + 2 * hkv, 1)
    rotary[:h + hkv] = 1.0
    rope.register_buffer("rotary_heads", rotary, persistent=False)
    rope.register_buffer("plain_heads", 1.0 - rotary, persistent=False)
    for i, a in enumerate(layers):
        a.explicit_scores = explicit_scores[i] if explicit_scores else None
        _qk_norm_buffers(a, h, hkv)
        a.use_rope = a.rope is rope
        a.rope = rope
        w = torch.cat([a.wq.weight, a.wk.weight, a.wv.weight])
        biases = [lin.bias for lin in (a.wq, a.wk, a.wv)]
        fused = torch.nn.Linear(w.shape[1], w.shape[0], bias=biases[0] is not None)
        with torch.no_grad():
            fused.weight.copy_(w)
            if fused.bias is not None:
                fused.bias.copy_(torch.cat(biases))
        a.wqkv = fused
        a.wq = a.wk = a.wv = None
        a.forward = types.MethodType(_fused_attention_forward, a)
    return len(layers)
