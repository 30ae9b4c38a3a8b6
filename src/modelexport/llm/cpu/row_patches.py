"""What ExecuTorch's Llama `Transformer` does not compute for a family row, done on the built model.

ExecuTorch's `ModelArgs` names Gemma's features (post norms, GELU, embedding scale, soft-caps,
local RoPE theta) but its `Transformer` in the version we ship reads none of them, so each row
field below has one entry here that changes the built model, as NoPE layers and partial rotary
are done in `export.py` (`hf_layout.unexpressed_fields` counts these fields as expressed):

- `sandwich_norms` (Gemma 2/3): the attention output and the MLP output are normed before each
  joins the residual, and the MLP's input norm is `pre_feedforward_layernorm` (hf_layout renames
  the weights; `add_sandwich_norms` makes their modules before the weights load);
- `activation_field`: the MLP's gate activation (`ACTIVATIONS`: GeGLU-tanh for Gemma);
- `embedding_scale`, `final_softcap_field`: the model's forward scales the looked-up embeddings
  (√hidden, rounded to the weight's dtype as HF does) and soft-caps the logits;
- `query_scale_field`, `attn_softcap_field`: the scores. Our `modelexport::sdpa` and
  `llama::custom_sdpa` compute softmax(q·k / √head_dim): a different query scale is folded into the
  q norm's weight when there is one (Gemma 3; RoPE is linear, so scaling before it is the same),
  and a layer whose scores need more (a soft-cap, a query scale with no q norm to take it, a
  sliding window shorter than the context) attends through `sdpa_op.ExplicitScores` (torch ops);
- `rope_per_layer_type` (Gemma 3): one RoPE table per layer type (local θ 10k, global θ 1M
  linear-scaled), each layer fed its own (`per_slot_rope`).
"""
from __future__ import annotations

import math
import types

import torch

from ...frontends.llm_families import LLMFamily, rope_slots, sliding_layers
from ..model.static_decoder import soft_cap

# the row fields this module expresses (hf_layout.unexpressed_fields reads it)
EXPRESSED_FIELDS = ("sandwich_norms", "embedding_scale", "query_scale_field", "attn_softcap_field",
                    "final_softcap_field", "rope_per_layer_type")
# EMBEDDING_SCALES key → the factor, from the config
EMBEDDING_SCALE_FNS = {"none": lambda cfg: 1.0, "sqrt_hidden": lambda cfg: cfg.hidden_size ** 0.5}


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """HF's gelu_pytorch_tanh, written out: ExecuTorch's XNNPACK partitioner takes
    `aten.gelu(approximate="tanh")` but serializes XNNPACK's GELU without the flag, i.e. the erf form
    (logits ~1e-3 away from transformers' on the tiny Gemma 3; pytorch/executorch#22851 routes it to
    XNNPACK's approximate GELU, after the version we ship); tanh and the products it lowers as they are."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


# llm_families.ACTIVATIONS → the function the CPU program computes
ACTIVATIONS = {"silu": torch.nn.functional.silu, "gelu_pytorch_tanh": gelu_tanh}


def _field(cfg, name: str | None):
    return getattr(cfg, name, None) if name else None


def activation_of(family: LLMFamily, cfg) -> str:
    return getattr(cfg, family.activation_field, None) or "silu"


# --------------------------------------------------------------------------------------------
# sandwich norms


def add_sandwich_norms(model, args) -> None:
    """Give every block the two post norms (on the meta device, as the rest before loading)."""
    from executorch.examples.models.llama.norm import RMSNorm

    for b in model.layers:
        for name in ("post_attention_norm", "post_ffn_norm"):
            setattr(b, name, RMSNorm(args.dim, eps=args.norm_eps, add_unit_offset=args.rms_norm_add_unit_offset))
        b.forward = types.MethodType(_sandwich_block_forward, b)


def _sandwich_block_forward(self, x, freqs_cos, freqs_sin, attn_options):
    """Gemma's block: x + post_attn(attn(norm(x))), then h + post_ffn(mlp(pre_ffn(h))). The input
    norms may have moved into the projections (linear_q4_op.fuse_input_norms: then Identity)."""
    a, update = self.attention(self.attention_norm(x), freqs_cos, freqs_sin, **attn_options)
    h = x + self.post_attention_norm(a)
    return h + self.post_ffn_norm(self.feed_forward(self.ffn_norm(h))), update


# --------------------------------------------------------------------------------------------
# the MLP's activation


def _gated_mlp_forward(self, x):
    return self.w2(self.act(self.w1(x)) * self.w3(x))


def set_activation(model, activation: str) -> None:
    """Every FeedForward computes w2(act(w1 x) * w3 x); `activation` is recorded on it, so that
    the fused SwiGLU kernel takes only the silu ones (linear_q4_op.fuse_swiglu)."""
    from executorch.examples.models.llama.feed_forward import FeedForward

    for m in model.modules():
        if type(m) is FeedForward:
            m.activation = activation
            if activation != "silu":
                m.act = ACTIVATIONS[activation]
                m.forward = types.MethodType(_gated_mlp_forward, m)


# --------------------------------------------------------------------------------------------
# embeddings in, logits out


def _scaled_capped_forward(self, tokens, attn_options=None):
    """ExecuTorch's `Transformer.forward` given the scaled embeddings, its logits soft-capped."""
    from executorch.examples.models.llama.llama_transformer import Transformer

    h = self.tok_embeddings(tokens)
    if self.embedding_scale != 1.0:
        h = h * self.embedding_scale
    return soft_cap(Transformer.forward(self, None, attn_options, h=h), self.final_softcap)


def scale_embeddings_and_cap_logits(model, hf_model, family: LLMFamily) -> dict:
    """Embeddings × the row's scale (a float in the embedding weight's dtype, as HF rounds it),
    logits soft-capped by the row's field; the lookup and the lm_head stay ExecuTorch's modules,
    so the quantizers and a GGUF's stored blocks find them as usual."""
    cfg = hf_model.config
    scale = EMBEDDING_SCALE_FNS[family.embedding_scale](cfg)
    dtype = hf_model.get_input_embeddings().weight.dtype
    model.embedding_scale = float(torch.tensor(scale, dtype=dtype)) if scale != 1.0 else 1.0
    model.final_softcap = _field(cfg, family.final_softcap_field)
    if model.embedding_scale != 1.0 or model.final_softcap is not None:
        model.forward = types.MethodType(_scaled_capped_forward, model)
    return {"embedding_scale": model.embedding_scale, "final_softcap": model.final_softcap}


# --------------------------------------------------------------------------------------------
# scores


def query_scale(family: LLMFamily, cfg, head_dim: int) -> float:
    """The factor the scores need beyond the kernels' 1/√head_dim (Gemma: √(head_dim / query_pre_attn_scalar))."""
    scalar = _field(cfg, family.query_scale_field)
    return 1.0 if scalar is None else math.sqrt(head_dim / float(scalar))


def fold_query_scale_into_q_norm(model, factor: float) -> None:
    """q_norm(q) × factor as the q norm's own weight: w·f, or for a (1 + w) norm w' = f(1 + w) - 1."""
    from executorch.examples.models.llama.attention import AttentionMHA

    for a in model.modules():
        if isinstance(a, AttentionMHA):
            n = a.q_norm_fn
            w = n.weight.detach().float()
            # a new tensor: the loaded weight may share its storage with the HF model's
            n.weight = torch.nn.Parameter((factor * (1.0 + w) - 1.0) if n.add_unit_offset else factor * w,
                                          requires_grad=False)


def scores_plan(family: LLMFamily, cfg, head_dim: int, max_seq_len: int, use_qk_norm: bool):
    """Per layer: None (the kernels' scores, after folding `query_scale` into the q norm) or the
    (scale, soft-cap, window) of the torch-ops scores; and the factor to fold (1.0: none)."""
    factor = query_scale(family, cfg, head_dim)
    cap = _field(cfg, family.attn_softcap_field)
    fold = factor if (use_qk_norm and factor != 1.0) else 1.0
    scale = factor / math.sqrt(head_dim) if fold == 1.0 else 1.0 / math.sqrt(head_dim)
    plans = []
    for window in sliding_layers(family, cfg):
        window = window if window is not None and window < max_seq_len else None
        explicit = cap is not None or window is not None or (factor != 1.0 and fold == 1.0)
        plans.append((scale, cap, window) if explicit else None)
    return plans, fold


# --------------------------------------------------------------------------------------------
# one RoPE table per layer type


class RopeTable(torch.nn.Module):
    """cos/sin [max_seq_len, head_dim] of one layer type, narrowed to the call's positions as
    ExecuTorch's `Rope.get_freqs` narrows its own."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        super().__init__()
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, input_pos: torch.Tensor, seq_len: int):
        start = input_pos[-1].item()
        torch._check(start >= 0)
        torch._check(start < self.freqs_cos.shape[0])
        return self.freqs_cos.narrow(0, start, seq_len), self.freqs_sin.narrow(0, start, seq_len)


def _per_slot_forward_layers(self, h, freqs_cos, freqs_sin, attn_options, seqlen):
    """ExecuTorch's `_forward_layers` (no KV sharing) with each layer fed its own table: the model's
    `rope` holds slot 0's (what `freqs_cos`/`freqs_sin` are), `rope_tables` the others."""
    tables = [(freqs_cos, freqs_sin)] + [t(attn_options["input_pos"], seqlen) for t in self.rope_tables]
    update = None
    for layer, slot in zip(self.layers, self.layer_rope_slot):
        h, update = layer(h, *tables[slot], attn_options)
    return h, update


def per_slot_rope(model, family: LLMFamily, cfg, tables: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> list[str]:
    """Slot 0's table into `model.rope`, the others into `model.rope_tables`, and the layer loop
    feeding each layer its slot's. `tables`: slot name → (cos, sin). → the slot names in order."""
    names = sorted(tables)
    model.rope.freqs_cos, model.rope.freqs_sin = tables[names[0]]
    if len(names) > 1:
        model.rope_tables = torch.nn.ModuleList(RopeTable(*tables[n]) for n in names[1:])
        model.layer_rope_slot = [names.index(s) if s is not None else 0 for s in rope_slots(family, cfg)]
        model._forward_layers = types.MethodType(_per_slot_forward_layers, model)
    return names
