"""The LLM families modelexport builds, as one table of data (as gguf-py keeps its architectures).

Every consumer looks a family's facts up here instead of branching on `model_type`: the frontends
accept what a row names (`check_config` refuses the rest before any weight is read), the NPU
static decoder (`llm/model/static_decoder.py`) picks its norm, activation, projections, RoPE and mask
from the row, the CPU export (`llm/cpu/export.py`) builds the rows marked `cpu`, and `inspect`
shows the row. A new family starts as a row here. It lives in `frontends/` because that is the
lowest part that needs it; `llm/` and `backends/` import it from here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..core.errors import InputError

# RMSNorm variants: the constant added to the learned weight (Gemma stores w and multiplies by 1 + w).
NORM_WEIGHT_OFFSET = {"rms": 0.0, "rms_one_plus": 1.0}
# MLP activations the builders implement (their functions are in llm/model/static_decoder.py's table).
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
# How a token embedding is scaled before the first layer.
EMBEDDING_SCALES = ("none", "sqrt_hidden")
# RoPE types whose tables a static graph can hold: each is a fixed function of the position.
# ("dynamic" NTK changes its frequencies with the length of the current call: no fixed table.)
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# Which layers attend through a sliding window (see `sliding_layers`).
SLIDING_RULES = ("none", "all", "layer_types", "layer_types_if_enabled")
LAYER_TYPES = ("full_attention", "sliding_attention")
@dataclass(frozen=True)
class GgufRopeScaling:
    """How one GGUF RoPE scaling becomes the HF rope parameters llama.cpp's converter wrote it from.
    transformers' GGUF loader reads no `<arch>.rope.scaling.*` key (only gpt-oss's): it would build
    every such model with unscaled RoPE, so gguf_file.py sets these on the config."""
    rope_type: str                                  # the HF rope_type
    keys: tuple[tuple[str, str], ...]               # (rope parameter, key under <arch>.rope.scaling.) when present
    required: tuple[str, ...] = ()                  # keys under <arch>.rope.scaling. it cannot do without
    # keys llama.cpp reads that HF has no parameter for: accepted only at the value that changes nothing
    neutral: tuple[tuple[str, float], ...] = ()
    # (rope parameter, tensor name): per-frequency factor lists the converter stores as F32 tensors
    # (not weights: transformers' loader skips them, they are read here)
    tensors: tuple[tuple[str, str], ...] = ()
    # (tensor name, solver in gguf_file.ROPE_SOLVERS): parameters the converter wrote only as
    # per-frequency divisors, solved back from them
    solved_from: tuple[str, str] | None = None

    def tensor_names(self) -> tuple[str, ...]:
        """The tensors this scaling is read from."""
        return tuple(n for _, n in self.tensors) + ((self.solved_from[0],) if self.solved_from else ())


# GGUF rope.scaling.type -> how it maps back. What convert_hf_to_gguf.py writes (TextModel for yarn,
# Phi3MiniModel for longrope); rope.scaling.attn_factor, which the Phi-3 converter derives from the two
# context lengths exactly as transformers' longrope does, is not carried (transformers derives it).
GGUF_ROPE_SCALINGS: dict[str, GgufRopeScaling] = {
    "linear": GgufRopeScaling("linear", (("factor", "factor"),), required=("factor",)),
    "yarn": GgufRopeScaling(
        "yarn", (("factor", "factor"), ("original_max_position_embeddings", "original_context_length"),
                 ("attention_factor", "yarn_attn_factor"), ("beta_fast", "yarn_beta_fast"),
                 ("beta_slow", "yarn_beta_slow")),
        required=("factor", "original_context_length"),
        neutral=(("yarn_ext_factor", 1.0), ("yarn_log_multiplier", 0.0))),
    "longrope": GgufRopeScaling(
        "longrope", (("original_max_position_embeddings", "original_context_length"),),
        required=("original_context_length",),
        tensors=(("long_factor", "rope_factors_long.weight"), ("short_factor", "rope_factors_short.weight"))),
    # Llama 3.x: LlamaModel writes rope_freqs.weight (each inverse frequency's divisor) and no key
    "llama3": GgufRopeScaling("llama3", (), solved_from=("rope_freqs.weight", "llama3")),
}
# A scaling a file states by carrying a tensor: llama.cpp's Phi-3 converter writes the longrope
# factor tensors but no rope.scaling.type, its Llama converter the llama3 divisors.
GGUF_ROPE_SCALING_BY_TENSOR = {"rope_factors_long.weight": "longrope", "rope_freqs.weight": "llama3"}


@dataclass(frozen=True)
class LLMFamily:
    model_type: str                      # HF config.model_type; also LoadedLLM.architecture
    label: str                           # the family's name in messages
    gguf_architectures: tuple[str, ...]  # GGUF general.architecture values transformers loads as this family
    npu: bool                            # the static decoder rebuilds it for the HTP
    cpu: bool                            # the CPU export builds it for XNNPACK
    cpu_missing: str = ""                # what the CPU export lacks for it, when cpu is False
    # norms
    norm: str = "rms"                    # NORM_WEIGHT_OFFSET key
    sandwich_norms: bool = False         # attention output normed, plus pre/post feed-forward norms (Gemma 2/3)
    qk_norm: bool = False                # q_norm / k_norm over each head before RoPE (Qwen3, Gemma 3)
    # projections
    fused_qkv: bool = False              # one self_attn.qkv_proj (q | k | v rows) instead of three (Phi-3)
    fused_gate_up: bool = False          # one mlp.gate_up_proj (gate | up rows) instead of two (Phi-3)
    qkv_bias: bool = False               # q/k/v always carry a bias, whatever config.attention_bias says
    attention_bias_on_o_proj: bool = False  # config.attention_bias biases o_proj too (the CPU export cannot)
    activation_field: str = "hidden_act"  # the config field naming the MLP's gate activation (ACTIVATIONS)
    # embeddings, scores, logits
    embedding_scale: str = "none"        # EMBEDDING_SCALES: Gemma multiplies embeddings by sqrt(hidden_size)
    query_scale_field: str | None = None  # scores scaled by this field ** -0.5 (Gemma's query_pre_attn_scalar), else head_dim
    attn_softcap_field: str | None = None   # scores -> cap * tanh(scores / cap) when the field is set (Gemma 2)
    final_softcap_field: str | None = None  # the same on the logits
    # positions and masks
    rope_types: tuple[str, ...] = ("default", "linear", "llama3", "yarn")  # the config's rope_type values accepted
    rope_per_layer_type: bool = False    # rope_parameters keyed by layer type, one table each (Gemma 3)
    nope_layers_field: str | None = None  # per-layer 1 = RoPE, 0 = no position encoding (SmolLM3's no_rope_layers)
    # the rope parameter that splits the rotary frequencies into (temporal, height, width) sections (M-RoPE,
    # Qwen2-VL's text model): when a config has it the decoder also takes 3-axis RoPE positions
    mrope_field: str | None = None
    sliding: str = "none"                # SLIDING_RULES key
    # GGUF header facts transformers' GGUF loader leaves at the config class's default
    gguf_config_keys: tuple[tuple[str, str], ...] = ()   # (key under <arch>., config field)
    gguf_scaled_rope_slot: str = ""      # the per-type RoPE table a GGUF's scaling is for (Gemma 3: the global layers')
    # rope.dimension_count is the rotated part of a head, which transformers' loader does not read
    # for this family: partial_rotary_factor = it / head_dim (Phi-4-mini: 96 of 128)
    gguf_partial_rotary: bool = False
    # A GGUF states no query_pre_attn_scalar: llama.cpp takes head_dim, except at the block counts of
    # the 27B checkpoints, where it takes hidden_size / heads (what their HF configs state: 144, 168).
    gguf_hidden_per_head_query_scale_at: tuple[int, ...] = ()

    def facts(self) -> dict[str, Any]:
        """The row as plain data (for `inspect` and messages)."""
        return asdict(self)


FAMILIES: tuple[LLMFamily, ...] = (
    # SmolLM/SmolLM2 and Llama 3.x are llama (llama3 RoPE scaling).
    LLMFamily("llama", "Llama", ("llama",), npu=True, cpu=True, attention_bias_on_o_proj=True),
    # llama.cpp files Mistral under "llama"; transformers then builds MistralForCausalLM (same shape).
    LLMFamily("mistral", "Mistral", ("mistral", "llama"), npu=True, cpu=True, sliding="all"),
    # Qwen2-VL's text model is qwen2 with M-RoPE (rope_parameters.mrope_section); text-only positions are
    # plain RoPE, so the same weights also run as a Qwen2ForCausalLM.
    LLMFamily("qwen2", "Qwen2", ("qwen2",), npu=True, cpu=True, qkv_bias=True, sliding="layer_types",
              mrope_field="mrope_section"),
    LLMFamily("qwen3", "Qwen3", ("qwen3",), npu=True, cpu=True, qk_norm=True, attention_bias_on_o_proj=True,
              sliding="layer_types"),
    LLMFamily("gemma2", "Gemma 2", ("gemma2",), npu=True, cpu=True,
              norm="rms_one_plus", sandwich_norms=True, attention_bias_on_o_proj=True, activation_field="hidden_activation",
              embedding_scale="sqrt_hidden", query_scale_field="query_pre_attn_scalar",
              attn_softcap_field="attn_logit_softcapping", final_softcap_field="final_logit_softcapping",
              sliding="layer_types",
              gguf_config_keys=(("attn_logit_softcapping", "attn_logit_softcapping"),
                                ("final_logit_softcapping", "final_logit_softcapping")),
              gguf_hidden_per_head_query_scale_at=(46,)),
    # Gemma 3's text model (270M, 1B); the 4B+ checkpoints are "gemma3" (text + vision) and not read.
    # llama.cpp files it as "gemma3"; transformers builds Gemma3ForCausalLM ("gemma3_text") from it.
    LLMFamily("gemma3_text", "Gemma 3", ("gemma3",), npu=True, cpu=True,
              norm="rms_one_plus", sandwich_norms=True, qk_norm=True, attention_bias_on_o_proj=True,
              activation_field="hidden_activation",
              embedding_scale="sqrt_hidden", query_scale_field="query_pre_attn_scalar",
              attn_softcap_field="attn_logit_softcapping", final_softcap_field="final_logit_softcapping",
              rope_per_layer_type=True, sliding="layer_types", gguf_scaled_rope_slot="full_attention",
              gguf_hidden_per_head_query_scale_at=(62,)),
    # Phi-3 / 3.5-mini and Phi-4-mini (partial rotary factor 0.75) are all "phi3".
    LLMFamily("phi3", "Phi-3", ("phi3",), npu=True, cpu=True,
              fused_qkv=True, fused_gate_up=True, rope_types=("default", "linear", "longrope"), sliding="all",
              gguf_config_keys=(("rope.scaling.original_context_length", "original_max_position_embeddings"),),
              gguf_partial_rotary=True),
    # SmolLM3: Llama with no RoPE in every 4th layer.
    LLMFamily("smollm3", "SmolLM3", (), npu=True, cpu=True, attention_bias_on_o_proj=True,
              nope_layers_field="no_rope_layers", sliding="layer_types_if_enabled"),
)

BY_MODEL_TYPE: dict[str, LLMFamily] = {f.model_type: f for f in FAMILIES}

# What the frontends load: every family some backend builds. GGUF names come from the same rows.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(f.model_type for f in FAMILIES if f.npu or f.cpu)
SUPPORTED_GGUF_ARCHITECTURES: tuple[str, ...] = tuple(dict.fromkeys(
    a for f in FAMILIES if f.npu or f.cpu for a in f.gguf_architectures))


def family_of(model_type: str | None, where: str) -> LLMFamily:
    """The row of `model_type`; InputError naming the table's rows when there is none."""
    family = BY_MODEL_TYPE.get(model_type)  # type: ignore[arg-type]
    if family is None:
        raise InputError(f"{where}: architecture {model_type!r} is not supported (no row in the family table)",
                         f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)} "
                         "(see docs/llm_export.md, 'Families'; SmolLM/SmolLM2 are llama)")
    return family


# ------------------------------------------------------------------------------------------------
# per-model facts read from a config (a transformers config object or config.json's dict): the
# same answers for the check before loading and for the builders after


def _get(cfg, name: str, default=None):
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def n_layers(cfg) -> int:
    return int(_get(cfg, "num_hidden_layers"))


def layer_types(cfg) -> list[str]:
    return list(_get(cfg, "layer_types", None) or ["full_attention"] * n_layers(cfg))


def rope_slots(family: LLMFamily, cfg) -> list[str | None]:
    """The RoPE table each layer reads: its layer type for per-type tables (Gemma 3), "" for the one
    table, None for a layer without position encoding (NoPE)."""
    types = layer_types(cfg)
    nope = _get(cfg, family.nope_layers_field) if family.nope_layers_field else None
    out: list[str | None] = []
    for i in range(n_layers(cfg)):
        if nope is not None and not nope[i]:
            out.append(None)
        else:
            out.append(types[i] if family.rope_per_layer_type else "")
    return out


def rope_parameters(family: LLMFamily, cfg) -> dict[str, dict]:
    """Rope parameters by slot name ("" = the model's one table)."""
    rp = _get(cfg, "rope_parameters", None) or _get(cfg, "rope_scaling", None) or {}
    if family.rope_per_layer_type:
        return {t: dict(rp.get(t) or {}) for t in sorted(set(layer_types(cfg)))}
    return {"": dict(rp)}


def mrope_sections(family: LLMFamily, cfg) -> tuple[int, ...] | None:
    """M-RoPE's split of the rotary half-dims into (temporal, height, width) sections (section i reads
    axis i % 3, as transformers' Qwen2-VL does), None for plain RoPE."""
    if not family.mrope_field:
        return None
    sections = rope_parameters(family, cfg)[""].get(family.mrope_field)
    return tuple(int(x) for x in sections) if sections else None


def sliding_layers(family: LLMFamily, cfg) -> list[int | None]:
    """Each layer's attention window in tokens (None = attends to every earlier position)."""
    window = _get(cfg, "sliding_window", None)
    types = layer_types(cfg)
    rule = {
        "none": lambda i: False,
        "all": lambda i: True,                                     # Mistral, Phi-3: every layer when set
        "layer_types": lambda i: types[i] == "sliding_attention",   # Gemma 2/3, Qwen2/3
        "layer_types_if_enabled": lambda i: bool(_get(cfg, "use_sliding_window", False))
        and types[i] == "sliding_attention",                        # SmolLM3
    }[family.sliding]
    return [int(window) if window and rule(i) else None for i in range(n_layers(cfg))]


def check_config(family: LLMFamily, cfg, where: str) -> None:
    """Refuse a config whose feature values the family's row does not cover, naming the field and
    the table entry that is missing. Needs no weights: run it on config.json before loading."""
    problems = []
    act = _get(cfg, family.activation_field, None) or "silu"
    if act not in ACTIVATIONS:
        problems.append(f"activation {family.activation_field}={act!r} (the table has {', '.join(ACTIVATIONS)})")
    unknown_types = sorted(set(layer_types(cfg)) - set(LAYER_TYPES))
    if unknown_types:
        problems.append(f"layer_types {unknown_types} (the table has {', '.join(LAYER_TYPES)})")
    for slot, rp in rope_parameters(family, cfg).items():
        rtype = rp.get("rope_type") or rp.get("type") or "default"
        if rtype == "mrope" and family.mrope_field:   # older Qwen2-VL configs; transformers reads it as "default"
            rtype = "default"
        if rtype not in family.rope_types or rtype not in STATIC_ROPE_TYPES:
            what = f"rope_parameters{f'[{slot!r}]' if slot else ''}.rope_type={rtype!r}"
            problems.append(f"{what} (the {family.label} row has {', '.join(family.rope_types)})")
    sections = mrope_sections(family, cfg)
    if sections is not None:
        head_dim = _get(cfg, "head_dim", None) or int(_get(cfg, "hidden_size")) // int(_get(cfg, "num_attention_heads"))
        if sum(sections) != head_dim // 2:
            problems.append(f"rope_parameters.{family.mrope_field}={list(sections)} (its sum must be head_dim / 2 = {head_dim // 2})")
        if any(w is not None for w in sliding_layers(family, cfg)):
            problems.append("sliding-window layers with M-RoPE positions (the window is not built for them)")
    if _get(cfg, "use_bidirectional_attention", False):
        problems.append("use_bidirectional_attention=True (the static decoder is causal)")
    if problems:
        raise InputError(f"{where}: this {family.label} model uses what the family table does not cover: "
                         + "; ".join(problems),
                         "use a model without these features, or add them to the family's row in "
                         "frontends/llm_families.py (see docs/llm_export.md, 'Families')")


def family_of_gguf(architecture: str | None, rope_scaling_type: str | None, where: str) -> LLMFamily:
    """The row a GGUF's `general.architecture` is filed under, after checking its RoPE scaling
    type (`<arch>.rope.scaling.type`: none, linear, yarn, longrope) against the row: both read
    from the header, before any weight."""
    family = next((f for f in FAMILIES if architecture in f.gguf_architectures and (f.npu or f.cpu)), None)
    if family is None:
        raise InputError(f"{where}: architecture {architecture!r} is not supported (no row in the family table)",
                         f"supported GGUF architectures: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)} "
                         "(see docs/llm_export.md, 'Families')")
    rtype = {None: "default", "none": "default"}.get(rope_scaling_type, rope_scaling_type)
    if rtype not in family.rope_types or (rtype != "default" and rtype not in GGUF_ROPE_SCALINGS):
        raise InputError(f"{where}: this {family.label} GGUF uses what the family table does not cover: "
                         f"rope.scaling.type={rope_scaling_type!r} (the {family.label} row has "
                         f"{', '.join(family.rope_types)}; from a GGUF header: "
                         f"{', '.join(['none', *GGUF_ROPE_SCALINGS])})",
                         "use the model's HF folder or a model without this RoPE scaling, or add it to the family's "
                         "row and GGUF_ROPE_SCALINGS in frontends/llm_families.py (see docs/llm_export.md, 'Families')")
    return family


def check_model_config(cfg, where: str) -> LLMFamily:
    """`family_of` + `check_config` for a config object or config.json's dict."""
    family = family_of(_get(cfg, "model_type"), where)
    check_config(family, cfg, where)
    return family


def check_model_context(max_seq_len: int, context_length: int | None, flag: str = "--max-seq-len") -> None:
    """Refuse a --max-seq-len beyond the context the model was trained for (its GGUF header or config);
    `flag`: the option that gave it (--context-lengths' longest)."""
    if context_length and max_seq_len > context_length:
        raise InputError(f"{flag} {max_seq_len} is beyond the model's context ({context_length} tokens)",
                         f"keep {flag} at {context_length} or less")


def check_static_context(family: LLMFamily, cfg, max_seq_len: int) -> None:
    """What a static graph of `max_seq_len` positions cannot follow. longrope switches to its long
    factor for calls longer than the original context (at run time, in HF); a static RoPE table
    holds one of the two: the short one, right up to the original context."""
    for rp in rope_parameters(family, cfg).values():
        original = rp.get("original_max_position_embeddings")
        if rp.get("rope_type") == "longrope" and original and max_seq_len > original:
            raise InputError(f"--max-seq-len {max_seq_len} is beyond the model's original context ({original}): "
                             "longrope's long factor would apply there, which a static RoPE table does not follow",
                             f"use --max-seq-len {original} or less")
