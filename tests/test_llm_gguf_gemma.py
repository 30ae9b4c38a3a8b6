"""Gemma 2 / Gemma 3 from a GGUF (issue 17 item 5), the way llama.cpp's converter writes them
(tests/gguf_from_hf.py: its header keys and tensor names, norms as 1 + w, a SentencePiece vocabulary).

transformers' GGUF loader reads no RoPE scaling and no soft-caps from the header; the loader sets
them from the header (the family row's `gguf_config_keys`, `GGUF_ROPE_SCALINGS`), so the model
transformers builds from the GGUF is the HF model the file was written from, to the bit. The tiny
models state everything else a GGUF cannot (query_pre_attn_scalar, Gemma 3's 5 local : 1 global
layer pattern) as transformers' config classes assume it. Then the CPU program built from the GGUF
computes transformers' logits and greedy tokens (fp32)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from gguf_from_hf import write_gguf_from_hf
from llm_tiny import hf_greedy
from llm_tiny_families import tiny_family_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MAX_SEQ = 64
# what a GGUF leaves to transformers' defaults, set to them; plus, for Gemma 2, soft-caps away from
# the defaults (50, 30), so that a loader reading them from the class defaults gets other logits
AS_GGUF_STATES = {
    "gemma3_text": dict(num_hidden_layers=6, query_pre_attn_scalar=256,
                        layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    "gemma2": dict(num_hidden_layers=2, query_pre_attn_scalar=256, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0),
}
ARCH = {"gemma3_text": "gemma3", "gemma2": "gemma2"}


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory):
    """model type -> (the tiny HF model, the GGUF written from it), each written once."""
    written: dict = {}

    def get(model_type: str):
        if model_type not in written:
            model = tiny_family_model(model_type, vocab_size=512, **AS_GGUF_STATES[model_type])
            folder = tmp_path_factory.mktemp("gemma_gguf")
            written[model_type] = model, write_gguf_from_hf(model, folder / f"tiny-{ARCH[model_type]}.gguf",
                                                            ARCH[model_type])
        return written[model_type]
    return get


def _ids(n: int = 40) -> list[int]:
    return torch.randint(7, 290, (n,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.mark.parametrize("model_type", list(ARCH))
def test_gguf_loads_as_the_model_it_was_written_from(gemma_gguf, model_type):
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    model, path = gemma_gguf(model_type)
    llm = load_gguf_causal_lm(path)
    assert llm.architecture == model_type
    cfg = llm.config
    if model_type == "gemma3_text":    # the global layers' linear RoPE scaling (Gemma 3 4B+: factor 8)
        assert cfg.rope_parameters["full_attention"] == model.config.rope_parameters["full_attention"]
        assert cfg.rope_parameters["sliding_attention"]["rope_type"] == "default"
    else:
        assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (5.0, 3.0)
    ids = torch.tensor([_ids()])
    with torch.no_grad():
        assert torch.equal(llm.model(ids).logits, model(ids).logits)
    assert llm.tokenizer.convert_ids_to_tokens([0, 1, 2, 4]) == ["<pad>", "<eos>", "<bos>", "<mask>"]
    # the tokenizer the CPU program and the bundles carry: transformers' ids, its text back
    from modelexport.llm.tokenizers import from_transformers
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    text = "The quick brown fox jumps over the lazy dog."
    assert tok.encode(text) == llm.tokenizer(text)["input_ids"] and tok.bos_id == 2 and 1 in tok.eos_ids
    assert tok.decode(tok.encode(text)[1:]) == text


def _check_cpu_program(path: Path, tmp_path: Path) -> None:
    from modelexport import llm
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    from modelexport.llm.cpu.session import ExecuTorchSession
    ref = load_gguf_causal_lm(path).model
    m = llm.load(path, backend="cpu", quant="fp32", max_seq_len=MAX_SEQ, cache_dir=tmp_path / "cache")
    ids = _ids(24)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    session = ExecuTorchSession(Path(m.info["pte"]))
    got, positions, i = [], [], 0
    for n in (7, 5, *[1] * 12):           # two prefill chunks, then one token a call
        got.append(session.feed(ids[i:i + n]))
        i += n
        positions.append(i - 1)
    assert (torch.stack(got) - want[positions]).abs().max().item() < 1e-4
    prompt = m.tokenizer.encode("The quick brown fox")
    assert m.generate(prompt, max_new_tokens=12, stop_on_eos=False).token_ids == hf_greedy(ref, prompt, 12)


@pytest.mark.heavy
@pytest.mark.skipif(not os.environ.get("MODELEXPORT_HEAVY_TESTS"),
                    reason="heavy: run with `make test-heavy` (a CPU program export each, 1-2 min)")
@pytest.mark.parametrize("model_type", list(ARCH))
def test_gguf_cpu_program_equals_transformers(gemma_gguf, model_type, tmp_path):
    _check_cpu_program(gemma_gguf(model_type)[1], tmp_path)


def test_a_gguf_rope_scaling_not_carried_over_is_refused_from_the_header():
    """transformers would build a yarn-scaled GGUF with plain RoPE: refused, naming what is carried."""
    from modelexport.core.errors import InputError
    from modelexport.frontends.llm_families import family_of_gguf
    assert family_of_gguf("gemma3", "linear", "g.gguf").model_type == "gemma3_text"
    with pytest.raises(InputError) as e:
        family_of_gguf("llama", "yarn", "l.gguf")
    assert "rope.scaling.type='yarn'" in e.value.problem and "from a GGUF header: none, linear" in e.value.problem
    assert "HF folder" in e.value.fix
