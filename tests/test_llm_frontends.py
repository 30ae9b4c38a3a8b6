"""LLM frontends: GGUF files and HF folders, on crafted tiny GGUFs and the real SmolLM2 GGUF."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from modelexport.core.errors import InputError, OutputExistsError
from modelexport.frontends.gguf_file import load_gguf_causal_lm, read_gguf_info
from modelexport.frontends.hf_folder import load_hf_folder, write_hf_folder

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> printable-character table (the 256 base tokens of a byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tiny_gguf(path: Path, arch: str = "llama", *, tokenizer: bool = True, matrix_type: str = "F32",
                    embedding_type: str = "F32", output_type: str | None = None,
                    layer_types: dict[str, str] | None = None, drop: str | None = None,
                    stated: dict[str, int] | None = None) -> Path:
    """A 2-layer GGUF written with gguf.GGUFWriter: byte-level BPE tokenizer, chat template; its
    layers' matrices, token embedding and output stored as the GGML types named (F32, a type
    `gguf.quants.quantize` writes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, or a K-quant written by
    `gguf_kquants`: Q4_K, Q5_K, Q6_K; the output as the matrices by default). `layer_types`: a
    layer matrix's own type by its short name (`{"attn_v": "Q6_K", "ffn_down": "Q6_K"}`, as
    llama.cpp's Q4_K_M mixes them). With a K-quant anywhere the model is 256 wide (hidden 256,
    ffn 512, head dim 64), since a K-quant row holds super-blocks of 256 weights. A broken file for
    the bad-input tests: `drop` leaves that tensor out, `stated` writes other header values
    (`{"block_count": 3}`, `{"embedding_length": 96}`) than the tensors have."""
    import gguf
    from gguf.quants import quantize
    from gguf_kquants import ENCODERS, FILE_TYPES, quantize_k
    layer_types = layer_types or {}
    k_quant = bool({matrix_type, embedding_type, output_type, *layer_types.values()} & set(ENCODERS))
    L, H, NH, KV, D, F = (2, 256, 4, 2, 64, 512) if k_quant else (2, 64, 4, 2, 16, 128)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
    tokens = specials + _byte_level_alphabet()
    V = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_context_length(128)
    stated = {"block_count": L, "embedding_length": H, **(stated or {})}
    w.add_block_count(stated["block_count"])
    w.add_embedding_length(stated["embedding_length"])
    w.add_feed_forward_length(F)
    w.add_head_count(NH)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if matrix_type == "F32"
                    else gguf.LlamaFileType[FILE_TYPES.get(matrix_type, f"MOSTLY_{matrix_type}")])
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([3] * len(specials) + [1] * 256)
        w.add_token_scores([0.0] * V)
        w.add_token_merges([])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)

    def t(name, *shape, kind="F32"):
        if name == drop:
            return
        values = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if kind == "F32":
            w.add_tensor(name, values)
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            raw = quantize_k(values, kind) if kind in ENCODERS else quantize(values, qtype)
            w.add_tensor(name, raw, raw_dtype=qtype)

    def m(short):
        return layer_types.get(short, matrix_type)

    t("token_embd.weight", V, H, kind=embedding_type)
    t("output_norm.weight", H)
    t("output.weight", V, H, kind=output_type or matrix_type)
    for i in range(L):
        t(f"blk.{i}.attn_norm.weight", H)
        t(f"blk.{i}.ffn_norm.weight", H)
        for short, shape in (("attn_q", (NH * D, H)), ("attn_k", (KV * D, H)), ("attn_v", (KV * D, H)),
                             ("attn_output", (H, NH * D)), ("ffn_gate", (F, H)), ("ffn_up", (F, H)),
                             ("ffn_down", (H, F))):
            t(f"blk.{i}.{short}.weight", *shape, kind=m(short))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


@pytest.fixture(scope="module")
def tiny_llm(tiny_gguf):
    return load_gguf_causal_lm(tiny_gguf)


# --------------------------------------------------------------------------------------------- tiny


def test_tiny_gguf_info_and_load(tiny_gguf, tiny_llm):
    info = read_gguf_info(tiny_gguf)
    assert (info.architecture, info.n_layers, info.hidden_size, info.n_heads, info.n_kv_heads) == ("llama", 2, 64, 4, 2)
    assert info.vocab_size == 260 and info.tokenizer_model == "gpt2" and info.quant_types == {"F32": 21}
    assert info.supported and not info.tied_embeddings
    json.dumps(info.to_dict())                     # JSON-clean
    assert tiny_llm.source_format == "gguf" and tiny_llm.architecture == "llama"
    assert type(tiny_llm.model).__name__ == "LlamaForCausalLM"
    assert next(tiny_llm.model.parameters()).dtype == torch.float32
    assert tiny_llm.chat_template == CHAT_TEMPLATE
    ids = tiny_llm.apply_chat_template([{"role": "user", "content": "hi"}])
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1     # <|im_start|> twice, <|im_end|> once
    assert tiny_llm.eos_token_ids() == [2]


def test_write_hf_folder_round_trip(tiny_llm, tmp_path):
    out = write_hf_folder(tiny_llm, tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    again = load_hf_folder(out)
    assert again.source_format == "hf" and again.architecture == "llama"
    assert again.chat_template == CHAT_TEMPLATE
    ids = torch.tensor([[5, 60, 7, 200, 9]])
    with torch.no_grad():
        assert torch.equal(tiny_llm.model(ids).logits, again.model(ids).logits)
    assert again.tokenizer("hello world")["input_ids"] == tiny_llm.tokenizer("hello world")["input_ids"]
    with pytest.raises(OutputExistsError):
        write_hf_folder(tiny_llm, out)
    write_hf_folder(tiny_llm, out, force=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp folders left


def test_hf_folder_errors(tiny_llm, tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_hf_folder(tmp_path / "nope")
    good = write_hf_folder(tiny_llm, tmp_path / "hf")
    no_tok = tmp_path / "no_tok"
    shutil.copytree(good, no_tok)
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(InputError, match="tokenizer"):
        load_hf_folder(no_tok)
    other = tmp_path / "gpt2"
    shutil.copytree(good, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="llama"):
        load_hf_folder(other)
    (other / "config.json").unlink()
    with pytest.raises(InputError, match="config.json"):
        load_hf_folder(other)


def test_unsupported_architecture_gguf(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny-gpt2.gguf", arch="gpt2")
    info = read_gguf_info(path)
    assert info.architecture == "gpt2" and not info.supported
    with pytest.raises(InputError) as e:
        load_gguf_causal_lm(path)
    msg = str(e.value)
    assert "gpt2" in msg and "llama" in msg and "qwen2" in msg and "mistral" in msg


def test_not_a_gguf(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_gguf_info(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(InputError):
        read_gguf_info(junk)


def test_tiny_gguf_truncated_in_tensor_data(tiny_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-5000])
    with pytest.raises(InputError, match="truncated|corrupt"):
        read_gguf_info(cut)
    with pytest.raises(InputError):
        load_gguf_causal_lm(cut)


# --------------------------------------------------------------------------------------------- SmolLM2


@pytest.mark.smollm2
def test_smollm2_gguf_info(smollm2_gguf):
    info = read_gguf_info(smollm2_gguf)
    assert info.architecture == "llama" and info.supported
    assert (info.n_layers, info.hidden_size, info.n_heads, info.n_kv_heads) == (30, 576, 9, 3)
    assert (info.vocab_size, info.intermediate_size, info.context_length, info.head_dim) == (49152, 1536, 8192, 64)
    assert info.tokenizer_model == "gpt2" and info.tied_embeddings
    assert info.chat_template and "<|im_start|>" in info.chat_template
    assert "Q4_1" in info.quant_types and info.file_type == "MOSTLY_Q4_1"
    assert len(info.tensors) == 272 and 130e6 < info.n_params < 140e6
    emb = next(t for t in info.tensors if t.name == "token_embd.weight")
    assert emb.shape == (49152, 576) and emb.quant_type == "Q8_0"
    d = info.to_dict()
    assert d["supported"] and json.dumps(d)


@pytest.mark.smollm2
def test_smollm2_truncated(smollm2_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as f:
        cut.write_bytes(f.read(1000))
    with pytest.raises(InputError, match="truncated|corrupt"):
        read_gguf_info(cut)
    with pytest.raises(InputError):
        load_gguf_causal_lm(cut)


@pytest.mark.smollm2
def test_smollm2_static_decoder_matches_hf_and_answers_paris(smollm2_gguf):
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.static_runner import StaticRunner

    t0 = time.perf_counter()
    llm = load_gguf_causal_lm(smollm2_gguf)
    t_load = time.perf_counter() - t0
    assert type(llm.model).__name__ == "LlamaForCausalLM" and llm.model.config.num_hidden_layers == 30
    ids = llm.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    dec = build_static_decoder(llm.model, StaticDecoderConfig(16, 128))
    runner = StaticRunner.from_decoder(dec, n_tokens=(1,))
    got = runner.feed(ids)                              # AR-16 chunks, the last one padded
    with torch.no_grad():
        ref = llm.model(torch.tensor([ids])).logits[0]
    assert (got - ref).abs().max().item() < 1e-3
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    res = runner.generate(ids, max_new_tokens=12, eos_token_ids=llm.eos_token_ids())
    answer = llm.tokenizer.decode(res.new_ids, skip_special_tokens=True)
    assert "Paris" in answer, (answer, t_load)
