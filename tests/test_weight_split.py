"""`--split-weights` (quant/weight_split.py): each convolution's 8-bit weights as two 8-bit halves.

The float graph computes the same values; the QDQ graph's weights are about 16-bit precise; on the
HTP simulator a stack whose 8-bit weight error adds up gains what 16-bit weights would give."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import modelexport
from modelexport.core.errors import InputError
from modelexport.quant.weight_split import LO_SUFFIX, on_int8_grid, split_weights
from onnx_models import conv_relu, dense_outliers, weight_outliers


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_split_graph_computes_what_the_float_graph_does(tmp_path):
    m = onnx.load(str(weight_outliers(tmp_path / "m.onnx")))
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    before = _run(m, x)
    info = split_weights(m, per_channel=True)
    assert info["layers"] == 4 and len(info["weights"]) == 4
    assert [n.op_type for n in m.graph.node[:4]] == ["Conv", "Conv", "Add", "Relu"]
    assert m.graph.node[1].name == "/layers.0/conv/Conv" + LO_SUFFIX
    np.testing.assert_allclose(_run(m, x), before, rtol=1e-4, atol=1e-5)


def test_dense_layers_split_too_and_compute_the_same():
    m = onnx.load(str(dense_outliers(Path(tempfile.mkdtemp()) / "d.onnx")))
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    before = _run(m, x)
    assert split_weights(m, per_channel=True)["layers"] == 2
    assert [n.op_type for n in m.graph.node] == ["MatMul", "MatMul", "Add", "Relu", "Gemm", "Gemm", "Add"]
    assert len(m.graph.node[5].input) == 2          # the remainder's Gemm adds no second bias
    np.testing.assert_allclose(_run(m, x), before, rtol=1e-4, atol=1e-5)


def test_the_high_half_is_on_the_quantizers_own_grid():
    w = np.random.default_rng(1).standard_normal((6, 4, 3, 3)).astype(np.float32)
    hi = on_int8_grid(w, 0)
    scale = np.abs(w).max(axis=(1, 2, 3), keepdims=True) / 127
    steps = hi / scale
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-6)
    assert np.abs(steps).max() == pytest.approx(127)
    assert np.abs(w - hi).max() <= scale.max() / 2 + 1e-7


def _sqnr(a, b):
    return 10 * np.log10(float((a.astype(np.float64) ** 2).sum()) / float(((a - b).astype(np.float64) ** 2).sum()))


def test_split_weights_win_back_the_weight_error_on_the_simulator(tmp_path):
    """16a8w: the outlier weights' 8-bit error caps the stack; split, the same compile verifies far above
    it on the HTP simulator, and the manifest says how many layers were split."""
    model = weight_outliers(tmp_path / "m.onnx")
    cal = tmp_path / "cal"
    cal.mkdir()
    rng = np.random.default_rng(2)
    for i in range(4):
        np.savez(cal / f"{i}.npz", x=rng.standard_normal((1, 8, 16, 16)).astype(np.float32))
    got = {}
    for split in (False, True):
        b = modelexport.compile(str(model), output=tmp_path / f"b{split}", target="SM8650", precision="16a8w",
                                calibration=str(cal), split_weights=split)
        got[split] = b.manifest.numerics["outputs"][0]["sqnr_db"]
        quant = b.manifest.parts[0].quantization
        assert (quant.get("split_weights") == {"layers": 4}) if split else "split_weights" not in quant
    assert got[True] >= got[False] + 10, got


def test_split_dense_weights_on_the_simulator(tmp_path):
    """MatMul and Gemm (transB=1) weights split, per output column: the compile verifies better."""
    model = dense_outliers(tmp_path / "d.onnx")
    got = {}
    for split in (False, True):
        b = modelexport.compile(str(model), output=tmp_path / f"d{split}", target="SM8650", precision="16a8w",
                                calibration="random", split_weights=split)
        got[split] = b.manifest.numerics["outputs"][0]["sqnr_db"]
    assert got[True] >= got[False] + 10, got


def test_split_weights_refuses_weights_that_are_not_8_bit(tmp_path, cli):
    model = conv_relu(tmp_path / "m.onnx")
    r = cli("compile", str(model), "-t", "SM8650", "--precision", "16a16w", "--split-weights", "--calibration", "random",
            "-o", str(tmp_path / "b"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--split-weights splits 8-bit weights" in r.stderr and "8a8w or 16a8w" in r.stderr
    assert not (tmp_path / "b").exists()
    with pytest.raises(InputError, match="fp16 keeps float weights"):
        modelexport.compile(str(model), output=tmp_path / "f", target="SM8650", precision="fp16", split_weights=True)
    with pytest.raises(InputError, match="tries --split-weights itself"):
        modelexport.compile(str(model), output=tmp_path / "a", target="SM8650", precision="auto", calibration="random",
                            split_weights=True)


def test_a_layer_with_an_override_of_its_own_stays_whole(tmp_path):
    """--override gives layers.0 16-bit weights: it is not split; the other three are."""
    model = weight_outliers(tmp_path / "m.onnx")
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="16a8w", calibration="random",
                            split_weights=True, overrides=[r"layers\.0\.conv=16a16w"])
    assert b.manifest.parts[0].quantization["split_weights"] == {"layers": 3}
    names = {n.name for n in onnx.load(str(b.path / b.manifest.parts[0].files.quantized_model)).graph.node}
    assert "/layers.0/conv/Conv" + LO_SUFFIX not in names and "/layers.1/conv/Conv" + LO_SUFFIX in names
