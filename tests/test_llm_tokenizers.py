"""Tokenizers on the real files that ship in installed packages: the GGUF's BPE tokenizer
(SmolLM2), a SentencePiece model (Mistral v1, 32,000 tokens) and a tokenizer.json; chat
templates; the streaming decoder."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from modelexport.core.errors import InputError
from modelexport.llm.run.tokenizers import (
    HFTokenizer, SentencePieceTokenizer, StreamDecoder, check_vocab, load_gguf_tokenizer, load_tokenizer,
    load_tokenizer_json, render_chat_template)


def _pkg_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)   # locates the package without importing it
    return Path(list(spec.submodule_search_locations)[0])


MISTRAL_SP = _pkg_dir("mistral_common") / "data" / "tokenizer.model.v1"
LEE = _pkg_dir("gensim") / "test" / "test_data" / "lee_background.cor"

MIXED = ["What is the capital of France?", "  leading spaces and\ttabs\nnew lines  ", "Héllo wörld — ünïcode ✓",
         "emoji 😀🚀 and CJK 日本語", "numbers 1234567890 3.14159", "code: def f(x):\n    return x**2  # comment",
         "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def smol(smollm2_gguf):
    return load_gguf_tokenizer(smollm2_gguf)


@pytest.fixture(scope="module")
def mistral():
    return SentencePieceTokenizer(MISTRAL_SP)


@pytest.fixture(scope="module")
def lee_lines():
    return [l.strip() for l in LEE.read_text(encoding="utf-8", errors="replace").splitlines() if l.strip()][:60]


# --------------------------------------------------------------------------------------------
def test_gguf_tokenizer_facts(smol):
    assert smol.kind == "gguf"
    assert smol.vocab_size == 49152
    assert smol.bos_id == 1 and smol.eos_ids == (2,)
    assert smol.id_to_token(1) == "<|im_start|>" and smol.id_to_token(2) == "<|im_end|>"
    assert smol.add_bos is False            # the GGUF says tokenizer.ggml.add_bos_token = false
    # the same ids transformers gives for this file
    assert smol.encode("What is the capital of France?") == [1780, 314, 260, 3575, 282, 4649, 47]


def test_gguf_tokenizer_round_trip(smol, lee_lines):
    for text in MIXED + lee_lines:
        ids = smol.encode(text)
        assert smol.decode(ids) == text
    # special-token strings in text map to their single ids
    assert smol.encode("<|im_start|>user") == [1, 4093]


def test_gguf_chat_template_as_the_model_defines_it(smol):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    text = smol.render_chat(msgs)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = smol.encode_chat(msgs)
    assert ids[0] == 1 and ids[-4:] == [1, 520, 9531, 198]   # <|im_start|> assistant \n
    assert smol.decode(ids) == text
    with_system = smol.render_chat([{"role": "system", "content": "Be brief."}, *msgs], add_generation_prompt=False)
    assert with_system.startswith("<|im_start|>system\nBe brief.<|im_end|>") and not with_system.endswith("assistant\n")


def test_gguf_tokenizer_matches_transformers_on_real_text(smol, lee_lines, smollm2_gguf):
    """transformers' own GGUF tokenizer (slow to build: once) gives the same ids."""
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    for text in MIXED + lee_lines[:20]:
        assert smol.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
    assert smol.render_chat(msgs) == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_tokenizer_json_folder(smol, tmp_path, lee_lines):
    folder = tmp_path / "tok"
    smol.save(folder)
    tok = load_tokenizer(folder)
    assert isinstance(tok, HFTokenizer) and tok.kind == "hf"
    assert tok.vocab_size == 49152 and tok.bos_id == 1 and tok.eos_ids == (2,)
    assert tok.chat_template == smol.chat_template
    for text in MIXED + lee_lines[:20]:
        assert tok.encode(text) == smol.encode(text)
    # a tokenizer_config.json that asks for BOS gets it; a bad file is a clean error
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["add_bos_token"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_tokenizer_json(folder).encode("hi")[0] == 1
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError):
        load_tokenizer(tmp_path / "bad.json")


# --------------------------------------------------------------------------------------------
def test_sentencepiece_facts(mistral):
    assert mistral.vocab_size == 32000
    assert mistral.bos_id == 1 and mistral.eos_ids == (2,)
    assert [mistral.id_to_token(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]
    assert mistral.encode("Hello world") == [1, 22557, 1526]
    assert mistral.encode("Hello world", add_special_tokens=False) == [22557, 1526]
    # control tokens written in the text become their ids (templates write "<s>[INST] ...")
    assert mistral.encode("<s>[INST] hi [/INST]", add_special_tokens=False)[:1] == [1]
    assert mistral.decode([1, 22557, 1526, 2]) == "<s>Hello world</s>"
    assert mistral.decode([1, 22557, 1526, 2], skip_special_tokens=True) == "Hello world"


def test_sentencepiece_round_trip(mistral, lee_lines):
    for text in MIXED[:-1] + lee_lines:
        t = text.strip()
        assert mistral.decode(mistral.encode(t), skip_special_tokens=True) == t
    # byte fallback: characters outside the vocabulary come back intact
    assert mistral.decode(mistral.encode("𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ☃"), skip_special_tokens=True) == "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ☃"


def test_sentencepiece_with_a_chat_template(mistral):
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
    tok = SentencePieceTokenizer(MISTRAL_SP, chat_template=template)
    ids = tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == 1 and ids.count(1) == 1
    assert tok.decode(ids) == "<s>[INST] Hi [/INST]"


def test_load_tokenizer_picks_the_kind(tmp_path, smollm2_gguf):
    assert isinstance(load_tokenizer(MISTRAL_SP), SentencePieceTokenizer)
    assert load_tokenizer(smollm2_gguf).kind == "gguf"
    with pytest.raises(InputError):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "junk.model").write_bytes(b"\x00\x01junk")
    with pytest.raises(InputError):
        load_tokenizer(tmp_path / "junk.model")


def test_vocab_mismatch_is_an_input_error(smol, mistral):
    check_vocab(mistral, 32000)
    check_vocab(mistral, 32768)         # a padded embedding is fine
    with pytest.raises(InputError, match="do not belong together"):
        check_vocab(smol, 32000)


# --------------------------------------------------------------------------------------------
def test_chat_template_rendering_rules():
    t = "{% for m in messages %}{{ m.role }}: {{ m.content | tojson }}\n{% endfor %}{% if add_generation_prompt %}bot:{% endif %}"
    out = render_chat_template(t, [{"role": "user", "content": "é \"q\""}], add_generation_prompt=True)
    assert out == 'user: "é \\"q\\""\nbot:'
    with pytest.raises(InputError, match="refused"):
        render_chat_template("{{ raise_exception('roles must alternate') }}", [{"role": "user", "content": "x"}])
    with pytest.raises(InputError, match="does not parse"):
        render_chat_template("{% for %}", [])


@pytest.mark.parametrize("which", ["smol", "mistral"])
def test_stream_decoder_never_splits_characters(which, request):
    tok = request.getfixturevalue(which)
    text = "Héllo wörld — ünïcode 😀🚀 日本語 ok"
    ids = tok.encode(text, add_special_tokens=False)
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces)
    # with prompt context, a word-initial space of the first new token is kept
    prompt = tok.encode("The capital of France is", add_special_tokens=False)
    nxt = tok.encode("The capital of France is Paris", add_special_tokens=False)[len(prompt):]
    dec = StreamDecoder(tok, prompt)
    assert "".join(dec.push(i) for i in nxt) + dec.flush() == " Paris"
