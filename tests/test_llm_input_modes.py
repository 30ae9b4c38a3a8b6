"""Decoder inputs as data (`--inputs tokens|embeddings|both`, llm/model/input_modes.py) and the full-context
graph, in float, on a tiny model of every family of the architecture table: the embeddings-in decoder
fed the lookup's output is the token path exactly; `both` with zero embeddings, or with no_token_id
and the looked-up rows, is too; HF's own `inputs_embeds` give HF's logits (the embedding scale is on
the embedder's side); the full-context graph's logits are the arN path's."""
from __future__ import annotations

import pytest
import torch

from llm_tiny import tiny_config, tiny_llama
from llm_tiny_families import NEW_FAMILIES, tiny_family_model
from modelexport.core.errors import InputError
from modelexport.llm.model.input_modes import INPUT_MODES, get_input_mode
from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder, example_inputs
from modelexport.llm.run.static_runner import StaticRunner

SEQ = 24
N = 4
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(family: str):
    if family in NEW_FAMILIES:
        return tiny_family_model(family)
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM
    if family == "llama":
        return tiny_llama()
    cfg_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "mistral": (MistralConfig, MistralForCausalLM)}[family]
    torch.manual_seed(0)
    model = model_cls(tiny_config(cfg_cls, sliding_window=8 if family == "mistral" else None)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


FAMILIES = ("llama", "qwen2", "mistral", *NEW_FAMILIES)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return _model(request.param)


def _ids(n: int, seed: int = 3) -> list[int]:
    return torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(dec, *first) -> torch.Tensor:
    inputs = list(example_inputs(dec.cfg, dec.spec, mode=dec.input_mode))
    inputs[:len(first)] = first
    with torch.no_grad():
        return dec(*inputs)


def test_embeddings_and_both_give_the_token_path_exactly(model):
    cfg = StaticDecoderConfig(N, SEQ)
    dec = {m: build_static_decoder(model, cfg, inputs=m) for m in INPUT_MODES}
    ids = torch.tensor([_ids(N)], dtype=torch.int32)
    with torch.no_grad():
        embeds = dec["embeddings"].lookup(ids)                # what the embedder part computes
    ref = _run(dec["tokens"], ids)
    outs = {"embeddings": _run(dec["embeddings"], embeds),
            "both, zero embeddings": _run(dec["both"], ids, torch.zeros_like(embeds))}
    no_token = torch.tensor([[dec["both"].spec.vocab_size, ids[0, 1], dec["both"].spec.vocab_size + 7, ids[0, 3]]],
                            dtype=torch.int32)               # positions 0 and 2 carry their embedding instead
    extra = torch.where((no_token < dec["both"].spec.vocab_size)[..., None], torch.zeros_like(embeds), embeds)
    outs["both, no_token_id + embeddings"] = _run(dec["both"], no_token, extra)
    for what, out in outs.items():
        assert len(out) == len(ref)
        for a, b in zip(out, ref):
            assert torch.equal(a, b), what


def test_hf_inputs_embeds_give_hf_logits(model):
    """The embedding scale (Gemma: x sqrt(hidden)) is on the embedder's side of the split, as HF's
    `inputs_embeds` are: fed HF's own embeddings, the embeddings-in decoder gives HF's logits."""
    ids = _ids(10)
    dec = build_static_decoder(model, StaticDecoderConfig(N, SEQ), inputs="embeddings")
    with torch.no_grad():
        hf_embeds = model.get_input_embeddings()(torch.tensor([ids]))
        ref = model(inputs_embeds=hf_embeds).logits[0]
        assert torch.allclose(model(torch.tensor([ids])).logits[0], ref, atol=1e-5)
        assert torch.equal(dec.lookup(torch.tensor([ids], dtype=torch.int32)), hf_embeds)
    runner = StaticRunner({N: lambda *x: _feed_embeds(dec, *x)}, dec.spec, SEQ)
    got = runner.feed(ids)
    assert (got - ref).abs().max().item() < 1e-4


def _feed_embeds(dec, ids, *rest):
    with torch.no_grad():
        return dec(dec.lookup(ids), *rest)


def test_full_context_graph_gives_the_arN_logits(model):
    """The "bert" graph (N = C, no KV inputs or outputs) on a whole context equals ar4 prefill + ar1
    steps over the same tokens, position by position."""
    ids = _ids(SEQ, seed=5)
    full = build_static_decoder(model, StaticDecoderConfig.full_context(SEQ))
    assert full.input_names() == ["input_ids", "position_ids", "attention_mask"]
    assert full.output_names() == ["logits"]
    with torch.no_grad():
        (logits,) = full(torch.tensor([ids], dtype=torch.int32), *full.example_inputs()[1:])
    ar = build_static_decoder(model, StaticDecoderConfig(N, SEQ))
    runner = StaticRunner.from_decoder(ar, n_tokens=(1,))
    ref = torch.cat([runner.feed(ids[:SEQ - 4])] + [runner.decode_step(t)[None] for t in ids[SEQ - 4:]])
    assert runner.chunks[-1] == 1
    assert (logits[0] - ref).abs().max().item() < 1e-4


def test_unknown_input_mode_names_the_choices():
    with pytest.raises(InputError) as e:
        get_input_mode("pixels")
    assert "tokens, embeddings, both" in e.value.fix
    with pytest.raises(InputError):
        StaticDecoderConfig(8, 16, full=True)


@pytest.mark.heavy
def test_smollm2_fed_its_own_embeddings_gives_the_token_logits_exactly(smollm2_gguf):
    """Real weights (issue 23, item 4): the SmolLM2-135M decoder from the GGUF, fed its own embeddings
    through the embeddings-in graph (ar32 prefill + ar1 steps, and the full-context graph), gives the
    token path's float logits bit for bit."""
    from modelexport.frontends import find_frontend
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    llm = find_frontend(str(smollm2_gguf)).load(str(smollm2_gguf))
    ids = tokenize(from_transformers(llm.tokenizer), read_text(None).text, 64)
    seq = 64
    for n, cfg in ((32, StaticDecoderConfig(32, seq)), (seq, StaticDecoderConfig.full_context(seq))):
        tokens = build_static_decoder(llm.model, cfg)
        embeds = build_static_decoder(llm.model, cfg, inputs="embeddings")
        if cfg.full:
            x = torch.tensor([ids], dtype=torch.int32)
            with torch.no_grad():
                a, b = tokens(x, *tokens.example_inputs()[1:]), embeds(embeds.lookup(x), *embeds.example_inputs()[1:])
            assert torch.equal(a[0], b[0])
            continue
        runs = {}
        for name, dec in (("tokens", tokens), ("embeddings", embeds)):
            graph = (lambda *x, d=dec: d(*x)) if name == "tokens" else (lambda i, *x, d=dec: d(d.lookup(i), *x))
            runner = StaticRunner({n: _no_grad(graph), 1: _no_grad(graph)}, dec.spec, seq)
            runs[name] = torch.cat([runner.feed(ids[:40])] + [runner.decode_step(t)[None] for t in ids[40:48]])
        assert torch.equal(runs["tokens"], runs["embeddings"])


def _no_grad(graph):
    def run(*x):
        with torch.no_grad():
            return graph(*x)
    return run


def test_no_token_id_holds_only_for_one_vocabulary():
    """`both`'s no_token_id is the table's row count: refused when lm_head's rows differ (an id past the
    table would be one the logits can name, or the reverse) or the tokenizer writes ids from there on."""
    from modelexport.llm.model.input_modes import no_token_id
    both = get_input_mode("both")
    assert no_token_id(both, 256, 256, 250) == 256
    assert no_token_id(get_input_mode("embeddings"), 256, 300, 400) is None   # only `both` has one
    with pytest.raises(InputError) as e:
        no_token_id(both, 256, 300, 250)
    assert "256 rows and lm_head 300" in e.value.problem and "--inputs embeddings" in e.value.fix
    with pytest.raises(InputError) as e:
        no_token_id(both, 256, 256, 260)
    assert "tokenizer has 260 ids" in e.value.problem and "--inputs embeddings" in e.value.fix
