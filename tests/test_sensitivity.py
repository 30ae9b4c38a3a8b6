"""What --precision auto promotes, and how it measures the cost (issue 41).

Layers are ranked by what taking each out of the quantization gives the outputs back
(quant/sensitivity.py), on ONNX Runtime's QDQ model on the CPU; activation ranges can be clipped to
the bulk of the values (`--calibration-method percentile`); candidates are costed in simulator cycles
with the simulator's threads on one host core (profiling/ort_profile.steady_cycles)."""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import modelexport
from conftest import assert_clean_error
from onnx_models import conv_relu, outlier_channels
from modelexport.quant.sensitivity import bypassed, layer_gains, _dq_of
from modelexport.sweeping.auto_precision import _next_layers, _next_rung, override_flags


def _calib(n=4, shape=(1, 3, 16, 16), seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def test_the_layer_whose_constant_8_bits_cannot_hold_gains_the_most(tmp_path):
    """outlier_channels: the per-channel scale spans 10^4 in one constant, so at 8 bits its small
    entries are 0 and the output is lost (0 dB). Taken out of the quantization with its constant, the
    scale alone gives back more than 10 dB; no layer gains from its activations alone, so the search
    gives that layer 16-bit weights rather than 16-bit activations."""
    outlier_channels(tmp_path / "m.onnx")
    calib = _calib()
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="8a8w",
                            calibration=calib, use_cache=False)
    pm = b.manifest.parts[0]
    fpath, qpath = b.file(pm.files.float_model), b.file(pm.files.quantized_model)
    layers = ["/stem/conv/Conv", "/outlier/scale/Mul", "/outlier/mix/Conv", "/head/conv/Conv"]
    acts = layer_gains(fpath, qpath, calib, layers, lambda name: [name])
    both = layer_gains(fpath, qpath, calib, layers, lambda name: [name], with_weights=True)
    assert max(acts.values()) < 1, acts
    assert both["/outlier/scale/Mul"] > 10 > max(v for k, v in both.items() if k != "/outlier/scale/Mul"), both


def test_a_bypassed_layer_reads_and_writes_float_and_the_rest_stays_quantized(tmp_path):
    conv_relu(tmp_path / "m.onnx")
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="8a8w",
                            calibration=_calib(), use_cache=False)
    q = onnx.load(str(b.file(b.manifest.parts[0].files.quantized_model)))
    fwd, back = _dq_of(q)
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    m = bypassed(q, {conv.name}, fwd, back)
    new = next(n for n in m.graph.node if n.name == conv.name)
    assert new.input[0] == back[conv.input[0]]                       # its input unquantized
    readers = [n for n in m.graph.node if conv.output[0] in n.input and n.op_type not in ("QuantizeLinear",)]
    assert readers and all(n.op_type != "DequantizeLinear" for n in readers)
    assert sum(n.op_type == "QuantizeLinear" for n in m.graph.node) == sum(n.op_type == "QuantizeLinear" for n in q.graph.node)


def test_promotions_are_anchored_and_climb_one_rung_at_a_time():
    assert override_flags({"a.b": "16a8w", "c": "16a8w", "d": "16a16w"}) == ["^(a\\.b|c)$=16a8w", "^d$=16a16w"]
    assert override_flags({"p2o.Conv.1": "fp16"}) == ["^p2o\\.Conv\\.1$=fp16"]
    assert _next_rung("8a8w", False) == "16a8w" and _next_rung("16a8w", False) == "16a16w"
    assert _next_rung("8a8w", True) == "16a16w" and _next_rung("16a16w", True) == "fp16"
    order = ["x", "y", "z"]
    assert _next_layers(order, {"x": "16a8w"}, set(), 2) == ["y", "z"]          # the lower rungs first
    assert _next_layers(order, {"x": "fp16"}, {"y"}, 5) == ["z"]                 # not past the top, not a stuck one


def _spiky(seed=1, n=8):
    """Inputs whose every sample holds one spike 40x the rest: min-max ranges spend the 8 bits on it."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        x[0, rng.integers(3), rng.integers(16), rng.integers(16)] = 40.0
        out.append({"x": x})
    return out


def test_percentile_ranges_are_an_option_and_recorded(tmp_path, capfd):
    conv_relu(tmp_path / "m.onnx", channels=8)
    kw = dict(target="SM8650", precision="8a8w", calibration=_spiky(), use_cache=False)
    capfd.readouterr()
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "p", calibration_method="percentile", **kw)
    assert b.manifest.parts[0].quantization["calibration_method"] == "Percentile"
    assert "histogram" not in capfd.readouterr().out     # ONNX Runtime's calibrator prints; --json's stdout stays JSON
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "m", **kw)
    assert b.manifest.parts[0].quantization["calibration_method"] == "MinMax"


def test_percentile_ranges_of_float16_activations(tmp_path):
    """A model with float16 activations inside (slovorez, a Keras mixed-precision export): ONNX Runtime's
    histogram of a float16 tensor failed ("Too many bins for data range"); it is binned as float32."""
    from onnx_models import float16_inside
    rng = np.random.default_rng(0)
    cal = [{"x": rng.standard_normal((1, 4, 32)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(float16_inside(tmp_path / "m.onnx")), output=tmp_path / "p", target="SM8650",
                            precision="8a8w", calibration=cal, calibration_method="percentile", use_cache=False)
    assert b.manifest.parts[0].quantization["calibration_method"] == "Percentile"
    assert b.manifest.numerics["passed"], b.manifest.numerics


def test_a_wrong_calibration_method_and_one_given_to_auto_are_clean_errors(tmp_path, cli):
    model = str(conv_relu(tmp_path / "m.onnx"))
    r = cli("compile", model, "-p", "8a8w", "--calibration", "random", "--calibration-method", "entropy",
            "-o", str(tmp_path / "b"))
    assert_clean_error(r, "--calibration-method 'entropy'", "minmax, percentile")
    r = cli("compile", model, "-p", "auto", "--calibration", "random", "--calibration-method", "percentile",
            "-o", str(tmp_path / "b"))
    assert_clean_error(r, "tries both calibration methods itself")
    assert not (tmp_path / "b").exists()


def test_steady_cycles_holds_the_simulator_on_one_core_and_lets_go(tmp_path):
    from modelexport.profiling.ort_profile import steady_cycles
    conv_relu(tmp_path / "m.onnx")
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="8a8w",
                            calibration=_calib(), use_cache=False)
    before = os.sched_getaffinity(0)
    cycles = steady_cycles(b.path, runs=2)
    assert os.sched_getaffinity(0) == before
    assert cycles is not None and cycles > 0


def test_a_layer_given_back_to_8a8w_is_measured_as_the_quantizer_would_write_it(tmp_path):
    """--precision auto gives layers of a 16a8w candidate back to 8a8w where that saves cycles; what
    each costs is estimated on the 16-bit QDQ graph (8-bit fake-quant around the layer, the low half
    of its split weights dropped). The estimate is checked here against the QDQ graph ONNX Runtime's
    quantizer writes with that layer overridden to 8a8w."""
    from modelexport.quant.calibration import CalibrationSet
    from modelexport.quant.onnx_qdq import quantize_onnx
    from modelexport.quant.per_layer import _session
    from modelexport.quant.precision import get_precision
    from modelexport.quant.sensitivity import Demotions, worst_sqnr
    from onnx_models import weight_outliers
    src = weight_outliers(tmp_path / "m.onnx")
    calib = _calib(shape=(1, 8, 16, 16))
    layer = "/layers.1/conv/Conv"
    quantize_onnx(src, tmp_path / "w.onnx", get_precision("16a8w"), CalibrationSet(calib, "file", "t"), split_weights=True)
    quantize_onnx(src, tmp_path / "d.onnx", get_precision("16a8w"), CalibrationSet(calib, "file", "t"), split_weights=True,
                  overrides=[f"^{layer}$=8a8w"])
    est = Demotions(src, tmp_path / "w.onnx", calib)
    refs = [_session(onnx.load(str(src))).run(["y"], s) for s in calib]
    real = worst_sqnr(refs, [_session(onnx.load(str(tmp_path / "d.onnx"))).run(["y"], s) for s in calib])
    db, done = est.db([layer, "/layers.3/conv/Conv"])
    assert est.start - real > 10                    # the layer's 8-bit weights lose what the split kept
    assert abs(db - real) < 1.5, (est.start, db, real)
    assert done == [layer]                          # the last layer's output is the graph's: left at 16 bits
    assert est.layers()[:2] == ["/layers.0/conv/Conv", "/layers.1/conv/Conv"]


def test_give_back_takes_the_run_of_layers_that_saves_more_within_the_floor():
    from modelexport.sweeping.give_back import Run, longest_run
    loss = {"a": 20, "b": 5, "c": 1, "d": 1, "e": 1}

    class Measured:                   # the worst output's dB with a run of layers at 8a8w, losses adding up
        start = 40.0

        def layers(self):
            return list(loss)

        def db(self, run):
            return self.start - sum(loss[n] for n in run), list(run)
    saving = {"a": 1, "b": 1, "c": 10, "d": 10, "e": 10}
    assert longest_run(Measured(), saving, 36) == Run(["c", "d", "e"], True)
    assert longest_run(Measured(), saving, 10) == Run(["a", "b", "c", "d", "e"], True)
    assert longest_run(Measured(), dict.fromkeys(loss, 0), 36) is None   # nothing saves cycles
    assert Run(["c", "d", "e"], True).half() == Run(["e"], True)          # the half away from the kept layers
    assert Run(["a", "b", "c", "d"], False).half() == Run(["a", "b"], False)
    assert Run(["a"], False).half() is None
