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

import torch
from torch import nn

from ...core.errors import InputError, UnsupportedError
from .input_modes import DEFAULT_INPUT_MODE, get_input_mode
from .mrope import RopePositions
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
from .attention import AttentionCore, LayerPlan, StaticAttention, WindowBias, repeat_kv, soft_cap, split_rows
from .blocks import (
    ACTIVATION_FNS,
    EMBED_INPUTS,
    EmbedJoin,
    ResidualScale,
    RMSNorm,
    SoftCappedHead,
    StaticDecoderLayer,
    StaticMLP,
    TokenEmbedding,
)
from .graph_io import (
    DEFAULT_MASK_VALUE,
    DecoderSpec,
    StaticDecoderConfig,
    example_inputs,
    first_inputs,
    input_names,
    make_attention_mask,
    make_position_ids,
    new_key,
    new_value,
    output_names,
    past_key,
    past_value,
    position_input_names,
)
from .rope import MRopeTables, RotaryTables, apply_rope, rope_frequencies

# the names callers import from here; the pieces live in graph_io, rope, attention and blocks
__all__ = ["ACTIVATION_FNS", "DEFAULT_MASK_VALUE", "EMBED_INPUTS", "ONNX_RMS_NORM", "RMS_NORM_FORMS",
           "SUPPORTED_MODEL_TYPES", "AttentionCore", "DecoderSpec", "EmbedJoin", "LayerPlan", "MRopeTables",
           "PositionInputs", "RMSNorm", "ResidualScale", "RotaryTables", "SoftCappedHead", "StaticAttention",
           "StaticBackbone", "StaticDecoder", "StaticDecoderConfig", "StaticDecoderLayer", "StaticMLP",
           "TokenEmbedding", "WindowBias", "apply_rope", "build_static_decoder", "decoder_config", "example_inputs",
           "first_inputs", "input_names", "make_attention_mask", "make_position_ids", "new_key", "new_value",
           "output_names", "past_key", "past_value", "position_input_names", "repeat_kv", "soft_cap",
           "split_rows"]

SUPPORTED_MODEL_TYPES = tuple(f.model_type for f in FAMILIES if f.npu)
RMS_NORM_FORMS = ("aten", "decomposed", "scaled")
ONNX_RMS_NORM = "scaled"   # the form the ONNX → QNN LLM path exports, calibrates and compares with


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
        tables = [RotaryTables(*rope_frequencies(hf_inner.rotary_emb, name, spec.head_dim), spec.max_seq_len)
                  for name in slot_names]
        sections = mrope_sections(family, hf_cfg)
        if sections is not None:      # M-RoPE: one table, gathered per section (frontends/llm_families.py)
            tables = [MRopeTables(t, sections) for t in tables]
        self.rotary_emb = PositionInputs(tables, sorted({w for w in windows if w is not None}), cfg)


def _norm(weight, *, eps, form, offset) -> RMSNorm:
    return RMSNorm(weight, eps, form, offset)


# ---------------------------------------------------------------------------------------------
# the decoder

class StaticDecoder(nn.Module):
    """See the module docstring for inputs, outputs and layout. Build with `build_static_decoder`."""

    def __init__(self, hf_model: nn.Module, cfg: StaticDecoderConfig, *, rms_norm: str = "aten",
                 inputs: str = DEFAULT_INPUT_MODE, residual_scale: float = 1.0, positions: str = "ids"):
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
        self.cos_sin = positions == "cos-sin"         # takes RoPE's cos and sin instead of position_ids
        if self.cos_sin:
            check_cos_sin(self.model.rotary_emb, self.mrope, hf_cfg.model_type)
        cap = getattr(hf_cfg, family.final_softcap_field, None) if family.final_softcap_field else None
        # tied lm_heads stay tied: HF's own module, or its weight under the same name
        self.lm_head = hf_model.lm_head if cap is None else SoftCappedHead(hf_model.lm_head, cap)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(*the mode's first inputs, position_ids (M-RoPE: rope_position_ids), attention_mask, *keys, *values) →
        (logits, *new keys, *new values); the full-context graph takes and returns no caches."""
        n_first, n_layers = len(self.input_mode.decoder_inputs), self.spec.n_layers
        first, (positions, attention_mask, caches) = inputs[:n_first], self.split_positions(inputs[n_first:])
        n_caches = 0 if self.cfg.full else 2 * n_layers
        if len(caches) != n_caches:
            raise ValueError(f"expected {n_caches} cache tensors (all keys, then all values), got {len(caches)}")
        k_caches, v_caches = (caches[:n_layers], caches[n_layers:]) if caches else ((None,) * n_layers,) * 2
        rope, window_bias = self.position_inputs(positions)
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

    @property
    def n_positions(self) -> int:
        """How many position inputs the graph takes (cos and sin: 2)."""
        return 2 if self.cos_sin else 1

    def split_positions(self, rest) -> tuple[tuple, torch.Tensor, tuple]:
        """The graph inputs after the first ones → (position inputs, attention_mask, caches)."""
        k = self.n_positions
        return tuple(rest[:k]), rest[k], tuple(rest[k + 1:])

    def position_inputs(self, positions: tuple) -> tuple[tuple, dict]:
        """The graph's position inputs → (RoPE tables by slot, window biases): gathered from position_ids,
        or the cos and sin given (one slot, no window: check_cos_sin)."""
        if self.cos_sin:
            return (tuple(positions),), {}
        return self.model.rotary_emb(positions[0])

    def cos_sin_of(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin [1, 1, N, rotary_dim/2] of `position_ids` [1, N]: the rows the graph gathers itself."""
        return self.model.rotary_emb.tables[0](position_ids.long())

    def rope_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [max_seq_len, rotary_dim/2]: what a runtime feeding `--positions cos-sin` graphs gathers."""
        table = self.model.rotary_emb.tables[0]
        return table.cos, table.sin

    def example_inputs(self, past_len: int = 0) -> tuple[torch.Tensor, ...]:
        return self.graph_inputs(example_inputs(self.cfg, self.spec, past_len=past_len, mode=self.input_mode))

    def graph_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        """A runner's call (*first inputs, position_ids, attention_mask, *caches: static_runner) as this
        graph's inputs: an M-RoPE decoder takes `rope_positions` of those slots instead of position_ids, a
        cos/sin decoder RoPE's cos and sin of them."""
        n_first = len(self.input_mode.decoder_inputs)
        if self.cos_sin:
            return (*inputs[:n_first], *self.cos_sin_of(inputs[n_first]), *inputs[n_first + 1:])
        if not self.mrope:
            return tuple(inputs)
        rope = torch.from_numpy(self.rope_positions(inputs[n_first]))
        return (*inputs[:n_first], rope, *inputs[n_first + 1:])

    def input_names(self) -> list[str]:
        return input_names(self.spec.n_layers, self.input_mode, caches=not self.cfg.full, mrope=self.mrope,
                           cos_sin=self.cos_sin)

    def output_names(self) -> list[str]:
        return output_names(self.spec.n_layers, caches=not self.cfg.full)


def decoder_config(n_tokens: int, max_seq_len: int) -> StaticDecoderConfig:
    """The graph of N tokens per call: arN over a KV cache, or the full-context graph when N = C."""
    if n_tokens == max_seq_len:
        return StaticDecoderConfig.full_context(max_seq_len)
    return StaticDecoderConfig(n_tokens, max_seq_len)


def build_static_decoder(hf_model: nn.Module, cfg: StaticDecoderConfig, *, rms_norm: str = "aten",
                         inputs: str = DEFAULT_INPUT_MODE, residual_scale: float = 1.0,
                         positions: str = "ids") -> StaticDecoder:
    """A `StaticDecoder` sharing `hf_model`'s weights (no copy), in eval mode; `inputs` is its input
    mode (llm/model/input_modes.py: tokens, embeddings, both); the residual stream is carried at
    1/`residual_scale` (ResidualScale; llm/model/residual_scale.py picks it from text).

    Two decoders built from the same HF model (e.g. AR-1 and AR-32) share every parameter,
    which is what a weight-sharing export of both graphs wants.
    """
    return StaticDecoder(hf_model, cfg, rms_norm=rms_norm, inputs=inputs, residual_scale=residual_scale,
                         positions=positions).eval()


def check_cos_sin(position_inputs: PositionInputs, mrope: bool, model_type: str) -> None:
    """`--positions cos-sin` feeds one cos/sin pair to every layer: refused for a family with several RoPE
    tables (Gemma 3's local and global), sliding windows (their bias is computed from position_ids) or M-RoPE."""
    why = ("M-RoPE positions" if mrope else "several RoPE tables" if len(position_inputs.tables) != 1
           else "sliding-window layers" if len(position_inputs.windows) else None)
    if why:
        raise UnsupportedError(f"--positions cos-sin: {model_type} has {why}, which one cos/sin input pair cannot feed",
                               "leave --positions out (the graphs then take position_ids)")


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
