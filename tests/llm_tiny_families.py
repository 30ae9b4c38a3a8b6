"""Tiny random checkpoints of the families beside Llama, each from transformers' own config class
with the family's real field values scaled down and its special features switched on (Gemma 3: one
local and one global layer, a window shorter than the test context, a linear-scaled RoPE on the
global layer; Phi-3: fused projections, partial rotary, longrope; SmolLM3: a NoPE layer ...)."""
from __future__ import annotations

import torch
from llm_tiny import BOS, EOS, VOCAB

WINDOW = 8   # sliding window of the tiny Gemma models: shorter than every test context
_BASE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "bos_token_id": BOS,
             "eos_token_id": EOS, "pad_token_id": EOS}
_ROPE = {"rope_theta": 10000.0, "rope_type": "default"}


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    # Qwen3-0.6B: head_dim 128 > hidden / heads, q/k RMSNorm per head, rope theta 1e6
    return Qwen3ForCausalLM, Qwen3Config(**_BASE, num_hidden_layers=2, head_dim=32,
                                         rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"})


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM
    return Gemma2ForCausalLM, Gemma2Config(**_BASE, num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=24,
                                           sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                                           attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                           hidden_activation="gelu_pytorch_tanh", rope_parameters=dict(_ROPE))


def _gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    # Gemma 3 1B: local layers rope theta 10k, global ones 1M with linear scaling (4B+: factor 8)
    return Gemma3ForCausalLM, Gemma3TextConfig(
        **_BASE, num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})


def _phi3():
    from transformers import Phi3Config, Phi3ForCausalLM
    # Phi-4-mini: partial rotary 0.75, longrope with short/long factors, original context 4096 (here 128)
    half_rot = int(16 * 0.75) // 2
    return Phi3ForCausalLM, Phi3Config(**{**_BASE, "max_position_embeddings": 512}, num_hidden_layers=2,
                                       original_max_position_embeddings=128,
                                       rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.75,
                                                        "original_max_position_embeddings": 128,
                                                        "short_factor": [1.0 + 0.1 * i for i in range(half_rot)],
                                                        "long_factor": [2.0 + i for i in range(half_rot)]})


def _smollm3():
    from transformers import SmolLM3Config, SmolLM3ForCausalLM
    # SmolLM3-3B: no RoPE in every 4th layer
    return SmolLM3ForCausalLM, SmolLM3Config(**_BASE, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0],
                                             rope_parameters=dict(_ROPE))


BUILDERS = {"qwen3": _qwen3, "gemma2": _gemma2, "gemma3_text": _gemma3, "phi3": _phi3, "smollm3": _smollm3}
NEW_FAMILIES = tuple(BUILDERS)


def tiny_family_model(model_type: str, seed: int = 0, std: float = 0.2, **config_changes):
    """A random model of the family, weights drawn wide enough that every feature moves the logits;
    `config_changes` set config fields away from the builder's."""
    model_cls, cfg = BUILDERS[model_type]()
    for key, value in config_changes.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model


def save_tiny_family_folder(model_type: str, folder, seed: int = 0):
    """An HF folder of the tiny family model with the tiny byte-level tokenizer (named as a plain
    fast tokenizer: AutoTokenizer would otherwise pick the family's own class, e.g. Gemma's)."""
    import json
    from pathlib import Path

    from llm_tiny import tiny_tokenizer

    folder = Path(folder)
    model = tiny_family_model(model_type, seed)
    model.save_pretrained(folder)
    tiny_tokenizer().save(folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=1))
    return model
