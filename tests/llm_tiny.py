"""Tiny real Llama-family models (one shared config, random weights, seeded) and a byte-level
tokenizer for them, built in-process.

The tokenizer is a real `tokenizers` byte-level BPE with 256 byte tokens, `<s>`=256 and
`</s>`=257 and a ChatML-like template; the model's vocabulary is 260 (a little padding, as real
models have)."""
from __future__ import annotations

import contextlib
import copy

import torch

VOCAB = 260
BOS, EOS = 256, 257
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant: {% endif %}")
# Every tiny Llama-family test model's config fields (JSON-able: a child process can rebuild it).
TINY_CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                   tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS,
                   rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})


# Calibration text for tiny LLM compiles (short, real words, repeated to give every variant samples).
CALIBRATION_TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "Markets rose on Tuesday as investors weighed "
                    "the outlook for interest rates and the health of the economy, while officials said talks would "
                    "resume. ") * 40


@contextlib.contextmanager
def tiny_llm_work(tmp_path_factory, name: str):
    """A module's work folder holding `tiny_hf` (seed 1, untied: a model whose greedy text varies) and
    `calib.txt`, with MODELEXPORT_CACHE_DIR in the session's temp folder while the module runs."""
    import pytest
    root = tmp_path_factory.mktemp(name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        write_tiny_llm_folder(root, seed=1, tie_word_embeddings=False)
        yield root


def write_tiny_llm_folder(root, n_layers: int = 2, **kw):
    """`root/tiny_hf` (a tiny Llama with its tokenizer) and `root/calib.txt`, what LLM compile tests start
    from; `kw` goes to tiny_llama (seed=1, tie_word_embeddings=False: a model whose greedy text varies)."""
    from pathlib import Path
    root = Path(root)
    tiny_llama(n_layers=n_layers, **kw).save_pretrained(root / "tiny_hf")
    tiny_tokenizer().save(root / "tiny_hf")
    (root / "calib.txt").write_text(CALIBRATION_TEXT)
    return root


def tiny_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from modelexport.llm.run.tokenizers import HFTokenizer

    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return HFTokenizer(backend, bos_id=BOS, eos_ids=[EOS], add_bos=True, chat_template=TEMPLATE, source="tiny", kind="hf")


def tiny_config(config_cls=None, **kw):
    """`config_cls` (LlamaConfig by default; Qwen2Config and MistralConfig take the same fields) with
    TINY_CONFIG's fields, `kw` overriding them."""
    if config_cls is None:
        from transformers import LlamaConfig as config_cls
    return config_cls(**{**copy.deepcopy(TINY_CONFIG), **kw})   # a config keeps the rope dict it is given


def tiny_llama(n_layers: int = 2, seed: int = 0, **kw):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(num_hidden_layers=n_layers, **kw)
    model = LlamaForCausalLM(cfg).eval()
    # sharper logits than the default init, so greedy choices are well separated (no near-ties)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0) if not cfg.tie_word_embeddings else model.model.embed_tokens.weight.mul_(8.0)
    return model


def smollm2_shaped_llama(n_layers: int = 2, seed: int = 0):
    """Random weights in SmolLM2-135M's shapes (576 wide, 9 heads, 3 KV heads, head_dim 64, RoPE
    theta 100000) with the tiny vocabulary: some HTP behaviour shows only at these sizes."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(hidden_size=576, intermediate_size=1536, num_hidden_layers=n_layers, num_attention_heads=9,
                      num_key_value_heads=3, max_position_embeddings=2048,
                      rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})
    return LlamaForCausalLM(cfg).eval()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=EOS, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def random_graph_feed(model, rng) -> dict:
    """Random inputs for every input of the ONNX graph `model` (read without its data): normal floats,
    small integer ids and positions, an attention mask of 0 / -1e4."""
    import numpy as np
    import onnx
    feed = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            feed[i.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            feed[i.name] = rng.integers(0, 8, size=shape).astype(np.int64 if i.type.tensor_type.elem_type == 7 else np.int32)
    if "attention_mask" in feed:
        feed["attention_mask"] = np.where(rng.random(feed["attention_mask"].shape) < 0.5, 0.0, -1e4).astype(np.float32)
    return feed


def save_real_layers(gguf, folder, n_layers: int = 2):
    """The real weights of `gguf` (SmolLM2, Gemma 3), cut to their first `n_layers`, saved with the tokenizer as
    an HF folder at `folder` (a real model's numbers at a compile of about a minute)."""
    from modelexport.frontends.gguf_file import load_gguf_causal_lm

    llm = load_gguf_causal_lm(gguf)
    model = copy.deepcopy(llm.model)
    model.model.layers = model.model.layers[:n_layers]
    model.config.num_hidden_layers = n_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:n_layers]
    model.hf_quantizer = None                       # the GGUF load marks the model as quantized
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(folder, safe_serialization=True)
    llm.tokenizer.save_pretrained(folder)
    return folder
