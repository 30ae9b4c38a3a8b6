"""A Hugging Face model of a CPU family → ExecuTorch's `Transformer`: its `ModelArgs` and its
weights under Meta's names, read from the family's row (`frontends/llm_families.py`).

Each row field the CPU program expresses has one entry below (`ROW_ARGS`: what it sets in
`ModelArgs`; `FUSED_ROWS`: how a fused HF weight is split by rows); a row using a field with no
entry here is not a CPU family (`unexpressed_fields`). What ExecuTorch's blocks do not read from
`ModelArgs` in the version we ship (NoPE layers: `no_rope_layer_interval` is a field nothing reads;
partial rotary, whose tables we take from HF) is done on the built model by `export.py`
(`nope_layers`, padded RoPE tables), and Gemma's features by `row_patches.py` (`EXPRESSED_FIELDS`).
"""
from __future__ import annotations

from typing import Any

from ...core.errors import UnsupportedError
from ...frontends.llm_families import (
    BY_MODEL_TYPE,
    FAMILIES,
    NORM_WEIGHT_OFFSET,
    LLMFamily,
    check_model_context,
    check_static_context,
    rope_slots,
)
from .row_patches import ACTIVATIONS, EXPRESSED_FIELDS, activation_of

# HF layer tensor (without .weight/.bias) → its name in ExecuTorch's Transformer
LAYER_NAMES = {
    "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3", "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attention.q_norm_fn", "self_attn.k_norm": "attention.k_norm_fn",
}


def _qkv_rows(args) -> list[tuple[str, int]]:
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    return [("attention.wq", q), ("attention.wk", kv), ("attention.wv", kv)]


def _gate_up_rows(args) -> list[tuple[str, int]]:
    return [("feed_forward.w1", args.hidden_dim), ("feed_forward.w3", args.hidden_dim)]   # gate rows first (Phi-3)


# row field → HF layer tensors named differently when the field is set (Gemma's sandwich norms:
# post_attention_layernorm is the attention output's norm, the MLP's input norm is pre_feedforward_layernorm)
ROW_RENAMES = {
    "sandwich_norms": {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                       "post_feedforward_layernorm": "post_ffn_norm"},
}

# row field → (the fused HF tensor, its parts in row order)
FUSED_ROWS = {
    "fused_qkv": ("self_attn.qkv_proj", _qkv_rows),
    "fused_gate_up": ("mlp.gate_up_proj", _gate_up_rows),
}

# row field → the ModelArgs it sets, from the field's value (a row's default value sets nothing)
ROW_ARGS = {
    # q/k RMSNorm over each head before RoPE (Qwen3): AttentionMHA's q_norm_fn / k_norm_fn
    "qk_norm": lambda on: {"use_qk_norm": True, "qk_norm_before_rope": True} if on else {},
    "norm": lambda kind: {"rms_norm_add_unit_offset": NORM_WEIGHT_OFFSET[kind] == 1.0},
}
# row fields handled outside ModelArgs: by the GGUF loader (gguf_*: the model arrives with them applied),
# the renaming (FUSED_ROWS), the checks in model_args_from_hf,
# or on the built model (export.py: NoPE layers, RoPE tables from HF; row_patches.py: the rest,
# sliding windows included: row_patches.scores_plan)
HANDLED_ELSEWHERE = ("model_type", "label", "gguf_architectures", "gguf_config_keys", "gguf_scaled_rope_slot",
                     "gguf_hidden_per_head_query_scale_at",
                     "gguf_partial_rotary",
                     "npu", "cpu", "cpu_missing", "qkv_bias",
                     "attention_bias_on_o_proj", "activation_field", "rope_types", "nope_layers_field", "sliding",
                     # the CPU program takes text only, where M-RoPE's three axes are equal: plain RoPE (llm/model/mrope.py)
                     "mrope_field",
                     *FUSED_ROWS, *EXPRESSED_FIELDS)
_ROW_DEFAULTS = LLMFamily("", "", (), npu=False, cpu=False).facts()


def unexpressed_fields(family: LLMFamily) -> list[str]:
    """The row's fields, set away from their default, that the CPU program has no entry for."""
    return [k for k, v in family.facts().items()
            if k not in ROW_ARGS and k not in HANDLED_ELSEWHERE and v != _ROW_DEFAULTS[k]]


RUN_ON_THE_NPU = ("run it on the NPU instead: modelexport compile MODEL -o OUT, then "
                  "modelexport generate OUT --backend htp-sim")


def require_cpu_family(family, name):
    """The family's row if the CPU export builds it; else UnsupportedError with what it lacks."""
    if family is not None and family.cpu:
        return family
    *rest, last = (f.model_type for f in FAMILIES if f.cpu)
    lacks = f": it lacks {family.cpu_missing}" if family is not None and family.cpu_missing else ""
    raise UnsupportedError(f"the CPU runtime builds {', '.join(rest)} and {last} models, not {name!r}{lacks}",
                           RUN_ON_THE_NPU)


def check_cpu_config(config, max_seq_len: int) -> LLMFamily:
    """What the CPU program cannot follow in this config, refused from the config alone."""
    mt = getattr(config, "model_type", None)
    family = require_cpu_family(BY_MODEL_TYPE.get(mt), mt)
    if getattr(config, "mlp_bias", False):
        raise UnsupportedError("MLP biases are not supported by the CPU export", RUN_ON_THE_NPU)
    if getattr(config, "attention_bias", False) and family.attention_bias_on_o_proj:
        raise UnsupportedError(f"attention biases on a {mt} model (o_proj bias) are not supported by the CPU export",
                               RUN_ON_THE_NPU)
    act = activation_of(family, config)
    if act not in ACTIVATIONS:
        raise UnsupportedError(f"activation {family.activation_field}={act!r} is not supported by the CPU export "
                               f"(it has {', '.join(ACTIVATIONS)})", RUN_ON_THE_NPU)
    check_model_context(max_seq_len, getattr(config, "max_position_embeddings", None))
    check_static_context(family, config, max_seq_len)   # longrope: the short factor's table only
    return family


def model_args_from_hf(config, max_seq_len: int):
    """ExecuTorch `ModelArgs` for a HF config of a CPU family; UnsupportedError for what it lacks.
    RoPE is the full head here: the HF model's own tables go in later (padded when partial)."""
    from executorch.examples.models.llama.model_args import ModelArgs

    family = check_cpu_config(config, max_seq_len)
    n_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    row = family.facts()
    extra: dict[str, Any] = {}
    for field, to_args in ROW_ARGS.items():
        extra.update(to_args(row[field]))
    return ModelArgs(
        dim=config.hidden_size, n_layers=config.num_hidden_layers, n_heads=n_heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads, vocab_size=config.vocab_size,
        hidden_dim=config.intermediate_size, head_dim=head_dim, norm_eps=float(config.rms_norm_eps),
        attention_qkv_bias=family.qkv_bias or bool(getattr(config, "attention_bias", False)), use_hf_rope=True,
        max_seq_len=max_seq_len, max_context_len=max_seq_len, use_kv_cache=True, use_sdpa_with_kv_cache_op=True,
        enable_dynamic_shape=True, generate_full_logits=False, max_batch_size=1, **extra)


def nope_layers(config) -> list[int]:
    """The layers without position encoding (SmolLM3's no_rope_layers), by the family table."""
    family = BY_MODEL_TYPE[config.model_type]
    return [i for i, slot in enumerate(rope_slots(family, config)) if slot is None]


def meta_state_dict(hf_model, args) -> dict:
    """The HF weights under Meta's names, fused ones split by rows (per the family row); an HF
    layer tensor with no place in ExecuTorch's layout is refused, naming it."""
    family = BY_MODEL_TYPE[hf_model.config.model_type]
    fused = {hf: parts for field, (hf, parts) in FUSED_ROWS.items() if getattr(family, field)}
    names = dict(LAYER_NAMES)
    for field, renames in ROW_RENAMES.items():
        if getattr(family, field):
            names.update(renames)
    sd = hf_model.state_dict()
    emb = sd["model.embed_tokens.weight"]
    out = {"tok_embeddings.weight": emb, "norm.weight": sd["model.norm.weight"],
           "output.weight": sd.get("lm_head.weight", emb)}
    for key, value in sd.items():
        if not key.startswith("model.layers."):
            continue
        i, rest = key[len("model.layers."):].split(".", 1)
        name, kind = rest.rsplit(".", 1)                       # kind: weight | bias
        if name in fused:
            start = 0
            for meta, rows in fused[name](args):
                out[f"layers.{i}.{meta}.{kind}"] = value[start:start + rows]
                start += rows
            continue
        if name not in names:
            raise UnsupportedError(f"the CPU export has no place for {key} in ExecuTorch's Llama layout")
        out[f"layers.{i}.{names[name]}.{kind}"] = value
    return {k: v.detach().float().contiguous() for k, v in out.items()}
