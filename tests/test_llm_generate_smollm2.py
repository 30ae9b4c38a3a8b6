"""SmolLM2-135M-Instruct (the real Q4_1 GGUF) on the CPU runtime.

The CPU programs are built once and kept in a persistent cache (`bench/.work/cache`, or
`MODELEXPORT_LLM_TEST_CACHE`), keyed by the GGUF's sha256 and the options, so only the first
run on a machine pays the export; the benchmark uses the same cache."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from conftest import REPO, assert_clean_error

# These run in `make test` (CI): the first run on a machine builds the 8da4w program (about 4
# minutes on 2 cores, once: it is cached by content). The fp32 program takes ~9 minutes to build:
# its test runs with `make test-heavy` only.
pytestmark = [pytest.mark.smollm2, pytest.mark.slow]
HEAVY = pytest.mark.skipif(not os.environ.get("MODELEXPORT_HEAVY_TESTS"),
                           reason="heavy: run with `make test-heavy` (SmolLM2 fp32 XNNPACK export, ~9 min)")

CACHE = Path(os.environ.get("MODELEXPORT_LLM_TEST_CACHE") or REPO / "bench" / ".work" / "cache")
# A question whose answer the float model (the GGUF dequantized) does not leave to chance: the first
# token of "The capital city of France is Paris." leads by 0.73 logits there. To "What is the capital
# of France?" it leads by 0.08, within the noise of any 8-bit-activation engine: from this very file
# llama.cpp answers "L'Étoile, la Marseillaise, ..." and so does the program that keeps the file's
# blocks, token for token (issue 20); a test on it measured luck, not the program.
ASK = "Name the capital city of France."
QUESTION = [{"role": "user", "content": ASK}]


@pytest.fixture(scope="module")
def hf(smollm2_gguf):
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    return load_gguf_causal_lm(smollm2_gguf)


def _load(gguf, quant: str):
    import modelexport.llm as llm
    return llm.load(gguf, quant=quant, cache_dir=CACHE)


@pytest.fixture(scope="module")
def q4(smollm2_gguf):
    return _load(smollm2_gguf, "8da4w")


@pytest.fixture(scope="module")
def fp32(smollm2_gguf):
    return _load(smollm2_gguf, "fp32")


def _hf_greedy(hf, ids, n):
    import torch
    with torch.no_grad():
        out = hf.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=n, do_sample=False, pad_token_id=2)
    return out[0, len(ids):].tolist()


def test_8da4w_answers_paris(q4):
    res = q4.generate(QUESTION, max_new_tokens=24)
    assert "Paris" in res.text, res.text
    assert res.stats.stop_reason == "eos"
    assert res.stats.decode_tokens_per_s > 0 and res.stats.prefill_tokens_per_s > 0
    info = q4.info
    assert info["tokenizer"]["vocab_size"] == 49152 and info["max_seq_len"] == 2048
    assert info["export"]["options"]["quant"] == "8da4w"


@pytest.mark.heavy
@HEAVY
def test_fp32_greedy_equals_transformers(fp32, hf):
    for prompt in ("The history of Paris began long ago, when", "def fibonacci(n):"):
        ids = fp32.tokenizer.encode(prompt)
        want = _hf_greedy(hf, ids, 32)
        got = fp32.generate(ids, max_new_tokens=32, stop_on_eos=False).token_ids
        assert got == want, (prompt, fp32.tokenizer.decode(got), fp32.tokenizer.decode(want))
    chat_ids = fp32.tokenizer.encode_chat(QUESTION)
    # with the chat template both stop at <|im_end|> (transformers keeps it as the last token, so do we)
    assert fp32.generate(chat_ids, max_new_tokens=16).token_ids == _hf_greedy(hf, chat_ids, 16)


def test_8da4w_greedy_agreement_length(q4, hf):
    """The GGUF's own 4-bit blocks follow the float model (the same file dequantized) for most of
    32 greedy tokens; only the int8 activations differ from it."""
    record = {}
    for prompt in ("The history of Paris began long ago, when", "def fibonacci(n):"):
        ids = q4.tokenizer.encode(prompt)
        want = _hf_greedy(hf, ids, 32)
        got = q4.generate(ids, max_new_tokens=32, stop_on_eos=False).token_ids
        record[prompt] = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), 32)
    print("8da4w greedy agreement with transformers (tokens of 32):", json.dumps(record))
    # measured (issue 20): 31 and 25 with the GGUF's blocks kept (the default); 1 and 5 when the
    # program re-quantized them (gguf_blocks=False)
    assert min(record.values()) >= 16, record


def test_chat_is_multi_turn_and_reuses_the_cache(q4):
    chat = q4.chat()
    r1 = chat.send(ASK, max_new_tokens=24)
    assert "Paris" in r1.text
    r2 = chat.send("And of Italy?", max_new_tokens=24)
    assert r2.stats.prefill_tokens < r2.stats.prompt_tokens       # turn one stayed in the cache
    assert r2.stats.prompt_tokens > r1.stats.prompt_tokens + r1.stats.generated_tokens - 1
    assert [m["role"] for m in chat.messages] == ["user", "assistant", "user", "assistant"]


def test_cli_generate_on_the_gguf(cli, cli_here, smollm2_gguf, monkeypatch):
    """One real `modelexport generate` process (the console entry, the sampled text); the other
    calls run the same entry function in this process (each process re-imports torch and reloads
    the program: ~4 CPU-s a call)."""
    env = {"MODELEXPORT_CACHE_DIR": str(CACHE)}
    monkeypatch.setenv("MODELEXPORT_CACHE_DIR", str(CACHE))
    monkeypatch.setattr("sys.stdin", io.StringIO(""))     # --chat reads more turns from a stdin that is not a tty
    proc = cli_here("generate", str(smollm2_gguf), "--chat", "--prompt", ASK, "-n", "24", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    turn = out["turns"][0]
    assert "Paris" in turn["text"]
    assert turn["stats"]["time_to_first_token_s"] > 0 and turn["stats"]["decode_tokens_per_s"] > 0
    assert out["model"]["cache_hit"] is True
    # a plain --prompt on an instruct model is asked through its chat template (issue 18, item 5)
    asked = cli_here("generate", str(smollm2_gguf), "--prompt", ASK, "-n", "24", "--json")
    assert asked.returncode == 0, asked.stderr
    asked = json.loads(asked.stdout)
    assert asked["chat_template"] is True and "Paris" in asked["text"]
    raw = cli_here("generate", str(smollm2_gguf), "--prompt", "What is the capital of France?", "-n", "24", "--raw")
    assert raw.returncode == 0, raw.stderr
    if not raw.stdout.strip():   # the instruct model ends a raw question at once: the CLI says why
        assert "drop --raw" in raw.stderr
    proc = cli("generate", str(smollm2_gguf), "--prompt", "Once upon a time", "-n", "16", "--temperature", "0.8",
               "--top-k", "40", "--top-p", "0.9", "--repetition-penalty", "1.1", "--seed", "1", env=env, check=True)
    # the same seed gives the same text again, here from the entry function in this process
    again = cli_here("generate", str(smollm2_gguf), "--prompt", "Once upon a time", "-n", "16", "--temperature", "0.8",
                     "--top-k", "40", "--top-p", "0.9", "--repetition-penalty", "1.1", "--seed", "1")
    assert again.returncode == 0, again.stderr
    assert proc.stdout == again.stdout and proc.stdout.strip()
    assert_clean_error(cli_here("generate", str(smollm2_gguf), "--prompt", "word " * 2100), "context")
