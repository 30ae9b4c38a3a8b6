"""A fixed-shape Llama-family decoder for the Hexagon NPU (HTP).

Built from a Hugging Face `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM`
(RMSNorm, grouped-query attention with optional q/k/v bias, SwiGLU MLP, tied or untied
lm_head). It takes the HF modules themselves (the weights are shared, not copied), so the
module names read as in HF: `model.layers.3.mlp.down_proj`, `lm_head`, and the state dict
keys are HF's.

One graph processes N tokens ("AR-N") against a KV cache of fixed length. The layout is the one
ExecuTorch's Qualcomm llama example (`examples/qualcomm/oss_scripts/llama/model/static_llama.py`,
"smart mask" mode) uses:

inputs (in this order)
    input_ids       int32 [1, N]
    position_ids    int32 [1, N]                     absolute positions of the N tokens
    attention_mask  float [1, 1, N, C]                additive: 0 = attend, `mask_value` = not
    past_key_i_in   float [1, kv_heads, head_dim, C - N]   one per layer, keys stored transposed
    past_value_i_in float [1, kv_heads, C - N, head_dim]   one per layer
outputs
    logits          float [1, N, vocab]
    past_key_i_out  float [1, kv_heads, head_dim, N]   only the N new entries, already RoPE'd
    past_value_i_out float [1, kv_heads, N, head_dim]

The cache names are Genie's (its default cache group is the prefix `past_`, each layer's tensors
`past_key_<i>_in` / `_out`): Genie refuses other names ("Invalid cache-group prefix").

C = `max_seq_len`. Attention runs over `cat(past, new)`: columns `0 .. C-N-1` are cache slots,
the last N columns are the chunk itself. Cache slot p holds the token at position p; the caller
writes the new entries into slots `past_len .. past_len+n-1` (see `static_runner`) and opens
those columns in the next mask (`make_attention_mask`).

Choices made for HTP (documented here because they are deliberate):
- RoPE: cos/sin tables [C, head_dim/2] are registered buffers, gathered with
  `F.embedding(position_ids, table)` (aten.embedding -> QNN Gather), then applied in HF's
  "rotate half" form on the two contiguous halves (a stride-2 slice of the interleaved form is
  bad for HTP). The tables are computed from the HF model's own `inv_freq` and
  `attention_scaling`, so scaled RoPE variants (llama3, linear, yarn) come out as HF's.
- RMSNorm: `rms_norm="aten"` (default) uses `torch.nn.functional.rms_norm`, which lowers to
  QNN's native RmsNorm op (ExecuTorch's QNN llama uses `torch.nn.RMSNorm` too);
  `rms_norm="decomposed"` writes `x * rsqrt(mean(x*x) + eps) * w` from elementwise ops, for a
  path (e.g. an ONNX opset without RMSNormalization). ExecuTorch's QNN passes recompose the
  decomposed pattern into RmsNorm anyway (RecomposeRmsNorm), so both give the same QNN graph.
  `rms_norm="scaled"` (the ONNX path) divides each row by max|x|/8 first and scales eps with it:
  the same function (RMSNorm is scale invariant), but safe in fp16. The ONNX path keeps the
  residual stream and the norms out of the integer QDQ (fp16 on the HTP), and SmolLM2's massive
  activations (|x| ~ 25,000) would overflow fp16's 65,504 when squared.

Measured with ExecuTorch 1.5.1's QnnPartitioner on QAIRT 2.51 (SM8650, tiny Llama and Qwen2,
AR-4, C=32): every op is delegated in one subgraph (fp16, 8a8w, 16a8w; only the output
`getitem`s stay outside), and the `.pte` run on the host HTP simulator matched eager to 7e-4
(fp16), 7e-3 (16a8w) and 1.4e-2 (8a8w) on logits of magnitude ~0.5.
- GQA: KV heads are repeated by `x[:, :, None].expand(...).reshape(...)` (no
  `repeat_interleave`), as ExecuTorch's QNN example does.
- The mask is additive and broadcast over heads; the default masked value is -255 (the value
  ExecuTorch's QNN example uses: small enough to quantize the mask input well, large enough to
  zero a softmax term).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import InputError, UnsupportedError
from ..frontends.llm_families import BY_MODEL_TYPE, FAMILIES

DEFAULT_MASK_VALUE = -255.0
SUPPORTED_MODEL_TYPES = tuple(f.model_type for f in FAMILIES if f.npu)
RMS_NORM_FORMS = ("aten", "decomposed", "scaled")
ONNX_RMS_NORM = "scaled"   # the form the ONNX → QNN LLM path exports, calibrates and compares with


@dataclass(frozen=True)
class StaticDecoderConfig:
    """The static shape of one decoder graph: N tokens per call, attention span `max_seq_len`."""

    n_tokens: int
    max_seq_len: int
    mask_value: float = DEFAULT_MASK_VALUE

    def __post_init__(self):
        if self.n_tokens < 1:
            raise InputError(f"n_tokens must be at least 1, got {self.n_tokens}")
        if self.max_seq_len <= self.n_tokens:
            raise InputError(f"max_seq_len ({self.max_seq_len}) must be larger than n_tokens ({self.n_tokens})",
                             "the KV cache holds max_seq_len - n_tokens entries; raise max_seq_len")

    @property
    def cache_len(self) -> int:
        """Entries in each layer's KV cache input (C - N)."""
        return self.max_seq_len - self.n_tokens


@dataclass(frozen=True)
class DecoderSpec:
    """What a caller needs to feed a static decoder: the model's dimensions."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_seq_len: int  # rows of the RoPE tables: positions 0 .. max_seq_len-1

    def k_cache_shape(self, cache_len: int) -> tuple[int, int, int, int]:
        return (1, self.n_kv_heads, self.head_dim, cache_len)

    def v_cache_shape(self, cache_len: int) -> tuple[int, int, int, int]:
        return (1, self.n_kv_heads, cache_len, self.head_dim)


# ---------------------------------------------------------------------------------------------
# masks, positions, example inputs

def make_attention_mask(cfg: StaticDecoderConfig, past_len: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive mask [1, 1, N, C] for a chunk whose first token sits at position `past_len`.

    Cache columns `0 .. past_len-1` are open, the other cache columns closed, and the last N
    columns are causal within the chunk (row i sees chunk columns 0..i). Rows of padding tokens
    at the end of a partly filled chunk need nothing special: real rows never see them.
    """
    if not 0 <= past_len <= cfg.cache_len:
        raise InputError(f"past_len {past_len} does not fit a cache of {cfg.cache_len} entries "
                         f"(max_seq_len {cfg.max_seq_len}, n_tokens {cfg.n_tokens})")
    n, c = cfg.n_tokens, cfg.max_seq_len
    mask = torch.full((n, c), cfg.mask_value, dtype=dtype)
    mask[:, :past_len] = 0
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    mask[:, c - n:] = torch.where(causal, torch.zeros((), dtype=dtype), torch.full((), cfg.mask_value, dtype=dtype))
    return mask[None, None]


def make_position_ids(cfg: StaticDecoderConfig, past_len: int) -> torch.Tensor:
    """int32 [1, N]: past_len, past_len+1, ...; padding rows are clamped to the table's last row."""
    pos = torch.arange(past_len, past_len + cfg.n_tokens, dtype=torch.int32)
    return pos.clamp(max=cfg.max_seq_len - 1)[None]


def past_key(i: int) -> str:
    return f"past_key_{i}_in"


def past_value(i: int) -> str:
    return f"past_value_{i}_in"


def new_key(i: int) -> str:
    return f"past_key_{i}_out"


def new_value(i: int) -> str:
    return f"past_value_{i}_out"


def input_names(n_layers: int) -> list[str]:
    return (["input_ids", "position_ids", "attention_mask"]
            + [past_key(i) for i in range(n_layers)] + [past_value(i) for i in range(n_layers)])


def output_names(n_layers: int) -> list[str]:
    return (["logits"] + [new_key(i) for i in range(n_layers)] + [new_value(i) for i in range(n_layers)])


def example_inputs(cfg: StaticDecoderConfig, spec: DecoderSpec, *, past_len: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs of the right shapes and dtypes (zero caches, a valid mask), in forward's order."""
    if cfg.max_seq_len > spec.max_seq_len:
        raise InputError(f"max_seq_len {cfg.max_seq_len} exceeds the decoder's RoPE table ({spec.max_seq_len})")
    ids = torch.zeros((1, cfg.n_tokens), dtype=torch.int32)
    ks = tuple(torch.zeros(spec.k_cache_shape(cfg.cache_len)) for _ in range(spec.n_layers))
    vs = tuple(torch.zeros(spec.v_cache_shape(cfg.cache_len)) for _ in range(spec.n_layers))
    return (ids, make_position_ids(cfg, past_len), make_attention_mask(cfg, past_len), *ks, *vs)


# ---------------------------------------------------------------------------------------------
# building blocks

class RMSNorm(nn.Module):
    """RMSNorm sharing HF's weight; `form` picks the op sequence (see the module docstring)."""

    def __init__(self, weight: nn.Parameter, eps: float, form: str):
        super().__init__()
        self.weight = weight
        self.eps = float(eps)
        self.form = form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "aten":
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        if self.form == "scaled":   # |x / m| <= 8: squares stay far below fp16's maximum
            m = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4) / 8
            xs = x / m
            return xs * torch.rsqrt(torch.mean(xs * xs, dim=-1, keepdim=True) + self.eps / (m * m)) * self.weight
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * self.weight


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, kv, a, b] -> [B, kv*n_rep, a, b], each KV head repeated n_rep times in a row."""
    if n_rep == 1:
        return x
    b, kv, s1, s2 = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s1, s2).reshape(b, kv * n_rep, s1, s2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotate-half RoPE on [B, H, N, D] with half tables cos/sin [B, 1, N, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RotaryTables(nn.Module):
    """cos/sin [max_seq_len, head_dim/2] (attention scaling folded in), gathered by position."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float, max_seq_len: int):
        super().__init__()
        # the same float32 product HF's rotary embedding computes, so the values are bit-identical
        freqs = torch.arange(max_seq_len, dtype=torch.float32)[:, None] * inv_freq.float()[None, :]
        self.register_buffer("cos", freqs.cos() * attention_scaling, persistent=False)
        self.register_buffer("sin", freqs.sin() * attention_scaling, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos = F.embedding(position_ids, self.cos).unsqueeze(1)  # [B, 1, N, D/2]
        sin = F.embedding(position_ids, self.sin).unsqueeze(1)
        return cos, sin


class StaticAttention(nn.Module):
    def __init__(self, hf_attn: nn.Module, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj, hf_attn.o_proj
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.n_rep = n_heads // n_kv_heads
        self.scaling = float(getattr(hf_attn, "scaling", head_dim ** -0.5))

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)       # [B, H, N, D]
        k = self.k_proj(x).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)    # [B, KV, N, D]
        v = self.v_proj(x).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)    # [B, KV, N, D]
        q = apply_rope(q, cos, sin)
        k_new = apply_rope(k, cos, sin).transpose(2, 3)                                  # [B, KV, D, N]
        keys = repeat_kv(torch.cat([k_cache, k_new], dim=-1), self.n_rep)                # [B, H, D, C]
        values = repeat_kv(torch.cat([v_cache, v], dim=2), self.n_rep)                   # [B, H, C, D]
        scores = torch.matmul(q, keys) * self.scaling + mask                              # [B, H, N, C]
        probs = torch.softmax(scores, dim=-1)
        y = torch.matmul(probs, values).transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim)
        return self.o_proj(y), k_new, v


class StaticMLP(nn.Module):
    def __init__(self, hf_mlp: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = hf_mlp.gate_proj, hf_mlp.up_proj, hf_mlp.down_proj

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class StaticDecoderLayer(nn.Module):
    def __init__(self, hf_layer: nn.Module, eps: float, rms_norm: str, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.input_layernorm = RMSNorm(hf_layer.input_layernorm.weight, eps, rms_norm)
        self.self_attn = StaticAttention(hf_layer.self_attn, n_heads, n_kv_heads, head_dim)
        self.post_attention_layernorm = RMSNorm(hf_layer.post_attention_layernorm.weight, eps, rms_norm)
        self.mlp = StaticMLP(hf_layer.mlp)

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        h, k_new, v_new = self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k_new, v_new


class StaticBackbone(nn.Module):
    """Holds what HF's `model.model` holds, under the same names."""

    def __init__(self, hf_inner: nn.Module, spec: DecoderSpec, eps: float, rms_norm: str,
                 inv_freq: torch.Tensor, attention_scaling: float):
        super().__init__()
        self.embed_tokens = hf_inner.embed_tokens
        self.layers = nn.ModuleList(
            StaticDecoderLayer(layer, eps, rms_norm, spec.n_heads, spec.n_kv_heads, spec.head_dim)
            for layer in hf_inner.layers)
        self.norm = RMSNorm(hf_inner.norm.weight, eps, rms_norm)
        self.rotary_emb = RotaryTables(inv_freq, attention_scaling, spec.max_seq_len)


# ---------------------------------------------------------------------------------------------
# the decoder

class StaticDecoder(nn.Module):
    """See the module docstring for inputs, outputs and layout. Build with `build_static_decoder`."""

    def __init__(self, hf_model: nn.Module, cfg: StaticDecoderConfig, *, rms_norm: str = "aten"):
        super().__init__()
        if rms_norm not in RMS_NORM_FORMS:
            raise InputError(f"unknown rms_norm form {rms_norm!r}", f"use one of {', '.join(RMS_NORM_FORMS)}")
        hf_cfg = hf_model.config
        _check_supported(hf_cfg, cfg)
        n_heads = hf_cfg.num_attention_heads
        n_kv = getattr(hf_cfg, "num_key_value_heads", None) or n_heads
        head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // n_heads
        rotary = hf_model.model.rotary_emb
        inv_freq = rotary.inv_freq.detach()
        if inv_freq.numel() * 2 != head_dim:
            raise UnsupportedError(f"partial rotary embedding ({inv_freq.numel() * 2} of {head_dim} dims) is not supported")
        self.spec = DecoderSpec(n_layers=hf_cfg.num_hidden_layers, n_heads=n_heads, n_kv_heads=n_kv,
                                head_dim=head_dim, hidden_size=hf_cfg.hidden_size,
                                vocab_size=hf_model.lm_head.weight.shape[0], max_seq_len=cfg.max_seq_len)
        self.cfg = cfg
        self.rms_norm_form = rms_norm
        self.model_type = hf_cfg.model_type
        self.model = StaticBackbone(hf_model.model, self.spec, hf_cfg.rms_norm_eps, rms_norm,
                                    inv_freq, float(getattr(rotary, "attention_scaling", 1.0)))
        self.lm_head = hf_model.lm_head  # tied lm_heads stay tied: this is HF's own module

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n_layers = self.spec.n_layers
        if len(caches) != 2 * n_layers:
            raise ValueError(f"expected {2 * n_layers} cache tensors (all keys, then all values), got {len(caches)}")
        k_caches, v_caches = caches[:n_layers], caches[n_layers:]
        cos, sin = self.model.rotary_emb(position_ids)
        x = self.model.embed_tokens(input_ids)
        new_k, new_v = [], []
        for layer, k_cache, v_cache in zip(self.model.layers, k_caches, v_caches):
            x, k, v = layer(x, cos, sin, attention_mask, k_cache, v_cache)
            new_k.append(k)
            new_v.append(v)
        logits = self.lm_head(self.model.norm(x))
        return (logits, *new_k, *new_v)

    def example_inputs(self, past_len: int = 0) -> tuple[torch.Tensor, ...]:
        return example_inputs(self.cfg, self.spec, past_len=past_len)

    def input_names(self) -> list[str]:
        return input_names(self.spec.n_layers)

    def output_names(self) -> list[str]:
        return output_names(self.spec.n_layers)


def build_static_decoder(hf_model: nn.Module, cfg: StaticDecoderConfig, *, rms_norm: str = "aten") -> StaticDecoder:
    """A `StaticDecoder` sharing `hf_model`'s weights (no copy), in eval mode.

    Two decoders built from the same HF model (e.g. AR-1 and AR-32) share every parameter,
    which is what a weight-sharing export of both graphs wants.
    """
    return StaticDecoder(hf_model, cfg, rms_norm=rms_norm).eval()


def _check_supported(hf_cfg, cfg: StaticDecoderConfig) -> None:
    model_type = getattr(hf_cfg, "model_type", None)
    family = BY_MODEL_TYPE.get(model_type)
    if family is None or not family.npu:
        raise InputError(f"model type {model_type!r} is not supported by the static decoder",
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (Llama-family; SmolLM is llama)")
    act = getattr(hf_cfg, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedError(f"MLP activation {act!r} is not supported (only SwiGLU with silu)")
    window = getattr(hf_cfg, "sliding_window", None)
    layer_types = getattr(hf_cfg, "layer_types", None) or []
    uses_window = window is not None and (family.sliding_window_always or "sliding_attention" in layer_types
                                          or getattr(hf_cfg, "use_sliding_window", False))
    if uses_window and window < cfg.max_seq_len:
        raise UnsupportedError(f"the model uses sliding-window attention ({window} tokens), "
                               f"shorter than max_seq_len {cfg.max_seq_len}",
                               f"choose max_seq_len <= {window}")
