"""The static decoder's blocks besides attention: RMSNorm, the gated MLP, the decoder layer, the
residual scale, the token embedding (and the `both` input mode's join) and the soft-capped head."""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)
from torch import nn

from ...frontends.llm_families import LLMFamily
from .attention import LayerPlan, StaticAttention, soft_cap, split_rows
from .graph_io import DecoderSpec

# ---------------------------------------------------------------------------------------------
# building blocks: each picks its variant from the family's row (frontends/llm_families.py)

# The MLP gate activations of llm_families.ACTIVATIONS (HF's gelu_pytorch_tanh is torch's tanh GELU).
ACTIVATION_FNS = {"silu": F.silu, "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh")}


class RMSNorm(nn.Module):
    """RMSNorm sharing HF's weight; `form` picks the op sequence (see the module docstring).

    `offset` is added to the weight (1 for Gemma's x̂·(1+w); the sum is a constant once exported)."""

    def __init__(self, weight: nn.Parameter, eps: float, form: str, offset: float = 0.0):
        super().__init__()
        self.weight = weight
        self.eps = float(eps)
        self.form = form
        self.offset = float(offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight + self.offset if self.offset else self.weight
        if self.form == "aten":
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        if self.form == "scaled":   # |x / m| <= 8: squares stay far below fp16's maximum
            m = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4) / 8
            xs = x / m
            # eps / m² written as (√eps / m)²: for a row near zero (Gemma's BOS row into a post-norm, |x| ~ 1e-3)
            # m² underflows fp16 and eps / m² became inf on the HTP, the row's output 0 instead of x·w/√eps
            e = math.sqrt(self.eps) / m
            return xs * torch.rsqrt(torch.mean(xs * xs, dim=-1, keepdim=True) + e * e) * w
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * w


class StaticMLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); a fused gate_up_proj (Phi-3) is split into two views."""

    def __init__(self, hf_mlp: nn.Module, family: LLMFamily, activation: str):
        super().__init__()
        if family.fused_gate_up:
            half = hf_mlp.gate_up_proj.out_features // 2
            self.gate_proj, self.up_proj = split_rows(hf_mlp.gate_up_proj, [half, half])
        else:
            self.gate_proj, self.up_proj = hf_mlp.gate_proj, hf_mlp.up_proj
        self.down_proj = hf_mlp.down_proj
        self.act = ACTIVATION_FNS[activation]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class StaticDecoderLayer(nn.Module):
    """Pre-norm residual block; with `sandwich_norms` (Gemma) the attention and MLP outputs are
    normed too before they join the residual, and the MLP's input norm is `pre_feedforward_layernorm`."""

    def __init__(self, hf_layer: nn.Module, family: LLMFamily, spec: DecoderSpec, plan: LayerPlan,  # noqa: PLR0913
                 norm: functools.partial, stream_norm: functools.partial, residual_scale: float, activation: str,
                 scaling: float, softcap: float | None):
        super().__init__()
        self.sandwich = family.sandwich_norms
        self.input_layernorm = stream_norm(hf_layer.input_layernorm.weight)
        self.self_attn = StaticAttention(hf_layer.self_attn, family, spec, plan, norm, scaling, softcap)
        # Llama's post-attention norm reads the stream; Gemma's norms the attention output
        self.post_attention_layernorm = (norm if self.sandwich else stream_norm)(hf_layer.post_attention_layernorm.weight)
        if self.sandwich:
            self.pre_feedforward_layernorm = stream_norm(hf_layer.pre_feedforward_layernorm.weight)
            self.post_feedforward_layernorm = norm(hf_layer.post_feedforward_layernorm.weight)
        self.mlp = StaticMLP(hf_layer.mlp, family, activation)
        self.residual_scale = ResidualScale(residual_scale)

    def forward(self, x, rope, window_bias, mask, k_cache, v_cache):
        h, k_new, v_new = self.self_attn(self.input_layernorm(x), rope, window_bias, mask, k_cache, v_cache)
        into = self.residual_scale
        if self.sandwich:
            x = x + into(self.post_attention_layernorm(h))
            x = x + into(self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))))
        else:
            x = x + into(h)
            x = x + into(self.mlp(self.post_attention_layernorm(x)))
        return x, k_new, v_new


class ResidualScale(nn.Module):
    """Multiplies what enters the residual stream by 1/s (s a power of two; nothing at s = 1): the
    stream is carried at 1/s of its size, so that a family's massive activations stay inside fp16 on
    the HTP (Gemma 3 270M reaches |x| ~ 103,000; fp16's maximum is 65,504 and the HTP clamps there).
    Every reader of the stream is an RMSNorm, which takes eps / s² (`StaticBackbone`): the same function
    in exact arithmetic. Its ops stay float by name (quant/llm_graphs.FLOAT_NODES)."""

    def __init__(self, scale: float):
        super().__init__()
        self.inv = 1.0 / float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.inv if self.inv != 1.0 else x


class TokenEmbedding(nn.Module):
    """The embedding lookup on HF's weight, times the family's scale (Gemma: sqrt(hidden_size),
    rounded to the weight's dtype as HF does)."""

    def __init__(self, weight: nn.Parameter, scale: float):
        super().__init__()
        self.weight = weight
        self.scale = float(torch.tensor(scale, dtype=weight.dtype)) if scale != 1.0 else 1.0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids, self.weight)
        return x * self.scale if self.scale != 1.0 else x


class EmbedJoin(nn.Module):
    """`both` inputs: ids below the table's rows are looked up, an id >= vocab_size (no_token_id) looks
    nothing up (its row is multiplied by 0), then inputs_embeds is added (llm/model/input_modes.py). The
    Gather reads a clamped id, so nothing reads past the table. No weights: the lookup stays
    `model.embed_tokens` (module paths, overrides and the weight's name are the token path's), and
    this module's ops are kept float by name (quant/llm_graphs.FLOAT_NODES) like the residual stream
    they start, so a vision projector's features are not clipped to the text's range."""

    def __init__(self, rows: int):
        super().__init__()
        self.rows = int(rows)

    def in_table(self, ids: torch.Tensor) -> torch.Tensor:
        """The ids the lookup reads (a plain method: its op is not scoped under this module)."""
        return torch.clamp(ids, max=self.rows - 1)

    def forward(self, looked_up: torch.Tensor, ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        is_token = (ids < self.rows).to(embeds.dtype).unsqueeze(-1)              # [1, N, 1]
        return looked_up * is_token + embeds


# the embeddings entering layer 0, from the mode's first inputs (llm/model/input_modes.py), by mode
EMBED_INPUTS = {
    "tokens": lambda model, ids: model.embed_tokens(ids),
    "embeddings": lambda model, embeds: embeds,
    "both": lambda model, ids, embeds: model.embed_join(model.embed_tokens(model.embed_join.in_table(ids)), ids, embeds),
}


class SoftCappedHead(nn.Module):
    """lm_head with the logits soft-capped (Gemma 2); holds HF's weight under `lm_head.weight`."""

    def __init__(self, hf_head: nn.Linear, cap: float):
        super().__init__()
        self.weight = hf_head.weight
        self.bias = hf_head.bias
        self.cap = float(cap)

    def linear(self, x):      # the projection alone (the ONNX export swaps it: onnx_export.linears_as_matmul)
        return F.linear(x, self.weight, self.bias)

    def forward(self, x):
        return soft_cap(self.linear(x), self.cap)
