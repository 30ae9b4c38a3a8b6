"""Data-aware 4-bit rounding (quant/seqmse.py, quant/gptq.py) and the --max-ppl-ratio recipe
(quant/precision_recipe.py via llm/weight_quality.py), on a tiny real Llama fed real text."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from llm_tiny import tiny_llama, tiny_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = ("Markets rose on Tuesday as investors weighed the outlook for interest rates and the health of the "
        "economy, while officials said talks would resume next week. The quick brown fox jumps over the lazy dog. "
        "Rain is expected in the north, with sunny spells further south and light winds. ") * 20


@pytest.fixture(scope="module")
def tiny():
    from modelexport.llm.weight_quality import windows
    from modelexport.quant.input_moments import record_input_moments
    model = tiny_llama(n_layers=2, seed=3)
    ids = tiny_tokenizer().encode(TEXT)
    ids = ids["input_ids"] if hasattr(ids, "keys") else list(ids)
    inputs: dict[str, list] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, a, n=n: inputs.setdefault(n, []).append(a[0].reshape(-1, a[0].shape[-1])))
             for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    mom = record_input_moments(model, windows(ids[:1024], 128), lambda m, x: m(input_ids=x), lambda n: n != "lm_head")
    for h in hooks:
        h.remove()
    return model, ids, mom, {n: torch.cat(v).double() for n, v in inputs.items()}


def _true_output_error(model, name, x, bw, block):
    """||X W - X Q(W)||^2 / ||X W||^2 on the layer's real inputs (not through the recorded moment)."""
    from modelexport.llm.weight_quality import onnx_weight
    w = torch.from_numpy(onnx_weight(model, name)).double()
    q = torch.from_numpy(bw.dequantized(block)).double()
    return float(((x @ (w - q)) ** 2).sum() / ((x @ w) ** 2).sum())


@pytest.mark.parametrize("block", [32, 0])   # LPBQ blocks of 32 (16a4w_block), per channel (16a4w)
@pytest.mark.parametrize("name", ["model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj"])
def test_data_aware_rounding_lowers_the_layer_output_error(tiny, name, block):
    from modelexport.llm.weight_quality import onnx_weight
    from modelexport.quant.weight_rounding import ROUNDINGS
    model, _, mom, inputs = tiny
    w = onnx_weight(model, name)
    blk = block or w.shape[0]
    err = {}
    for method, r in ROUNDINGS.items():
        bw = r.round_one(w, mom.get(name), blk)
        assert bw.q.min() >= -8 and bw.q.max() <= 7 and bw.q.shape == w.shape
        if blk < w.shape[0]:
            assert bw.block_scales.min() >= 1 and bw.block_scales.max() <= 15
        err[method] = _true_output_error(model, name, inputs[name], bw, blk)
    assert err["gptq"] < 0.9 * err["nearest"], err
    assert err["gptq"] < err["imatrix"] <= err["nearest"] * 1.01, err
    assert err["seqmse"] < err["nearest"], err
    assert err["seqmse-gptq"] < err["nearest"], err


def test_batched_gptq_equals_one_at_a_time(tiny):
    """Matrices of one shape go through the GPTQ loop together: the same integers as alone."""
    from modelexport.llm.weight_quality import onnx_weight
    from modelexport.quant.block_weights import quantize_blocks
    from modelexport.quant.gptq import gptq_round, gptq_round_many
    model, _, mom, _ = tiny
    names = ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj"]
    ws = [onnx_weight(model, n) for n in names]
    starts = [quantize_blocks(w, 32) for w in ws]
    together = gptq_round_many(ws, [mom.get(n) for n in names], starts, [32] * 3)
    for w, n, st, bw in zip(ws, names, starts, together):
        alone = gptq_round(w, mom.get(n), st, 32)
        assert (bw.q == alone.q).mean() > 0.999 and (bw.block_scales == st.block_scales).all()
        assert not (bw.q == st.q).all()          # GPTQ moved some integers off nearest


@pytest.mark.parametrize("k, leaf, indefinite", [(96, 512, False), (75, 16, False), (64, 16, True)])
def test_gptq_factor_equals_the_float64_inverse_and_cholesky(monkeypatch, k, leaf, indefinite):
    """The upper Cholesky factor of H^-1 from one float32 Cholesky of the reversed H and a triangular
    inverse by halves (a small leaf: the halving on odd sizes) is the float64 inverse's own factor,
    in the act order, the dead input set to 1 and H damped (10x when 1% leaves it indefinite)."""
    from modelexport.quant import gptq
    monkeypatch.setattr(gptq, "_TRIANGLE_LEAF", leaf)
    g = torch.Generator().manual_seed(k)
    x = torch.randn(3 * k, k, generator=g) * torch.rand(k, generator=g) * 3
    x[:, 5] = 0                                          # a dead input
    h = (x.T @ x).float()
    if indefinite:                                       # not an X^T X: negative at 1% damping, not at 10%
        m = float(h.diagonal().mean())
        h[7, :] = h[:, 7] = 0.0
        h[7, 7] = -0.05 * m
    perm, dead, u = gptq._prepared(h, gptq.DAMPING)
    hd = h.double()
    d = hd.diagonal().clone()
    assert dead.tolist() == (d == 0).tolist()
    d[dead] = 1.0
    assert perm.tolist() == torch.argsort(d, descending=True).tolist()
    ref = hd.clone()
    ref.diagonal().copy_(d + gptq.DAMPING * (10 if indefinite else 1) * float(d.mean()))
    ref = ref[perm[:, None], perm]
    want = torch.linalg.cholesky(torch.linalg.inv(ref), upper=True)
    assert u.dtype == torch.float32 and torch.equal(u, u.triu())
    assert float((u.double() - want).abs().max()) < 1e-4 * float(want.abs().max())


def _imatrix_search_as_before(w, block, importance, channel_factors):
    """The block-scale search as it was written first, in numpy, one candidate's integers kept per level."""
    import numpy as np
    k, n = w.shape
    wb = w.astype(np.float32).reshape(k // block, block, n)
    ideal = np.maximum(np.maximum(wb.max(axis=1) / 7, wb.min(axis=1) / -8), np.finfo(np.float32).tiny)
    top = (ideal.max(axis=0) / 15).astype(np.float32)
    weight = None if importance is None else importance.astype(np.float32).reshape(k // block, block, 1)
    best = None
    for f in channel_factors:
        channel = (top * f).astype(np.float32)
        fit = ideal / channel
        levels = ([np.full(fit.shape, lv, np.float32) for lv in range(1, 16)] if weight is not None
                  else [np.clip(r(fit), 1, 15) for r in (np.floor, np.ceil)])
        b_err = b_s = b_q = None
        for s in levels:
            eff = (s * channel)[:, None, :]
            q = np.clip(np.round(wb / eff), -8, 7)
            d2 = (q * eff - wb) ** 2
            err = (d2 if weight is None else d2 * weight).sum(axis=1)
            if b_err is None:
                b_err, b_s, b_q = err, s, q
                continue
            better = err < b_err
            b_err, b_s, b_q = np.where(better, err, b_err), np.where(better, s, b_s), np.where(better[:, None], q, b_q)
        total = b_err.sum(axis=0)
        if best is None:
            best = [total, b_s, b_q, channel]
            continue
        better = total < best[0]
        best = [np.minimum(total, best[0]), np.where(better, b_s, best[1]), np.where(better, b_q, best[2]),
                np.where(better, channel, best[3])]
    return best[2].reshape(k, n).astype(np.int8), best[1].astype(np.uint8), best[3].astype(np.float32)


@pytest.mark.parametrize("importance", [False, True])
def test_block_search_chooses_as_the_numpy_search_did(importance):
    """The block-scale search in reused torch buffers makes exactly the choices of the plain numpy
    search it replaced (the same errors to the bit), with and without importances."""
    import numpy as np

    from modelexport.quant.block_weights import quantize_blocks
    from modelexport.quant.weight_rounding import IMATRIX_CHANNEL_FACTORS
    rng = np.random.default_rng(5)
    for k, n in ((256, 96), (64, 130)):
        w = (rng.standard_t(3, (k, n)) * 0.02).astype(np.float32)
        w[:, 3] = 0.0                                                     # a dead output column
        imp = rng.gamma(0.5, 1.0, k).astype(np.float32) if importance else None
        factors = IMATRIX_CHANNEL_FACTORS if importance else (1.0,)
        got = quantize_blocks(w, 32, imp, factors)
        want = _imatrix_search_as_before(w, 32, imp, factors)
        for field, value in zip(("q", "block_scales", "channel_scale"), want):
            np.testing.assert_array_equal(getattr(got, field), value, err_msg=field)
            assert getattr(got, field).dtype == value.dtype


def test_imatrix_block_scales_beat_nearest_on_the_weighted_error():
    """With input importances, quantize_blocks searches all 15 block scales (clipping where the
    inputs are rarely large): its importance-weighted error is below nearest's two candidates'."""
    import numpy as np

    from modelexport.quant.block_weights import quantize_blocks
    rng = np.random.default_rng(0)
    w = (rng.standard_t(3, (256, 64)) * 0.02).astype(np.float32)      # heavy tails: clipping pays
    imp = rng.gamma(0.5, 1.0, 256).astype(np.float32)
    plain, weighted = quantize_blocks(w, 32), quantize_blocks(w, 32, imp, (1.0, 0.9, 0.8))
    err = {k: ((bw.dequantized(32) - w) ** 2 * imp[:, None]).sum() for k, bw in (("plain", plain), ("weighted", weighted))}
    assert err["weighted"] < 0.9 * err["plain"], err
    assert weighted.block_scales.min() >= 1 and weighted.block_scales.max() <= 15
    assert (weighted.channel_scale <= plain.channel_scale * (1 + 1e-6)).all()


@pytest.mark.parametrize("importance", [False, True])
def test_block_search_in_slices_of_columns_equals_the_whole_weight(monkeypatch, importance):
    """A wide weight is searched in slices of columns (bounded temporaries); columns are independent."""
    import numpy as np

    from modelexport.quant import block_weights
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 40)).astype(np.float32)
    imp = rng.random(64).astype(np.float32) if importance else None
    whole = block_weights.quantize_blocks(w, 16, imp, (1.0, 0.9))
    monkeypatch.setattr(block_weights, "_SLICE_ELEMENTS", 64 * 7)      # slices of 7 columns
    sliced = block_weights.quantize_blocks(w, 16, imp, (1.0, 0.9))
    for field in ("q", "block_scales", "channel_scale"):
        np.testing.assert_array_equal(getattr(sliced, field), getattr(whole, field), err_msg=field)


def test_moments_shared_by_linears_reading_one_tensor(tiny):
    _, _, mom, inputs = tiny
    q, k = mom.get("model.layers.0.self_attn.q_proj"), mom.get("model.layers.0.self_attn.k_proj")
    assert q is k                              # q/k/v read the same normed hidden state
    assert mom.get("model.layers.1.self_attn.q_proj") is not q
    x = inputs["model.layers.0.self_attn.q_proj"]
    assert torch.allclose(q.double(), x.T @ x, rtol=1e-4, atol=1e-3)
    assert mom.tokens == 1024


def test_moments_from_the_decoder_body_equal_the_whole_models(tiny):
    """The moments' pass skips the vocabulary projection when no rounded linear is in it."""
    from modelexport.llm.weight_quality import _forward_reaching, windows
    from modelexport.quant.input_moments import record_input_moments
    model, ids, mom, _ = tiny
    wanted = {"model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj"}
    run = _forward_reaching(model, wanted)
    assert run is not None and _forward_reaching(model, wanted | {"lm_head"})(model, torch.tensor([ids[:4]])).logits is not None
    body = record_input_moments(model, windows(ids[:1024], 128), run, lambda n: n in wanted)
    for n in wanted:
        assert torch.allclose(body.get(n), mom.get(n), rtol=1e-5, atol=1e-4)


def _linears(model):
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]


def test_layer_by_layer_rounding_equals_the_whole_models(tiny, tmp_path):
    """Moments recorded one decoder layer at a time on the float layer inputs are the whole-model
    hooks' moments, and GPTQ makes the same weights of them (one layer per window, and all in one)."""
    import numpy as np

    from modelexport.llm.layerwise_rounding import round_layer_by_layer
    from modelexport.llm.weight_quality import onnx_weight, plan_weights, windows
    from modelexport.quant.weight_rounding import ROUNDINGS
    model, ids, mom, _ = tiny
    names, r = _linears(model), ROUNDINGS["gptq"]
    floats = [onnx_weight(model, n) for n in names]
    whole = dict(zip(names, r.round_all(floats, [mom.get(n) for n in names], [32] * len(names))))
    got, said = {}, []
    info = round_layer_by_layer(model, windows(ids[:1024], 128), names, r, 32, lambda n: onnx_weight(model, n),
                                lambda n, w, bw, blk, h: got.__setitem__(n, (bw, h)), said.append, window_bytes=1)
    assert info["tokens"] == 1024 and sorted(got) == sorted(names) and len(said) == 2   # a window per layer
    for n in names:
        bw, h = got[n]
        assert torch.allclose(h, mom.get(n), rtol=1e-5, atol=1e-4), n
        np.testing.assert_array_equal(bw.block_scales, whole[n].block_scales, err_msg=n)
        np.testing.assert_array_equal(bw.channel_scale, whole[n].channel_scale, err_msg=n)
        assert (bw.q == whole[n].q).mean() > 0.999, n
    assert got[names[0]][1] is got[names[1]][1]        # q/k share one moment, as in the whole-model hooks
    plan = plan_weights(model, ids[:1024], 128, names, "gptq", 32, tmp_path, None, lambda m: None)
    assert plan.rounding["layer_by_layer"] and plan.rounding["tokens"] == 1024
    with np.load(plan.rounded_path, allow_pickle=False) as z:
        for n in names:
            assert (z[f"{n}|q"] == whole[n].q).mean() > 0.999 and (z[f"{n}|block_scales"] == whole[n].block_scales).all()


def test_layer_by_layer_lifts_a_bf16_held_model_one_layer_at_a_time(tiny):
    """A model held in bf16 is run in float32 layer by layer: the moments are those of the float32
    model with the same (bf16-valued) weights, and the parameters are bf16 again afterwards."""
    import copy

    from modelexport.llm.layerwise_rounding import round_layer_by_layer
    from modelexport.llm.export.weight_dtype import store_bf16
    from modelexport.llm.weight_quality import onnx_weight, windows
    from modelexport.quant.input_moments import record_input_moments
    from modelexport.quant.weight_rounding import ROUNDINGS
    model, ids, _, _ = tiny
    held = copy.deepcopy(model)
    assert store_bf16(held, "bfloat16")
    ref = copy.deepcopy(held).float()
    names = _linears(model)
    want = record_input_moments(ref, windows(ids[:512], 128), lambda m, x: m(input_ids=x), lambda n: n in set(names))
    got = {}
    round_layer_by_layer(held, windows(ids[:512], 128), names, ROUNDINGS["imatrix"], 32,
                         lambda n: onnx_weight(held, n), lambda n, w, bw, blk, h: got.__setitem__(n, h))
    for n in names:
        assert torch.allclose(got[n], want.get(n), rtol=1e-5, atol=1e-4), n
    assert {p.dtype for p in held.parameters()} == {torch.bfloat16}


def test_the_rounding_holds_one_window_of_layers_moments():
    """The estimate's moments: one Llama-3.2-1B layer's (its 8192-wide down_proj input: a layer
    fills a window alone), not the 4.8 GB of all 16; SmolLM2's 13.4 MB layers fill a window at 21."""
    from modelexport.llm.layerwise_rounding import WINDOW_BYTES, held_moments_bytes, rounding_bytes
    from modelexport.quant.weight_rounding import layer_moments_bytes
    one_b = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "head_dim": 64, "intermediate_size": 8192}
    assert layer_moments_bytes(one_b) == 4 * (3 * 2048**2 + 8192**2) == held_moments_bytes(one_b)
    smol = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "intermediate_size": 1536}
    one = layer_moments_bytes(smol)
    assert held_moments_bytes(smol) == 21 * one and WINDOW_BYTES <= 21 * one < WINDOW_BYTES + one
    assert held_moments_bytes({**smol, "num_hidden_layers": 2}) == 2 * one and held_moments_bytes({}) is None
    # what the estimate adds for the 1B's rounding does not grow with the layers
    assert rounding_bytes(one_b) == rounding_bytes({**one_b, "num_hidden_layers": 32}) < 4.8 * 2**30


def _plan(model, ids, tmp_path, ratio, window=128):
    from modelexport.llm.weight_quality import plan_weights
    return plan_weights(model, ids, window, _linears(model), "nearest", 32, tmp_path, ratio, lambda m: None)


def test_recipe_stops_within_budget_or_reports_the_best_reached(tiny, tmp_path):
    from modelexport.core.errors import InputError
    model, ids, _, _ = tiny
    loose = _plan(model, ids[:512 + 1024], tmp_path / "a", 100.0).recipe
    assert loose["raised"] == [] and loose["overrides"] == [] and [e["raised"] for e in loose["evaluations"]] == [0]
    assert loose["held_out"] == {"tokens": 1024, "from_token": 512, "text": loose["held_out"]["text"]}
    budget = 1.0 + 1e-9
    try:
        rec = _plan(model, ids[:512 + 1024], tmp_path / "b", budget).recipe
    except InputError as e:          # even every module at 8-bit misses it: the best reached, and its cost
        assert "best reached" in str(e) and "bytes/param" in str(e) and "--max-ppl-ratio" in str(e)
    else:
        assert rec["ratio"] <= budget


@pytest.mark.heavy
@pytest.mark.smollm2
def test_recipe_on_smollm2_raises_the_fewest_modules(smollm2_gguf, tmp_path):
    """The whole real SmolLM2 (a model cut to a few layers is so far from a language model that
    4-bit noise can lower its perplexity)."""
    from modelexport.core.errors import InputError
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    from modelexport.llm.run.text import read_text, tokenize
    llm = load_gguf_causal_lm(smollm2_gguf)
    model, ids = llm.model, tokenize(llm.tokenizer, read_text(None).text, 512 + 1024)
    with pytest.raises(InputError) as e:
        _plan(model, ids, tmp_path / "a", 1.0000001, 512)
    assert "best reached" in str(e.value) and "bytes/param" in str(e.value)
    best = float(str(e.value).split("best reached is ")[1].split("x")[0])
    before = _plan(model, ids, tmp_path / "b", 100.0, 512).recipe
    assert before["ratio_before"] > best
    budget = best + (before["ratio_before"] - best) / 3     # needs some modules raised, not all
    plan = _plan(model, ids, tmp_path / "c", budget, 512)
    rec = plan.recipe
    assert rec["raised"] and rec["ratio"] <= budget
    k = len(rec["raised"])
    assert all(e["ratio"] > budget for e in rec["evaluations"] if e["raised"] < k)   # fewer did not meet it
    assert plan.extra_overrides == rec["overrides"] and rec["added_bytes_per_param"] > 0
    assert all(o.startswith("^model\\.layers\\.") and o.endswith("$=16a8w") for o in rec["overrides"])


def test_default_rounding_is_data_aware_and_a_short_text_falls_back_to_nearest(tiny, tmp_path):
    """The default needs the calibration text's activations; a text too short for them is no error
    (nearest, said in the record), unlike a data-aware rounding asked for by name."""
    from modelexport.llm.export.plan import quality_options
    from modelexport.llm.export.weights import WeightRequest, plan_weights
    from modelexport.backends.spec import LlmCompileOptions
    from modelexport.llm.run.text import TextSource
    from modelexport.quant.llm_graphs import DEFAULT_OVERRIDES, parse_overrides
    from modelexport.quant.weight_rounding import DEFAULT_ROUNDING, ROUNDINGS
    model = tiny[0]
    overrides = list(reversed(parse_overrides(list(DEFAULT_OVERRIDES), "16a4w_block")))
    quality = quality_options(LlmCompileOptions(), "16a4w_block", {})
    assert quality.rounding == DEFAULT_ROUNDING and ROUNDINGS[DEFAULT_ROUNDING].needs_activations
    assert quality_options(LlmCompileOptions(rounding="nearest"), "16a4w_block", {}).rounding_why == "asked for"
    # a model whose GPTQ would take tens of minutes (Llama-3.2-1B's shape, ~42x SmolLM2's work) defaults to
    # nearest, saying why; asked for by name it gets GPTQ (one layer's moments at a time)
    llama_1b = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 64, "intermediate_size": 8192}
    big = quality_options(LlmCompileOptions(), "16a4w_block", llama_1b)
    assert big.rounding == "nearest" and "~42x SmolLM2-135M" in big.rounding_why
    assert "--rounding gptq" in big.rounding_why
    assert quality_options(LlmCompileOptions(rounding="gptq"), "16a4w_block", llama_1b).rounding == "gptq"
    smollm2 = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "intermediate_size": 1536}
    assert quality_options(LlmCompileOptions(), "16a4w_block", smollm2).rounding == DEFAULT_ROUNDING
    said = []
    request = WeightRequest("16a4w_block", overrides, 32, 128, quality)
    short = plan_weights(model, tiny_tokenizer(), TextSource(tmp_path / "s.txt", "The quick brown fox. " * 10), request,
                         tmp_path / "s", said.append)
    assert short.rounding["method"] == "nearest" and short.graph_file is None
    assert "needs 512+ calibration tokens" in short.rounding["what"] and any("nearest" in m for m in said)
    full = plan_weights(model, tiny_tokenizer(), TextSource(tmp_path / "t.txt", TEXT), request, tmp_path / "t",
                        said.append)
    assert full.rounding["method"] == DEFAULT_ROUNDING and full.rounding["tokens"] >= 512
    assert full.rounding["why"] == "the default" and full.rounding["layer_by_layer"]
    assert full.graph_file and Path(full.graph_file).is_file()


def test_text_too_short_for_the_rounding_says_how_much(tiny, tmp_path):
    from modelexport.core.errors import CalibrationError
    from modelexport.llm.weight_quality import plan_weights
    model, ids, _, _ = tiny
    with pytest.raises(CalibrationError) as e:
        plan_weights(model, ids[:300], 128, ["model.layers.0.mlp.down_proj"], "gptq", 32, tmp_path, None, lambda m: None)
    assert "300 tokens" in str(e.value) and "at least 512" in str(e.value)
    plan = plan_weights(model, ids[:300], 128, ["model.layers.0.mlp.down_proj"], "nearest", 32, tmp_path, None, lambda m: None)
    assert plan.rounding["method"] == "nearest" and plan.rounding["tokens"] == 0


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("rounding_cli")
    tiny_llama(n_layers=1).save_pretrained(root / "hf")
    tiny_tokenizer().save(root / "hf")
    (root / "short.txt").write_text("The quick brown fox jumps over the lazy dog near the river bank today. " * 4)
    return root


@pytest.mark.parametrize("extra,words", [
    (("--max-ppl-ratio", "0.9"), ("--max-ppl-ratio", "above 1")),
    (("--max-ppl-ratio", "nan"), ("--max-ppl-ratio", "finite")),
    (("--rounding", "stochastic"), ("--rounding 'stochastic'", "gptq")),
    (("--precision", "16a8w", "--max-ppl-ratio", "1.05"), ("16a8w has no 4-bit weights", "16a4w_block")),
    (("--calibration", "{short}", "--rounding", "gptq"), ("tokens", "at least 512", "--rounding nearest")),
])
def test_bad_quality_options(cli, tiny_hf, tmp_path, extra, words):
    from conftest import assert_clean_error
    out = tmp_path / "out"
    extra = [x.format(short=tiny_hf / "short.txt") for x in extra]
    proc = cli("compile", str(tiny_hf / "hf"), "--target", "SM8650", "--variants", "ar1,ar4", "--max-seq-len", "32",
               "-o", str(out), *extra)
    assert_clean_error(proc, *words)
    assert not out.exists()
