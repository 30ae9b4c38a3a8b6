"""Gemma 2 / Gemma 3 from a GGUF (issue 17 item 5), the way llama.cpp's converter writes them
(tests/gguf_from_hf.py: its header keys and tensor names, norms as 1 + w, a SentencePiece vocabulary).

transformers' GGUF loader reads no RoPE scaling and no soft-caps from the header; the loader sets
them from the header (the family row's `gguf_config_keys`, `GGUF_ROPE_SCALINGS`), so the model
transformers builds from the GGUF is the HF model the file was written from, to the bit. The tiny
models state what a GGUF cannot as its readers assume it: query_pre_attn_scalar as llama.cpp derives
it (head_dim, or hidden / heads at the 27B layer counts), Gemma 3's 5 local : 1 global layer pattern
as transformers' config class does. Then the CPU program built from the GGUF
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
    "gemma3_text": dict(num_hidden_layers=6, query_pre_attn_scalar=16,
                        layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    "gemma2": dict(num_hidden_layers=2, query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
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
    from modelexport.llm.run.tokenizers import from_transformers
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    text = "The quick brown fox jumps over the lazy dog."
    assert tok.encode(text) == llm.tokenizer(text)["input_ids"] and tok.bos_id == 2 and 1 in tok.eos_ids
    assert tok.decode(tok.encode(text)[1:]) == text


# The 27B checkpoints' layer counts, at which llama.cpp scales the scores by (hidden / heads) ** -0.5
# instead of head_dim ** -0.5 (gemma-2-27b: 4608 / 32 = 144; gemma-3-27b: 5376 / 32 = 168).
LAYERS_27B = {"gemma2": 46, "gemma3_text": 62}


@pytest.mark.parametrize("model_type", list(ARCH))
def test_a_27b_shaped_gguf_scales_the_queries_as_llama_cpp_does(tmp_path, model_type):
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    n = LAYERS_27B[model_type]
    local = {"gemma2": 1, "gemma3_text": 5}[model_type]       # local layers per global one, as the loaders assume
    layer_types = [["sliding_attention", "full_attention"][i % (local + 1) == local] for i in range(n)]
    # head_dim 8 beside hidden / heads = 16: a loader taking head_dim gets other logits
    model = tiny_family_model(model_type, vocab_size=512, hidden_size=64, num_attention_heads=4,
                              num_hidden_layers=n, head_dim=8, query_pre_attn_scalar=16, layer_types=layer_types)
    llm = load_gguf_causal_lm(write_gguf_from_hf(model, tmp_path / "tiny-27b.gguf", ARCH[model_type]))
    assert llm.config.query_pre_attn_scalar == 16
    ids = torch.tensor([_ids(12)])
    with torch.no_grad():
        assert torch.equal(llm.model(ids).logits, model(ids).logits)


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
    """A scaling type without a row in GGUF_ROPE_SCALINGS: refused, naming what is carried."""
    from modelexport.core.errors import InputError
    from modelexport.frontends.llm_families import family_of_gguf
    assert family_of_gguf("gemma3", "linear", "g.gguf").model_type == "gemma3_text"
    with pytest.raises(InputError) as e:
        family_of_gguf("llama", "dynamic", "l.gguf")
    assert ("rope.scaling.type='dynamic'" in e.value.problem
            and "from a GGUF header: none, linear, yarn, longrope" in e.value.problem)
    assert "HF folder" in e.value.fix
