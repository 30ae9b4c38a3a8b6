"""User mistakes on the ONNX path: one clear message, non-zero exit, no partial bundle."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_clean_error
from onnx_models import conv_relu


@pytest.fixture
def model(tmp_path):
    return conv_relu(tmp_path / "conv.onnx")


def _compile(cli, tmp_path, model, *extra):
    out = tmp_path / "out"
    proc = cli("compile", str(model), "-o", str(out), *extra)
    assert not out.exists() and not list(tmp_path.glob(".out.*")), "a partial bundle was left behind"
    return proc


def test_corrupt_and_non_onnx_files(tmp_path, cli_here):
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(np.random.default_rng(0).bytes(4096))
    assert_clean_error(_compile(cli_here, tmp_path, corrupt, "--calibration", "random"), "not a valid ONNX model")
    text = tmp_path / "notes.onnx"
    text.write_text("<html>not a model</html>")
    assert_clean_error(_compile(cli_here, tmp_path, text, "--calibration", "random"), "not a valid ONNX model")
    assert_clean_error(cli_here("audit", str(tmp_path / "missing.onnx")), "does not exist")


def test_dynamic_shape_needs_input_shape(tmp_path, cli_here):
    dyn = conv_relu(tmp_path / "dyn.onnx", dynamic=True)
    assert_clean_error(_compile(cli_here, tmp_path, dyn, "--calibration", "random"), "dynamic", "--input-shape x=N,3,16,16")
    assert_clean_error(_compile(cli_here, tmp_path, dyn, "--calibration", "random", "--input-shape", "nope=1,3,16,16"), "nope")


def test_a_fix_is_written_in_the_words_of_its_caller(tmp_path):
    """The same error from the Python API names the keyword, not the CLI flag (the sweep's words:
    tests/test_sweep.py)."""
    import modelexport
    from modelexport.core.errors import InputError
    dyn = conv_relu(tmp_path / "dyn.onnx", dynamic=True)
    with pytest.raises(InputError) as e:
        modelexport.compile(str(dyn), output=tmp_path / "out", calibration="random")
    assert 'input_shapes={"x": [N, 3, 16, 16]}' in e.value.fix and "--input-shape" not in e.value.fix
    with pytest.raises(InputError) as e:
        modelexport.compile(str(dyn), output=tmp_path / "out", calibration="random", input_shapes=["x"])
    assert "not NAME=DIMS" in e.value.problem and 'input_shapes={"image": [1, 3, 224, 224]}' in e.value.fix


@pytest.mark.parametrize("array,needle", [
    (np.ones((1, 3, 8, 8), np.float32), "shape"),
    (np.ones((1, 3, 16, 16), np.float64), "dtype"),
])
def test_calibration_mismatch(tmp_path, cli_here, model, array, needle):
    d = tmp_path / "calib"
    d.mkdir()
    np.save(d / "s0.npy", array)
    assert_clean_error(_compile(cli_here, tmp_path, model, "--calibration", str(d)), needle, "'x'")


def test_calibration_wrong_names_and_missing(tmp_path, cli_here, model):
    np.savez(tmp_path / "c.npz", image=np.ones((1, 3, 16, 16), np.float32), extra=np.ones(3, np.float32))
    assert_clean_error(_compile(cli_here, tmp_path, model, "--calibration", str(tmp_path / "c.npz")), "input(s) x")
    assert_clean_error(_compile(cli_here, tmp_path, model), "calibration", "--calibration random")


def test_unknown_target_vtcm_and_existing_output(tmp_path, cli_here, model):
    assert_clean_error(_compile(cli_here, tmp_path, model, "--target", "SM9999", "--calibration", "random"), "unknown target", "SM8650")
    assert_clean_error(_compile(cli_here, tmp_path, model, "--vtcm-mb", "64", "--calibration", "random"), "exceeds", "VTCM")
    assert_clean_error(cli_here("compile-qnn", str(model), "x.bin", "--backend", "GPU"), "HTP")
    (tmp_path / "exists").mkdir()
    assert_clean_error(cli_here("compile", str(model), "-o", str(tmp_path / "exists"), "--calibration", "random"), "already exists", "--force")


def test_a_missing_model_or_a_python_file_without_its_function(cli_here, tmp_path):
    proc = cli_here("audit", str(tmp_path / "nothing.onnx"), "--target", "SM8650")
    assert_clean_error(proc, "does not exist")
    (tmp_path / "model.py").write_text("def build():\n    pass\n")
    proc = cli_here("audit", str(tmp_path / "model.py"), "--target", "SM8650")
    assert_clean_error(proc, "model.py:FUNCTION")
