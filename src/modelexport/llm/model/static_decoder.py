"""A fixed-shape decoder for the Hexagon NPU (HTP), for every family of `frontends/llm_families.py`.

Built from a Hugging Face causal LM (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, SmolLM3); the
family's row picks each block's variant (norm, q/k norms, sandwich norms, activation, fused
projections, RoPE tables per layer type, NoPE layers, windows, soft-caps, embedding scale), never
the model type itself. It takes the HF modules themselves (the weights are shared, not copied),
so the module names read as in HF: `model.layers.3.mlp.down_proj`, `lm_head`, and the state dict
keys are HF's (a fused projection is split into views of its rows: `split_rows`).

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
- RoPE: cos/sin tables [C, rotary_dim/2] (one per RoPE kind the layers use) are registered buffers, gathered with
  `F.embedding(position_ids, table)` (aten.embedding -> QNN Gather), then applied in HF's
  "rotate half" form on the two contiguous halves (a stride-2 slice of the interleaved form is
  bad for HTP). The tables are computed from the HF model's own `inv_freq` and
  `attention_scaling`, so scaled RoPE variants (llama3, linear, yarn, longrope's short factor)
  come out as HF's. `model.rotary_emb(position_ids)` returns the tables by kind and the
  sliding-window biases (`PositionInputs`); every layer takes both.
- Sliding windows: a local layer adds a bias computed from the positions to the one mask (see
  `WindowBias`; Genie feeds a single attention_mask).
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

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...core.errors import InputError, UnsupportedError
from .input_modes import DEFAULT_INPUT_MODE, INPUT_IDS, INPUT_MODES, INPUTS_EMBEDS, InputMode, get_input_mode
from .mrope import AXES, ROPE_POSITION_IDS, RopePositions
from ...frontends.llm_families import (
    FAMILIES,
    NORM_WEIGHT_OFFSET,
    LLMFamily,
    check_config,
    check_static_context,
    family_of,
    mrope_sections,
    rope_slots,
    sliding_layers,
)

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
    full: bool = False     # the full-context graph: N = C tokens, no KV-cache inputs or outputs

    def __post_init__(self):
        if self.n_tokens < 1:
            raise InputError(f"n_tokens must be at least 1, got {self.n_tokens}")
        if self.full and self.n_tokens != self.max_seq_len:
            raise InputError(f"a full-context graph reads all max_seq_len ({self.max_seq_len}) tokens, not {self.n_tokens}")
        if not self.full and self.max_seq_len <= self.n_tokens:
            raise InputError(f"max_seq_len ({self.max_seq_len}) must be larger than n_tokens ({self.n_tokens})",
                             "the KV cache holds max_seq_len - n_tokens entries; raise max_seq_len")

    @classmethod
    def full_context(cls, max_seq_len: int, mask_value: float = DEFAULT_MASK_VALUE) -> "StaticDecoderConfig":
        """The "bert" graph: every position of the context in one call, causal, no cache."""
        return cls(max_seq_len, max_seq_len, mask_value, full=True)

    @property
    def cache_len(self) -> int:
        """Entries in each layer's KV cache input (C - N; 0 for the full-context graph, which has none)."""
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


def position_input_name(mrope: bool = False) -> str:
    """The positions input: position_ids int32 [1, N], or M-RoPE's rope_position_ids int32 [3, 1, N]
    (llm/model/mrope.py). An M-RoPE graph reads no 1-axis position: the mask is an input and M-RoPE comes
    without window layers (llm_families.check_config), so the cache slot never enters the graph."""
    return ROPE_POSITION_IDS if mrope else "position_ids"


def input_names(n_layers: int, mode: InputMode = INPUT_MODES[DEFAULT_INPUT_MODE], *, caches: bool = True,
                mrope: bool = False) -> list[str]:
    kv = [past_key(i) for i in range(n_layers)] + [past_value(i) for i in range(n_layers)] if caches else []
    return [*mode.decoder_inputs, position_input_name(mrope), "attention_mask", *kv]


def output_names(n_layers: int, *, caches: bool = True) -> list[str]:
    kv = [new_key(i) for i in range(n_layers)] + [new_value(i) for i in range(n_layers)] if caches else []
    return ["logits", *kv]


def first_inputs(mode: InputMode, n_tokens: int, hidden_size: int) -> tuple[torch.Tensor, ...]:
    """Zero example values of the mode's first inputs (ids int32 [1, N], embeddings float [1, N, hidden])."""
    shapes = {INPUT_IDS: lambda: torch.zeros((1, n_tokens), dtype=torch.int32),
              INPUTS_EMBEDS: lambda: torch.zeros((1, n_tokens, hidden_size))}
    return tuple(shapes[name]() for name in mode.decoder_inputs)


def example_inputs(cfg: StaticDecoderConfig, spec: DecoderSpec, *, past_len: int = 0,
                   mode: InputMode = INPUT_MODES[DEFAULT_INPUT_MODE], mrope: bool = False) -> tuple[torch.Tensor, ...]:
    """Inputs of the right shapes and dtypes (zero caches, a valid mask), in forward's order."""
    if cfg.max_seq_len > spec.max_seq_len:
        raise InputError(f"max_seq_len {cfg.max_seq_len} exceeds the decoder's RoPE table ({spec.max_seq_len})")
    n_caches = 0 if cfg.full else spec.n_layers
    ks = tuple(torch.zeros(spec.k_cache_shape(cfg.cache_len)) for _ in range(n_caches))
    vs = tuple(torch.zeros(spec.v_cache_shape(cfg.cache_len)) for _ in range(n_caches))
    pos = make_position_ids(cfg, past_len)
    if mrope:
        pos = torch.from_numpy(RopePositions.text()(pos))
    return (*first_inputs(mode, cfg.n_tokens, spec.hidden_size), pos, make_attention_mask(cfg, past_len), *ks, *vs)


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
            return xs * torch.rsqrt(torch.mean(xs * xs, dim=-1, keepdim=True) + self.eps / (m * m)) * w
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * w


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, kv, a, b] -> [B, kv*n_rep, a, b], each KV head repeated n_rep times in a row."""
    if n_rep == 1:
        return x
    b, kv, s1, s2 = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s1, s2).reshape(b, kv * n_rep, s1, s2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotate-half RoPE on [B, H, N, D] with half tables cos/sin [B, 1, N, R/2]: the first R
    dims rotate, the rest pass through (partial rotary, Phi-4-mini: R = 0.75 D)."""
    rot = 2 * cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)
    half = rot // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


class RotaryTables(nn.Module):
    """cos/sin [max_seq_len, rotary_dim/2] (attention scaling folded in), gathered by position."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float, max_seq_len: int):
        super().__init__()
        # the same float32 product HF's rotary embedding computes, so the values are bit-identical
        freqs = torch.arange(max_seq_len, dtype=torch.float32)[:, None] * inv_freq.float()[None, :]
        self.register_buffer("cos", freqs.cos() * attention_scaling, persistent=False)
        self.register_buffer("sin", freqs.sin() * attention_scaling, persistent=False)
        self.max_gather: int | None = None     # set by the .pte path: see llm_pt2e.MAX_ROPE_GATHER

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = position_ids.shape[-1]
        if self.max_gather is None or n <= self.max_gather:
            return F.embedding(position_ids, self.cos).unsqueeze(1), F.embedding(position_ids, self.sin).unsqueeze(1)
        parts = position_ids.split(self.max_gather, dim=-1)     # one lookup per chunk of positions
        cos = torch.cat([F.embedding(p, self.cos) for p in parts], dim=1)   # [B, N, R/2]
        sin = torch.cat([F.embedding(p, self.sin) for p in parts], dim=1)
        return cos.unsqueeze(1), sin.unsqueeze(1)                           # [B, 1, N, R/2]


class MRopeTables(nn.Module):
    """M-RoPE (Qwen2-VL): the half tables' columns in `sections`, section i gathered at axis i % 3 of the
    3-axis positions [3, 1, N] and concatenated (transformers' `recomposition_frequencies`). One Gather
    per section of a table sliced at build time; with equal axes it is RotaryTables' lookup."""

    def __init__(self, table: RotaryTables, sections: tuple[int, ...]):
        super().__init__()
        bounds = np.cumsum((0, *sections))
        if bounds[-1] != table.cos.shape[1]:
            raise UnsupportedError(f"M-RoPE sections {list(sections)} do not add up to the RoPE table's {table.cos.shape[1]} dims")
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            self.register_buffer(f"cos_{i}", table.cos[:, a:b].clone(), persistent=False)
            self.register_buffer(f"sin_{i}", table.sin[:, a:b].clone(), persistent=False)
        self.n_sections = len(sections)

    def forward(self, rope_position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        axis = [rope_position_ids[i % AXES] for i in range(self.n_sections)]                  # each [1, N]
        cos = torch.cat([F.embedding(axis[i], getattr(self, f"cos_{i}")) for i in range(self.n_sections)], dim=-1)
        sin = torch.cat([F.embedding(axis[i], getattr(self, f"sin_{i}")) for i in range(self.n_sections)], dim=-1)
        return cos.unsqueeze(1), sin.unsqueeze(1)                                               # [1, 1, N, R/2]


def split_rope_lookups(decoder: nn.Module, max_gather: int) -> int:
    """Cut the decoder's RoPE-table lookups into gathers of `max_gather` positions (the values are
    the same); → tables set."""
    tables = [m for m in decoder.modules() if isinstance(m, RotaryTables)]
    for t in tables:
        t.max_gather = max_gather
    return len(tables)


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


class PositionInputs(nn.Module):
    """What every layer takes besides its hidden states and caches, computed once from position_ids:
    the RoPE tables by slot (a tuple of (cos, sin), `rope_slot` indexes it) and the sliding-window
    biases by window (a dict). Kept at HF's name `model.rotary_emb`, so the export's callers
    (`cos, sin = model.rotary_emb(position_ids)`, then `layer(x, cos, sin, mask, k, v)`) carry the
    two through unchanged."""

    def __init__(self, tables: list[nn.Module], windows: list[int], cfg: StaticDecoderConfig):
        super().__init__()
        self.tables = nn.ModuleList(tables)
        self.windows = nn.ModuleDict({str(w): WindowBias(w, cfg) for w in windows})

    def forward(self, position_ids: torch.Tensor):
        """`position_ids` [1, N], or an M-RoPE decoder's rope_position_ids [3, 1, N] (its MRopeTables read them)."""
        rope = tuple(t(position_ids) for t in self.tables)
        bias = {int(w): m(position_ids) for w, m in self.windows.items()}
        return rope, bias


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


class StaticDecoderLayer(nn.Module):
    """Pre-norm residual block; with `sandwich_norms` (Gemma) the attention and MLP outputs are
    normed too before they join the residual, and the MLP's input norm is `pre_feedforward_layernorm`."""

    def __init__(self, hf_layer: nn.Module, family: LLMFamily, spec: DecoderSpec, plan: LayerPlan,
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


class StaticBackbone(nn.Module):
    """Holds what HF's `model.model` holds, under the same names."""

    def __init__(self, hf_inner: nn.Module, family: LLMFamily, hf_cfg, spec: DecoderSpec,
                 cfg: StaticDecoderConfig, rms_norm: str, residual_scale: float = 1.0):
        super().__init__()
        norm = functools.partial(_norm, eps=hf_cfg.rms_norm_eps, form=rms_norm,
                                 offset=NORM_WEIGHT_OFFSET[family.norm])
        # the norms reading the residual stream (carried at 1/s: ResidualScale) take eps / s²
        stream_norm = functools.partial(_norm, eps=hf_cfg.rms_norm_eps / residual_scale ** 2, form=rms_norm,
                                        offset=NORM_WEIGHT_OFFSET[family.norm])
        self.residual_scale = ResidualScale(residual_scale)
        scale = hf_cfg.hidden_size ** 0.5 if family.embedding_scale == "sqrt_hidden" else 1.0
        self.embed_tokens = TokenEmbedding(hf_inner.embed_tokens.weight, scale)
        self.embed_join = EmbedJoin(hf_inner.embed_tokens.weight.shape[0])     # the `both` input mode's
        slots = rope_slots(family, hf_cfg)
        slot_names = sorted({s for s in slots if s is not None})
        windows = [w if w is not None and w < cfg.max_seq_len else None for w in sliding_layers(family, hf_cfg)]
        plans = [LayerPlan(None if s is None else slot_names.index(s), w) for s, w in zip(slots, windows)]
        query_scalar = getattr(hf_cfg, family.query_scale_field) if family.query_scale_field else spec.head_dim
        softcap = getattr(hf_cfg, family.attn_softcap_field, None) if family.attn_softcap_field else None
        activation = getattr(hf_cfg, family.activation_field, None) or "silu"
        self.layers = nn.ModuleList(
            StaticDecoderLayer(layer, family, spec, plan, norm, stream_norm, residual_scale, activation,
                               query_scalar ** -0.5, softcap)
            for layer, plan in zip(hf_inner.layers, plans))
        self.norm = stream_norm(hf_inner.norm.weight)
        tables = [RotaryTables(*_rope_frequencies(hf_inner.rotary_emb, name, spec.head_dim), spec.max_seq_len)
                  for name in slot_names]
        sections = mrope_sections(family, hf_cfg)
        if sections is not None:      # M-RoPE: one table, gathered per section (frontends/llm_families.py)
            tables = [MRopeTables(t, sections) for t in tables]
        self.rotary_emb = PositionInputs(tables, sorted({w for w in windows if w is not None}), cfg)


def _norm(weight, *, eps, form, offset) -> RMSNorm:
    return RMSNorm(weight, eps, form, offset)


def _rope_frequencies(hf_rotary: nn.Module, slot: str, head_dim: int) -> tuple[torch.Tensor, float]:
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


# ---------------------------------------------------------------------------------------------
# the decoder

class StaticDecoder(nn.Module):
    """See the module docstring for inputs, outputs and layout. Build with `build_static_decoder`."""

    def __init__(self, hf_model: nn.Module, cfg: StaticDecoderConfig, *, rms_norm: str = "aten",
                 inputs: str = DEFAULT_INPUT_MODE, residual_scale: float = 1.0):
        super().__init__()
        if rms_norm not in RMS_NORM_FORMS:
            raise InputError(f"unknown rms_norm form {rms_norm!r}", f"use one of {', '.join(RMS_NORM_FORMS)}")
        self.input_mode = get_input_mode(inputs)
        hf_cfg = hf_model.config
        family = _check_supported(hf_cfg, cfg)
        n_heads = hf_cfg.num_attention_heads
        n_kv = getattr(hf_cfg, "num_key_value_heads", None) or n_heads
        head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // n_heads
        self.spec = DecoderSpec(n_layers=hf_cfg.num_hidden_layers, n_heads=n_heads, n_kv_heads=n_kv,
                                head_dim=head_dim, hidden_size=hf_cfg.hidden_size,
                                vocab_size=hf_model.lm_head.weight.shape[0], max_seq_len=cfg.max_seq_len)
        self.cfg = cfg
        self.rms_norm_form = rms_norm
        self.model_type = hf_cfg.model_type
        self.family = family
        self.residual_scale = float(residual_scale)
        self.model = StaticBackbone(hf_model.model, family, hf_cfg, self.spec, cfg, rms_norm, self.residual_scale)
        self.mrope = mrope_sections(family, hf_cfg) is not None   # takes rope_position_ids [3, 1, N] for positions
        self.rope_positions = RopePositions.text()   # what `graph_inputs` gives runner calls (llm/model/mrope.py)
        cap = getattr(hf_cfg, family.final_softcap_field, None) if family.final_softcap_field else None
        # tied lm_heads stay tied: HF's own module, or its weight under the same name
        self.lm_head = hf_model.lm_head if cap is None else SoftCappedHead(hf_model.lm_head, cap)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(*the mode's first inputs, position_ids (M-RoPE: rope_position_ids), attention_mask, *keys, *values) →
        (logits, *new keys, *new values); the full-context graph takes and returns no caches."""
        n_first, n_layers = len(self.input_mode.decoder_inputs), self.spec.n_layers
        first, (position_ids, attention_mask), caches = inputs[:n_first], inputs[n_first:n_first + 2], inputs[n_first + 2:]
        n_caches = 0 if self.cfg.full else 2 * n_layers
        if len(caches) != n_caches:
            raise ValueError(f"expected {n_caches} cache tensors (all keys, then all values), got {len(caches)}")
        k_caches, v_caches = (caches[:n_layers], caches[n_layers:]) if caches else ((None,) * n_layers,) * 2
        rope, window_bias = self.model.rotary_emb(position_ids)
        x = self.embed(*first)
        new_k, new_v = [], []
        for layer, k_cache, v_cache in zip(self.model.layers, k_caches, v_caches):
            x, k, v = layer(x, rope, window_bias, attention_mask, k_cache, v_cache)
            new_k.append(k)
            new_v.append(v)
        logits = self.lm_head(self.model.norm(x))
        return (logits,) if self.cfg.full else (logits, *new_k, *new_v)

    def embed(self, *first: torch.Tensor) -> torch.Tensor:
        """The residual stream entering layer 0 from the input mode's first inputs (at 1/residual_scale)."""
        return self.model.residual_scale(EMBED_INPUTS[self.input_mode.name](self.model, *first))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids → the embeddings entering layer 0 (the family's scale applied): the embedder part."""
        return self.model.embed_tokens(ids)

    def example_inputs(self, past_len: int = 0) -> tuple[torch.Tensor, ...]:
        return example_inputs(self.cfg, self.spec, past_len=past_len, mode=self.input_mode, mrope=self.mrope)

    def graph_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        """A runner's call (*first inputs, position_ids, attention_mask, *caches: static_runner) as this
        graph's inputs: an M-RoPE decoder takes `rope_positions` of those slots instead of position_ids."""
        if not self.mrope:
            return tuple(inputs)
        n_first = len(self.input_mode.decoder_inputs)
        rope = torch.from_numpy(self.rope_positions(inputs[n_first]))
        return (*inputs[:n_first], rope, *inputs[n_first + 1:])

    def input_names(self) -> list[str]:
        return input_names(self.spec.n_layers, self.input_mode, caches=not self.cfg.full, mrope=self.mrope)

    def output_names(self) -> list[str]:
        return output_names(self.spec.n_layers, caches=not self.cfg.full)


def decoder_config(n_tokens: int, max_seq_len: int) -> StaticDecoderConfig:
    """The graph of N tokens per call: arN over a KV cache, or the full-context graph when N = C."""
    if n_tokens == max_seq_len:
        return StaticDecoderConfig.full_context(max_seq_len)
    return StaticDecoderConfig(n_tokens, max_seq_len)


def build_static_decoder(hf_model: nn.Module, cfg: StaticDecoderConfig, *, rms_norm: str = "aten",
                         inputs: str = DEFAULT_INPUT_MODE, residual_scale: float = 1.0) -> StaticDecoder:
    """A `StaticDecoder` sharing `hf_model`'s weights (no copy), in eval mode; `inputs` is its input
    mode (llm/model/input_modes.py: tokens, embeddings, both); the residual stream is carried at
    1/`residual_scale` (ResidualScale; llm/model/residual_scale.py picks it from text).

    Two decoders built from the same HF model (e.g. AR-1 and AR-32) share every parameter,
    which is what a weight-sharing export of both graphs wants.
    """
    return StaticDecoder(hf_model, cfg, rms_norm=rms_norm, inputs=inputs, residual_scale=residual_scale).eval()


def _check_supported(hf_cfg, cfg: StaticDecoderConfig) -> LLMFamily:
    """The family's row, after refusing what the table (or a static graph) cannot hold."""
    model_type = getattr(hf_cfg, "model_type", None)
    family = family_of(model_type, "the static decoder")
    if not family.npu:
        raise UnsupportedError(f"the {family.label} family is not built for the NPU yet",
                               f"supported on the NPU: {', '.join(SUPPORTED_MODEL_TYPES)}")
    check_config(family, hf_cfg, "the static decoder")
    check_static_context(family, hf_cfg, cfg.max_seq_len)
    return family
