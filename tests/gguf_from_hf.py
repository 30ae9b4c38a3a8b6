"""A GGUF written from a tiny HF model of a family as llama.cpp's convert_hf_to_gguf.py writes that
family: its header keys (Gemma 2/3, Qwen2 with yarn, Phi-3 with longrope and its factor tensors),
gguf-py's own tensor names (`TensorNameMap`), Gemma's norms stored as 1 + w, and a SentencePiece vocabulary (tokenizer.ggml.model "llama", byte tokens <0x00>..<0xFF>),
as users' Gemma GGUFs carry. The same weights are then in both forms: transformers' GGUF loader
and the HF folder can be compared."""
from __future__ import annotations

from pathlib import Path

import numpy as np

# Gemma's SentencePiece specials, at their real ids (pad 0, eos 1, bos 2, unk 3, mask 4: transformers'
# GemmaTokenizer adds a <mask> the vocabulary lacks), then the turn markers.
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
PIECES = ["▁", "▁the", "▁quick", "▁brown", "▁fox", "▁jumps", "▁over", "▁lazy", "▁dog", "e", "t", "a", "o", "n", "s",
          "h", "r", "▁a", "▁T", "he", "Th", "▁The", "in", "er", "on", "."]
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                  "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def gemma_vocab() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types (1 normal, 3 control, 6 byte) of a tiny Gemma-like vocabulary."""
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = SPECIALS + byte_tokens + PIECES
    scores = [0.0] * (len(SPECIALS) + 256) + [-float(i) for i in range(len(PIECES))]
    types = [3] * len(SPECIALS) + [6] * 256 + [1] * len(PIECES)
    return tokens, scores, types


def _header(w, cfg, arch: str) -> dict:
    """The keys convert_hf_to_gguf.py's Gemma2Model / Gemma3Model write."""
    _common_header(w, cfg)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_sliding_window(cfg.sliding_window)
    rope = cfg.rope_parameters
    if arch == "gemma2":
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    else:
        full = rope["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        if full.get("rope_type") == "linear":          # Gemma 3 4B+: factor 8 on the global layers
            import gguf
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
    return {}


def _common_header(w, cfg) -> None:
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)


def _qwen2_header(w, cfg, arch: str) -> dict:
    """TextModel.set_gguf_parameters: a yarn scaling as type, factor, original context and the yarn
    parameters the config states."""
    import gguf
    _common_header(w, cfg)
    rope = cfg.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast), ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rope.get(key) is not None:
                add(rope[key])
    return {}


def _phi3_header(w, cfg, arch: str) -> dict:
    """Phi3MiniModel: the original context and the rotated dims always, no rope.scaling.type; a
    longrope config as the attention factor it derives plus two F32 factor tensors."""
    import math
    _common_header(w, cfg)
    rope = cfg.rope_parameters
    orig = rope["original_max_position_embeddings"]
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * cfg.hidden_size) // cfg.num_attention_heads)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_sliding_window(cfg.sliding_window or 0)
    if not rope.get("long_factor"):
        return {}
    scale = cfg.max_position_embeddings / orig
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
    return {"rope_factors_long.weight": np.array(rope["long_factor"], np.float32),
            "rope_factors_short.weight": np.array(rope["short_factor"], np.float32)}


def _llama_header(w, cfg, arch: str) -> dict:
    """LlamaModel: a llama3 scaling only as rope_freqs.weight, each inverse frequency's divisor
    (generate_extra_tensors), and no rope.scaling key."""
    import math
    _common_header(w, cfg)
    rope = cfg.rope_parameters
    dims = cfg.head_dim
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_rope_dimension_count(dims)
    if rope.get("rope_type") != "llama3":
        return {}
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    orig = rope["original_max_position_embeddings"]
    divisors = []
    for i in range(dims // 2):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (2 * i / dims)
        smooth = (orig / wavelen - low) / (high - low)
        divisors.append(1.0 if wavelen < orig / high else factor if wavelen > orig / low
                        else 1 / ((1 - smooth) / factor + smooth))
    return {"rope_freqs.weight": np.array(divisors, np.float32)}


def _llama_rows(values, heads: int):
    """llama.cpp's LlamaModel.permute of q/k rows (each head's halves interleaved), which
    transformers' GGUF loader undoes for llama."""
    return values.reshape(heads, 2, values.shape[0] // heads // 2, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)


# Llama-style SentencePiece vocabularies spell bos / eos <s> / </s> (transformers' LlamaTokenizer adds
# those two otherwise, and the vocabulary outgrows the embedding)
SPECIAL_SPELLING = {a: {"<bos>": "<s>", "<eos>": "</s>"} for a in ("llama", "qwen2", "phi3")}

HEADERS = {"llama": _llama_header, "gemma2": _header, "gemma3": _header, "qwen2": _qwen2_header, "phi3": _phi3_header}
NORM_OFFSET = {"gemma2": 1.0, "gemma3": 1.0}      # Gemma's RMSNorm scales by 1 + w


def write_gguf_from_hf(model, path: Path, arch: str, matrix_type: str = "F32") -> Path:
    """`model` (a Gemma2/Gemma3/Qwen2/Phi3 ForCausalLM) as a GGUF of architecture `arch`; 2-D
    weights stored as `matrix_type` (F32, or a type `gguf.quants.quantize` writes: Q8_0, ...)."""
    import gguf
    from gguf.quants import quantize

    cfg = model.config
    names = gguf.TensorNameMap(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    extra = HEADERS[arch](w, cfg, arch)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if matrix_type == "F32" else gguf.LlamaFileType[f"MOSTLY_{matrix_type}"])
    tokens, scores, types = gemma_vocab()
    tokens = [SPECIAL_SPELLING.get(arch, {}).get(t, t) for t in tokens]
    assert len(tokens) <= cfg.vocab_size, (len(tokens), cfg.vocab_size)
    tokens += [f"<unused{i}>" for i in range(cfg.vocab_size - len(tokens))]
    scores += [0.0] * (cfg.vocab_size - len(scores))
    types += [5] * (cfg.vocab_size - len(types))           # 5: unused
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(GEMMA_TEMPLATE)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, name
        values = tensor.detach().float().numpy()
        if name.endswith("norm.weight"):
            values = values + NORM_OFFSET.get(arch, 0.0)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            values = _llama_rows(values, cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads)
        if values.ndim == 2 and matrix_type != "F32":
            qtype = gguf.GGMLQuantizationType[matrix_type]
            w.add_tensor(gname, quantize(values, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(values, dtype=np.float32))
    for gname, values in extra.items():                      # what the converter adds (rope factors)
        w.add_tensor(gname, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
