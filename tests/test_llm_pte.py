"""LLM → ExecuTorch `.pte` (`compile --format pte`) on a tiny random Llama: the program's methods
read back with ExecuTorch's own loader (decode + prefill calling QnnBackend, the metadata methods),
the embedded context binary read back through libQnnSystem (both graphs, weights once, smaller
than the unshared twin), KV encodings tied, the twin run on the simulator vs the float model, and
the bad inputs said up front. The end-to-end compile is heavy (minutes on a loaded 2-core host);
the checks of bad input run in the default suite."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_clean_error
from llm_tiny import CALIBRATION_TEXT, tiny_llama, tiny_tokenizer, write_tiny_llm_folder

SEQ = 64
TEXT = CALIBRATION_TEXT


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return write_tiny_llm_folder(tmp_path_factory.mktemp("llm_pte"))


def _compile(cli, work, out, *extra):
    return cli("compile", str(work / "tiny_hf"), "--format", "pte", "--variants", "ar1,ar4", "--max-seq-len", str(SEQ),
               "-o", str(out), *extra)


# ---- bad input, said before any work (default suite) ----------------------------------------

def test_pte_refuses_a_precision_up_front_cli(cli, work, tmp_path):
    out = tmp_path / "b"
    proc = _compile(cli, work, out, "--precision", "8a8w")
    assert_clean_error(proc, "--format pte", "8a8w", "16a4w_block", "leave --format out")
    assert not out.exists()


@pytest.mark.parametrize("kw, words", [
    ({"target": "SM8450"}, ["weight", "SM8450"]),
    ({"variants": "ar1,ar4,ar16"}, ["decode (ar1)", "prefill", "--variants ar1,arN"]),
    ({"variants": "ar4,ar16"}, ["decode (ar1)"]),
])
def test_pte_refuses_up_front(work, tmp_path, kw, words):
    """Said before the model is loaded (no --calibration file is even read: it does not exist)."""
    import modelexport
    from modelexport.core.errors import ModelExportError
    args = {"target": "SM8650", "variants": "ar1,ar4", "max_seq_len": SEQ, **kw}
    with pytest.raises(ModelExportError) as e:
        modelexport.compile(str(work / "tiny_hf"), output=tmp_path / "b", output_format="pte",
                            calibration=str(tmp_path / "no_such_text.txt"), **args)
    text = str(e.value) + " " + str(getattr(e.value, "fix", ""))
    for w in words:
        assert w.lower() in text.lower(), text
    assert not (tmp_path / "b").exists()


def test_pte_precisions_and_overrides_refused_in_process():
    from modelexport.core.errors import InputError
    from modelexport.quant.llm_pt2e import check_precision, llm_quant_plan
    with pytest.raises(InputError, match="fp16"):
        check_precision("fp16")
    with pytest.raises(InputError, match="activations"):
        llm_quant_plan("16a4w_block", ["lm_head=8a8w"], None)
    plan = llm_quant_plan("16a4w_block", ["lm_head=16a4w_block"], None)
    assert [o.pattern for o in plan.overrides][:1] == ["lm_head"]       # the user's first: the first match wins
    assert any("embed_tokens" in o.pattern and o.precision.name == "16a8w" for o in plan.overrides)


def test_context_binary_default_unchanged():
    """Without --format an LLM still goes to the context-binary backend; pte picks the .pte one."""
    from modelexport.backends import backend_for_kind
    assert backend_for_kind("llm").name == "llm_qnn"
    assert backend_for_kind("llm", output_format="pte").name == "llm_pte"
    assert backend_for_kind("torch", output_format="pte").name == "executorch_qnn"


def test_kv_ranges_tie_observers_in_and_out():
    """The KV inputs and outputs of a prepared static decoder take the tied range: after conversion
    the (de)quantize ops at past_key_i_in and past_key_i_out carry the same scale and zero point."""
    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.core.targets import get_target
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.quant.llm_pt2e import (
        boundary_encodings,
        llm_quant_plan,
        tie_kv_ranges,
    )
    from modelexport.quant.pt2e_qnn import quantize
    qnn_ready()
    dec = build_static_decoder(tiny_llama(n_layers=1), StaticDecoderConfig(2, 16))
    names_in, names_out = dec.input_names(), dec.output_names()
    kv = {"past_key_0_in": [-3.0, 3.0], "past_key_0_out": [-3.0, 3.0], "past_value_0_in": [-2.0, 1.0],
          "past_value_0_out": [-2.0, 1.0]}
    ex = dec.example_inputs()
    torch.manual_seed(0)
    calib = [tuple(torch.randn_like(t) * 0.1 if t.is_floating_point() else t for t in ex)]
    gm = torch.export.export(dec, ex, strict=True).module()
    plan = llm_quant_plan("16a8w", None, None)
    q = quantize(gm, plan, get_target("SM8650"), calib,
                 before_convert=lambda p: tie_kv_ranges(p, 1, kv, names_in, names_out))
    enc = boundary_encodings(q, names_in, names_out)
    assert enc["past_key_0_in"] == enc["past_key_0_out"]
    assert enc["past_value_0_in"] == enc["past_value_0_out"]
    assert enc["past_key_0_in"] != enc["past_value_0_in"]
    assert enc["past_key_0_in"][0] == pytest.approx(6.0 / 65535, rel=1e-3)    # the tied range, 16-bit


def test_rope_lookups_split_in_gathers_of_16():
    """The .pte path cuts a method's RoPE-table lookup into gathers of at most 16 positions (the
    HTP's quantized Gather gives wrong rows past the 16th index): the float decoder's logits do not
    change, and the quantized graph holds one lookup per chunk, each a quantized table, with the
    integer split of position_ids left unquantized."""
    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.core.targets import get_target
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder, split_rope_lookups
    from modelexport.quant.llm_pt2e import MAX_ROPE_GATHER, llm_quant_plan
    from modelexport.quant.pt2e_qnn import quantize
    qnn_ready()
    dec = build_static_decoder(tiny_llama(n_layers=1), StaticDecoderConfig(20, 32))
    ex = dec.example_inputs()
    with torch.no_grad():
        whole = dec(*ex)[0]
        assert split_rope_lookups(dec, MAX_ROPE_GATHER) == 1
        assert torch.equal(dec(*ex)[0], whole)
    ep = torch.export.export(dec, ex, strict=True)
    ids_name, pos_name = ep.graph_signature.user_inputs[:2]      # the decoder's inputs are positional
    q = quantize(ep.module(), llm_quant_plan("16a8w", None, None), get_target("SM8650"), [ex])
    emb = [n for n in q.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.embedding.default]
    rope = [n for n in emb if n.args[1].name != ids_name]
    assert sorted(n.args[1].meta["val"].shape[-1] for n in rope) == [4, 4, 16, 16]     # cos, sin: 16 + 4
    assert all("dequantize" in str(n.args[0].target) for n in rope)                   # quantized tables
    for n in rope:       # each chunk of indices comes from position_ids through integer ops only
        idx = n.args[1]
        while idx.op == "call_function":
            assert "quantize" not in str(idx.target)
            idx = idx.args[0]
        assert idx.name == pos_name


@pytest.mark.parametrize("rounding", ["nearest", "imatrix"])
def test_pte_weights_are_the_onnx_paths_integers_and_scales(tmp_path, rounding):
    """The .pte path's 4-bit weights are the ONNX path's: the converted graph of a method folds, for
    every block-quantized linear, exactly the integers and block scales of the rounding the compile
    computes for the ONNX path (`_round_weights` → `llm.export.weights.plan_weights`, the npz its workers
    write into DequantizeLinear; nearest: `quantize_blocks`, what those workers compute), and the
    fake-quant logits sit near the float decoder with those very weights substituted."""
    import numpy as np

    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.backends.llm_pte.compile import _round_weights
    from modelexport.llm.export.plan import quality_options
    from modelexport.backends.spec import LlmCompileOptions
    from modelexport.core.numerics import compare
    from modelexport.core.targets import get_target
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.text import read_text
    from modelexport.quant.block_weights import quantize_blocks
    from modelexport.quant.llm_pt2e import as_lowered, llm_quant_plan, quantize_methods
    qnn_ready()
    model = tiny_llama(n_layers=1)
    (tmp_path / "calib.txt").write_text(TEXT * 40)       # imatrix's input moments need 512+ tokens
    tok = tiny_tokenizer()
    opts = LlmCompileOptions(rounding=rounding)
    plan = llm_quant_plan("16a4w_block", None, None)
    quality = quality_options(opts, "16a4w_block", {})
    rounded, record, plan = _round_weights(model, tok, read_text(str(tmp_path / "calib.txt")), 16, plan, quality,
                                           opts, lambda *a: None)
    assert record["rounding"]["method"] == rounding and len(rounded) == 7        # q/k/v/o, gate/up/down
    if rounding == "nearest":
        w = model.model.layers[0].mlp.down_proj.weight.detach().float().numpy().T
        assert np.array_equal(rounded["model.layers.0.mlp.down_proj"].q, quantize_blocks(w, 32).q)
    dec = build_static_decoder(model, StaticDecoderConfig(4, 16))
    ex = dec.example_inputs()
    ids = torch.tensor([tiny_tokenizer().encode("Markets rose on Tuesday")[:4]], dtype=torch.int32)
    sample = {n: t.numpy() for n, t in zip(dec.input_names(), (ids, *ex[1:]))}
    before = {n: dec.get_submodule(n).weight.detach().clone() for n in rounded}
    pinned: dict = {}
    graphs, _, _ = quantize_methods({"prefill_forward": dec}, {"prefill_forward": [sample]}, {}, plan,
                                    get_target("SM8650"), rounded, pinned)
    assert pinned["prefill_forward"] == {"pinned": 7, "left_min_max": 0}
    assert all(torch.equal(dec.get_submodule(n).weight, w) for n, w in before.items())    # the float model untouched
    gm = graphs["prefill_forward"]
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    assert {name for name, _ in [*gm.named_parameters(), *gm.named_buffers()]} <= read   # no float copy to lower
    linears = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.linear.default]
    names = ["model.layers.0.self_attn." + p for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
            ["model.layers.0.mlp." + p for p in ("gate_proj", "up_proj", "down_proj")]
    for node, name in zip(linears, names):          # the graph's order: the decoder layer's
        dq = node.args[1]
        assert "dequantize_affine" in str(dq.target), (name, dq.target)
        q, scale, zp = (getattr(gm, a.target) for a in (dq.args[0], dq.args[2], dq.args[3]))
        bw = rounded[name]
        assert np.array_equal(q.numpy().T, bw.q), name                       # the ONNX path's integers
        onnx_scale = torch.from_numpy((bw.block_scales.astype(np.float32) * bw.channel_scale).T.copy())
        assert torch.equal(scale, as_lowered(onnx_scale)), name         # as ExecuTorch's lowering gives them to QNN
        assert torch.equal(as_lowered(scale), scale), name                # ... which it then keeps as they are
        half_level = onnx_scale.amax(-1, keepdim=True) / 32
        assert ((scale - onnx_scale).abs() <= half_level * 1.001).all(), name     # within half a level of the ONNX path's
        assert not zp.any() and dq.args[5] == -8 and dq.args[6] == 7           # the whole int4 grid, symmetric
    # the fake-quant graph against float with the same rounded weights (weights alike, activations 16-bit)
    feed = [torch.from_numpy(sample[n]) for n in dec.input_names()]
    with torch.no_grad():
        fq = gm(*feed)[0].float().numpy()
        for name, bw in rounded.items():
            mod = dec.get_submodule(name)
            lowered = as_lowered(torch.from_numpy((bw.block_scales.astype(np.float32) * bw.channel_scale).T.copy()))
            q = torch.from_numpy(bw.q.T.astype(np.float32)).reshape(lowered.shape[0], -1, 32)
            mod.weight.copy_((q * lowered[:, :, None]).reshape(mod.weight.shape))
        ref = dec(*feed)[0].float().numpy()
    assert compare(ref, fq)["sqnr_db"] > 30


def test_fake_quant_stage_kept_as_pt2_and_compared(tmp_path):
    """The fake-quant stage of a .pte bundle is QnnQuantizer's converted graph saved as a .pt2: read
    back in this process it gives the converted graph's logits exactly, and the stage comparison
    names the pairs, judges the twin's and lands in manifest.numerics's rows."""
    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.core.targets import get_target
    from modelexport.llm.run.pte_numerics import JUDGED, compare_stages, manifest_numerics
    from modelexport.llm.run.pte_session import GraphForward, load_fake_quant
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.quant.llm_pt2e import llm_quant_plan, save_converted
    from modelexport.quant.pt2e_qnn import quantize
    qnn_ready()
    dec = build_static_decoder(tiny_llama(n_layers=1), StaticDecoderConfig(4, 16))
    ex = dec.example_inputs()
    ids = torch.tensor([tiny_tokenizer().encode("Markets rose")[:4]], dtype=torch.int32)
    sample = {n: t.numpy() for n, t in zip(dec.input_names(), (ids, *ex[1:]))}
    gm = torch.export.export(dec, ex, strict=True).module()
    q = quantize(gm, llm_quant_plan("16a8w", None, None), get_target("SM8650"),
                 [tuple(torch.from_numpy(sample[n]) for n in dec.input_names())])
    save_converted(q, ex, tmp_path / "prefill_forward.pt2")
    loaded = GraphForward(load_fake_quant(tmp_path / "prefill_forward.pt2"), "prefill_forward")
    feed = [torch.from_numpy(sample[n]) for n in dec.input_names()]
    assert torch.equal(loaded(*feed)[0], q(*feed)[0])
    # the converted graph stands in for the twin here: the pairs and the judged row are what is checked
    num = compare_stages({"prefill_forward": {"float": dec, "fake-quant": q, "htp-sim": loaded}},
                         {"prefill_forward": [sample]}, {"prefill_forward": dec.input_names()})["prefill_forward"]
    assert set(num) == {"float vs fake-quant", "float vs htp-sim", "fake-quant vs htp-sim"}
    assert num["fake-quant vs htp-sim"].sqnr_db == 200.0            # identical logits (capped)
    assert 10 < num["float vs fake-quant"].sqnr_db < 200 and num[JUDGED].samples == 1
    rows = manifest_numerics({"prefill_forward": num}, 18.0, "SM8650", "a sample")
    assert rows["outputs"][0]["name"] == "prefill_forward logits" and rows["threshold_db"] == 18.0
    assert rows["outputs"][0]["sqnr_db"] == num[JUDGED].sqnr_db


def test_older_pte_numerics_still_read():
    """Bundles written before the stage pairs kept {method: SQNR dB} of the twin vs float."""
    from modelexport.contract.manifest import PteLlmProgram
    p = PteLlmProgram(file="a.pte", host_twin="host/a.pte", methods=[], decoder_methods={"kv_forward": 1},
                      bytes=1, host_twin_bytes=1, numerics={"kv_forward": 33.5})
    assert p.numerics["kv_forward"]["float vs htp-sim"].sqnr_db == 33.5 and p.fake_quant == {}


def test_report_shows_every_stage_pair_of_a_pte_bundle(tmp_path):
    """report.html's numerics of a .pte bundle: the twin-vs-float row per method and every stage pair,
    not a per-layer hint (--per-layer does not run on .pte bundles)."""
    from modelexport.contract.manifest import LogitsAgreement, Manifest
    from modelexport.contract.report.html_report import section_numerics
    from modelexport.llm.run.pte_numerics import manifest_numerics
    a = LogitsAgreement(sqnr_db=21.3, cosine=0.9963, max_abs_error=0.58, top1_agreement=1.0, samples=2)
    num = manifest_numerics({"kv_forward": {"float vs fake-quant": a, "float vs htp-sim": a, "fake-quant vs htp-sim": a}},
                            5.0, "SM8650", "held-out text")
    html = section_numerics(Manifest(numerics=num), tmp_path).html
    assert "kv_forward logits" in html and "fake-quant vs htp-sim" in html and "held-out text" in html
    assert "--per-layer" not in html


def test_llm_pte_bundles_get_their_own_runner(tmp_path):
    """verify of an LLM .pte bundle is the LLM one (per method, on text), not the model .pte's; run and
    profile (one graph's feed) say what to use instead."""
    import json

    from modelexport.backends.executorch_qnn.run import verify_pte
    from modelexport.backends.llm_pte.verify import verify_llm_pte
    from modelexport.runtime.runners import runner_for
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "pte", "kind": "llm"}))
    r = runner_for(tmp_path)
    assert r.verify is verify_llm_pte
    from modelexport.core.errors import UnsupportedError
    with pytest.raises(UnsupportedError, match="generate BUNDLE --backend htp-sim"):
        r.run(tmp_path)
    with pytest.raises(UnsupportedError, match="`modelexport profile` feeds one graph"):
        r.profile(tmp_path, 5, "basic", None, None, None, None, None)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "pte", "kind": "model"}))
    assert runner_for(tmp_path).verify is verify_pte


# ---- end to end (heavy) -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def bundle(work):
    import modelexport
    return modelexport.compile(str(work / "tiny_hf"), output=work / "bundle", target="SM8650", output_format="pte",
                               variants="ar1,ar4", max_seq_len=SEQ, calibration=str(work / "calib.txt"),
                               calibration_samples=4)


@pytest.mark.heavy
def test_pte_methods_with_qnn_delegates(bundle):
    from executorch.exir._serialize._program import deserialize_pte_binary
    m = bundle.manifest
    assert m.format == "pte" and m.kind == "llm" and m.precision == "16a4w_block"
    prog = m.llm.pte["SM8650"]
    program = deserialize_pte_binary(bundle.file(prog.file).read_bytes()).program
    plans = {p.name: p for p in program.execution_plan}
    for method in ("kv_forward", "prefill_forward"):
        assert [d.id for d in plans[method].delegates] == ["QnnBackend"]
    consts = {name: plans[name].values[0].val for name in ("get_max_seq_len", "get_vocab_size", "get_bos_id")}
    assert consts["get_max_seq_len"].int_val == SEQ and consts["get_vocab_size"].int_val == 260
    assert consts["get_bos_id"].int_val == 256
    assert prog.metadata["get_eos_ids"] == [257] and prog.metadata["get_use_kv_cache"] is True
    assert prog.decoder_methods == {"kv_forward": 1, "prefill_forward": 4}
    assert (bundle.path / "tokenizer" / "tokenizer.json").is_file()


@pytest.mark.heavy
def test_pte_weight_shared_binary_read_back(bundle):
    from modelexport.backends.executorch_qnn.inspect import qnn_binaries
    from modelexport.toolchain.qnn_context import read_context_binary
    prog = bundle.manifest.llm.pte["SM8650"]
    binaries = {bytes(b) for _, b in qnn_binaries(bundle.file(prog.file).read_bytes())}
    assert len(binaries) == 1                              # one context binary for both methods
    info = read_context_binary(binaries.pop())
    assert sorted(g.name for g in info.graphs) == ["kv_forward", "prefill_forward"]
    assert len({g.htp.shared_weights_size for g in info.graphs}) == 1 and info.graphs[0].htp.shared_weights_size > 0
    twin = read_context_binary(qnn_binaries(bundle.file(prog.host_twin).read_bytes())[0][1])
    assert all(g.htp.shared_weights_size == 0 for g in twin.graphs)
    ws = bundle.manifest.llm.weight_sharing["SM8650/pte"]
    assert ws.weights_stored_once and ws.bytes < ws.unshared_twins_bytes
    kv = prog.kv_encodings                                 # tied: one encoding per cache, in and out
    assert kv["past_key_0_in"] == kv["past_key_0_out"] and kv["past_value_1_in"] == kv["past_value_1_out"]


@pytest.mark.heavy
def test_pte_twin_on_the_simulator_matches_float(bundle, work):
    """The twin's logits vs the float decoder within 16a4w_block's mark, at compile (the manifest)
    and here again through the generation loop's session on real text, every method."""
    from modelexport.backends.llm_pte.session import load_program
    from modelexport.llm.run.pte_session import pte_forwards
    from modelexport.core.numerics import sqnr_db
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.quant.precision import get_precision
    mark = get_precision("16a4w_block").min_sqnr_db
    assert all(p["float vs htp-sim"].sqnr_db >= mark for p in bundle.manifest.llm.pte["SM8650"].numerics.values())
    forwards, _, seq = pte_forwards(bundle, load_program)
    model = tiny_llama(n_layers=2)
    ids = tiny_tokenizer().encode("Markets rose on Tuesday")[:4]
    for n, fwd in forwards.items():
        dec = build_static_decoder(model, StaticDecoderConfig(n, seq))
        ex = list(dec.example_inputs())
        ex[0] = torch.tensor([ids[:n]], dtype=torch.int32)
        got = fwd(*ex)
        with torch.inference_mode():
            ref = dec(*ex)
        assert sqnr_db(ref[0].numpy(), got[0].numpy()) >= mark, n


@pytest.mark.heavy
def test_pte_generate_and_inspect_and_missing_tokenizer(bundle, cli, tmp_path):
    proc = cli("generate", str(bundle.path), "--backend", "htp-sim", "--prompt", "The quick", "--max-new-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    proc = cli("inspect", str(bundle.path))
    assert proc.returncode == 0, proc.stderr
    assert "kv_forward" in proc.stdout and "prefill_forward" in proc.stdout
    import json
    d = json.loads(cli("inspect", str(bundle.path), "--json", check=True).stdout)["deployment"]
    et = [r for r in d["runtimes"] if r["runtime"] == "ExecuTorch (QNN delegate)"]
    prog = bundle.manifest.llm.pte["SM8650"]
    assert len(et) == 1 and prog.file in et[0]["files"] and prog.host_twin not in et[0]["files"]
    assert prog.host_twin in d["host_only_files"]
    broken = tmp_path / "broken"
    shutil.copytree(bundle.path, broken)
    (broken / "tokenizer" / "tokenizer.json").unlink()
    proc = cli("generate", str(broken), "--backend", "htp-sim", "--prompt", "hi", "--max-new-tokens", "2")
    assert_clean_error(proc, "missing its tokenizer", "tokenizer.json", "--force")


@pytest.mark.heavy
def test_pte_numerics_recorded_for_inspect_and_report(bundle, cli):
    """Compile's measure per method and stage pair, typed, and the twin-vs-float rows in manifest.numerics
    that inspect prints and report.html plots (as for context-binary bundles)."""
    prog = bundle.manifest.llm.pte["SM8650"]
    assert set(prog.numerics) == {"kv_forward", "prefill_forward"}
    for pairs in prog.numerics.values():
        assert set(pairs) == {"float vs fake-quant", "float vs htp-sim", "fake-quant vs htp-sim"}
    assert sorted(prog.fake_quant.values()) == ["qdq/kv_forward.pt2", "qdq/prefill_forward.pt2"]
    rows = bundle.manifest.numerics["outputs"]
    assert sorted(r["name"] for r in rows) == ["kv_forward logits", "prefill_forward logits"]
    out = cli("inspect", str(bundle.path), check=True).stdout
    assert "numerics   kv_forward logits: SQNR" in out
    html = (bundle.path / "report.html").read_text()
    assert "Numerics vs the float model" in html and "prefill_forward logits" in html
    assert "fake-quant vs htp-sim" in html
    d = __import__("json").loads(cli("inspect", str(bundle.path), "--json", check=True).stdout)["deployment"]
    assert "qdq/kv_forward.pt2" in d["host_only_files"]


@pytest.mark.heavy
def test_pte_eval_every_stage_and_verify_per_method(bundle, work, cli):
    """eval of a .pte bundle at float, fake-quant (QnnQuantizer's graphs on the CPU) and htp-sim (the twin):
    the quantized stages near float and the twin near its fake-quant graph; verify compares each method's
    logits on the simulator with float on held-out text and records them."""
    import json
    from modelexport.runtime.evaluate import evaluate
    res = evaluate(bundle.path, work / "calib.txt", stages=["float", "fake-quant", "htp-sim"], window=32,
                   max_tokens=128, sim_window=16, sim_tokens=32)
    ppl = {k: v["perplexity"] for k, v in res["stages"].items()}
    assert set(ppl) == {"float", "fake-quant", "htp-sim"}
    assert abs(ppl["fake-quant"] / ppl["float"] - 1) < 0.1, ppl
    short = res["short"]["perplexity"]
    assert abs(short["htp-sim"] / short["fake-quant"] - 1) < 0.1, short
    assert res["sqnr"]["fake-quant vs htp-sim"]["sqnr_db"] > res["sqnr"]["float vs htp-sim"]["sqnr_db"] - 3
    proc = cli("verify", str(bundle.path), "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert sorted(g["part"] for g in rep["graphs"]) == ["kv_forward", "prefill_forward"]
    assert all(g["passed"] and g["outputs"][0]["name"] == "logits" for g in rep["graphs"])
    assert set(rep["stages"]["kv_forward"]) == {"float vs fake-quant", "float vs htp-sim", "fake-quant vs htp-sim"}
    from modelexport.contract import open_bundle
    num = open_bundle(bundle.path).manifest.numerics
    assert num["inputs"].startswith("calibration text") and num["samples"] == 2
    proc = cli("verify", str(bundle.path), "--part", "ar9")
    assert_clean_error(proc, "no decoder method 'ar9'", "kv_forward (ar1)", "prefill_forward (ar4)")
    assert_clean_error(cli("verify", str(bundle.path), "--per-layer"), "--per-layer", "without --per-layer")


@pytest.mark.heavy
def test_pte_bundle_without_fake_quant_graphs_names_its_stages(bundle, cli, tmp_path):
    """A .pte bundle that keeps no fake-quant graphs (compiled before they were kept): eval says which
    stages it runs, before any work; run (one graph's feed) points to generate / eval / verify."""
    import json
    old = tmp_path / "old"
    shutil.copytree(bundle.path, old)
    m = json.loads((old / "manifest.json").read_text())
    for prog in m["llm"]["pte"].values():
        prog.pop("fake_quant")
    m["files"] = [f for f in m["files"] if not f["path"].startswith("qdq/")]
    shutil.rmtree(old / "qdq")
    (old / "manifest.json").write_text(json.dumps(m))
    proc = cli("eval", str(old), "--stages", "fake-quant,htp-sim")
    assert_clean_error(proc, "cannot run stage(s) fake-quant", "keeps no fake-quant graphs", "float, htp-sim, cpu",
                       "--stages htp-sim", "--format pte --force")
    proc = cli("run", str(bundle.path), "--random")
    assert_clean_error(proc, "LLM .pte bundle", "generate BUNDLE --backend htp-sim")


@pytest.mark.heavy
def test_pte_and_onnx_paths_score_alike(bundle, work):
    """The same tiny model compiled both ways (16a4w_block, ar1+ar4, C=64, same text): the .pte's
    QnnQuantizer graph and the ONNX path's QDQ graph stay as near float as each other, and so do
    their twins on the simulator."""
    import modelexport
    from modelexport.runtime.evaluate import evaluate
    ctx = modelexport.compile(str(work / "tiny_hf"), output=work / "ctx_bundle", target="SM8650", variants="ar1,ar4",
                              max_seq_len=SEQ, calibration=str(work / "calib.txt"), calibration_samples=4)
    # the same rounding of the 4-bit weights, every one of them pinned in both methods of the .pte
    assert bundle.manifest.llm.weight_rounding.method == ctx.manifest.llm.weight_rounding.method
    n_linears = bundle.manifest.llm.weight_rounding.modules
    for method in ("kv_forward", "prefill_forward"):
        assert bundle.manifest.llm.quantization[method]["rounded_weights"] == {"pinned": n_linears, "left_min_max": 0}
    kw = dict(stages=["float", "fake-quant", "htp-sim"], window=32, max_tokens=128, sim_window=16, sim_tokens=32)
    res = {name: evaluate(b.path, work / "calib.txt", **kw) for name, b in (("pte", bundle), ("onnx", ctx))}
    print({name: (r["stages"], r["sqnr"]) for name, r in res.items()})
    assert res["pte"]["stages"]["float"]["perplexity"] == pytest.approx(res["onnx"]["stages"]["float"]["perplexity"])
    flt = res["pte"]["stages"]["float"]["perplexity"]
    for stage in ("fake-quant",):
        gap = {name: abs(r["stages"][stage]["perplexity"] / flt - 1) for name, r in res.items()}
        assert gap["pte"] < max(2 * gap["onnx"], 0.02), gap
    sq = {name: r["sqnr"]["float vs htp-sim"]["sqnr_db"] for name, r in res.items()}
    assert sq["pte"] > sq["onnx"] - 6, sq


# ---- one to_edge, two lowerings (a toy two-method model: ~25 s of CPU, so heavy) ---------------

class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.mark.heavy
def test_one_edge_program_gives_the_shared_program_and_its_twin():
    """`lower_methods` runs export + to_edge once and partitions + compiles it per QNN spec: the shared
    program holds both methods over one binary with the weights once, the twin the same methods
    unshared, and the twin on the simulator computes what the quantized graph computes."""
    import numpy as np

    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.backends.llm_pte.compile import lower_methods, read_program
    from modelexport.backends.llm_pte.session import load_program
    from modelexport.core.numerics import sqnr_db
    from modelexport.core.targets import get_target
    from modelexport.llm.model.pte_methods import pte_records
    from modelexport.quant.pt2e_qnn import QuantPlan, quantize
    from modelexport.quant.precision import get_precision
    qnn_ready()
    soc, model = get_target("SM8650"), _Mlp().eval()
    inputs = {"kv_forward": (torch.randn(1, 1, 64),), "prefill_forward": (torch.randn(1, 4, 64),)}
    graphs = {m: quantize(torch.export.export(model, x, strict=True).module(), QuantPlan(get_precision("16a8w")), soc,
                          [x, tuple(t * 0.5 for t in x)]) for m, x in inputs.items()}
    steps: dict = {}
    programs = lower_methods(graphs, inputs, soc, {"get_max_seq_len": 8}, False, steps)
    assert set(programs) == {"shared", "twin"} and {"to_edge_s", "lower_shared_s", "lower_twin_s"} <= set(steps)
    info = {k: read_program(v, list(graphs)) for k, v in programs.items()}    # both methods on QnnBackend
    ws, _ = pte_records("p.pte", "t.pte", info["shared"], info["twin"], 0, 0, {}, {}, {}, {}, {})
    assert ws.weights_stored_once and ws.bytes < ws.unshared_twins_bytes
    assert all(not g.get("shared_weights_size") for g in info["twin"]["graphs"].values())
    twin = load_program(programs["twin"])
    for method, x in inputs.items():
        got = twin.load_method(method).execute(list(x))[0]
        assert sqnr_db(graphs[method](*x).detach().numpy(), np.asarray(got)) > 30, method


@pytest.mark.heavy
def test_edge_cuts_leave_the_edge_program_as_it_was(monkeypatch):
    """The to_edge cuts (non-strict re-export, provenance dropped between phases: `EDGE_CUTS`) change
    how long it takes, not what it gives: the same ops in the same order on the same constants; the
    provenance chains every pass deep-copies are shorter."""
    from modelexport.backends.executorch_qnn.specs import compile_specs, qnn_ready
    from modelexport.backends.llm_pte import compile as pc
    from modelexport.core.targets import get_target
    from modelexport.quant.pt2e_qnn import QuantPlan, quantize
    from modelexport.quant.precision import get_precision
    qnn_ready()
    soc, model = get_target("SM8650"), _Mlp().eval()
    inputs = {"kv_forward": (torch.randn(1, 1, 64),), "prefill_forward": (torch.randn(1, 4, 64),)}
    graphs = {m: quantize(torch.export.export(model, x, strict=True).module(), QuantPlan(get_precision("16a8w")), soc,
                          [x, tuple(t * 0.5 for t in x)]) for m, x in inputs.items()}

    def edge(cuts: bool) -> dict:
        monkeypatch.setitem(pc.EDGE_CUTS, "on", cuts)
        e = pc.edge_program(graphs, inputs, compile_specs(soc, use_fp16=False), {"get_max_seq_len": 8}, False)
        out = {m: _edge_structure(e.exported_program(m)) for m in e.methods}
        out["depth"] = max(_provenance_depth(n) for m in e.methods for n in e.exported_program(m).graph.nodes)
        return out

    before, after = edge(False), edge(True)
    assert set(before) == set(after) == set(inputs) | {"depth"}
    for m in inputs:
        assert after[m] and after[m] == before[m], m
    assert after["depth"] < before["depth"], (after["depth"], before["depth"])


def _edge_structure(ep) -> list:
    """An edge program without its names and its placeholders' order (strict and non-strict export
    name and order the constants differently): each op with its arguments, a constant argument as its
    shape, dtype and sum, an op's as its position."""
    import torch.fx
    sig = ep.graph_signature
    where = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    tensors = {**ep.state_dict, **ep.constants}
    key: dict = {}
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            t = tensors[where[n.name]] if n.name in where else None
            key[n] = ("input", n.name) if t is None else (tuple(t.shape), str(t.dtype), float(t.double().sum()))
    ops = []
    for n in ep.graph.nodes:
        if n.op != "placeholder":
            key[n] = len(ops)
            ops.append((n.op, str(n.target), repr(torch.fx.node.map_arg(n.args, key.get))))
    return ops


def _provenance_depth(node) -> int:
    depth, chain = 0, node.meta.get("from_node") or []
    while chain:
        depth, chain = depth + 1, chain[0].from_node
    return depth
