"""Calibration sources (quant/calibration_sources.py, quant/calibration.py): one test per source
kind, and one clear CalibrationError (an InputError) per mistake, naming the sample and the input."""
from __future__ import annotations

import numpy as np
import pytest

from modelexport.core.errors import CalibrationError, InputError
from modelexport.frontends.torch_export import TorchIO
from modelexport.quant.calibration import load_calibration

ONE = [TorchIO("x", (1, 3, 4, 4), "float32")]
NESTED = [TorchIO("x", (5, 1, 4), "float32"), TorchIO("hx_0", (1, 1, 8), "float32"), TorchIO("hx_1", (1, 1, 8), "float32")]
TWO = [TorchIO("ids", (1, 6), "int64"), TorchIO("mask", (1, 6), "float32")]


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 4, 4)).astype(np.float32)


def _nested(seed: int = 0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((5, 1, 4)).astype(np.float32),
            (r.standard_normal((1, 1, 8)).astype(np.float32), r.standard_normal((1, 1, 8)).astype(np.float32)))


def _same(cs, *arrays):
    assert len(cs.samples) == len(arrays)
    for s, a in zip(cs.samples, arrays):
        np.testing.assert_array_equal(s["x"], a)


def test_a_folder_an_input_list_and_an_npz(tmp_path):
    d = tmp_path / "calib"
    d.mkdir()
    np.save(d / "a.npy", _x(0))
    np.save(d / "b.npy", _x(1))
    _same(load_calibration(d, ONE), _x(0), _x(1))
    (tmp_path / "list.txt").write_text("calib/a.npy\nx:=calib/b.npy\n")
    cs = load_calibration(tmp_path / "list.txt", ONE)
    assert cs.kind == "input-list"
    _same(cs, _x(0), _x(1))
    np.savez(tmp_path / "c.npz", x=np.stack([_x(0), _x(1), _x(2)]))
    _same(load_calibration(str(tmp_path / "c.npz"), ONE), _x(0), _x(1), _x(2))


def test_one_array_and_one_tensor():
    import torch
    _same(load_calibration(_x(), ONE), _x())
    cs = load_calibration(torch.from_numpy(_x(3)), ONE)
    assert cs.kind == "array"
    _same(cs, _x(3))


def test_a_list_of_arrays_and_of_tensors():
    import torch
    cs = load_calibration([_x(0), _x(1)], ONE)        # was: TypeError: unhashable type: 'numpy.ndarray'
    assert cs.kind == "arrays"
    _same(cs, _x(0), _x(1))
    _same(load_calibration([torch.from_numpy(_x(2))], ONE), _x(2))


def test_a_list_of_input_tuples_positional_and_nested():
    import torch
    _same(load_calibration([(_x(0),), (torch.from_numpy(_x(1)),)], ONE), _x(0), _x(1))
    cs = load_calibration([_nested(0), _nested(1)], NESTED)   # (x, (h0, c0)) as an LSTM takes it
    assert cs.kind == "tuples" and list(cs.samples[0]) == ["x", "hx_0", "hx_1"]
    np.testing.assert_array_equal(cs.samples[1]["hx_1"], _nested(1)[1][1])


def test_dicts_flat_and_nested():
    ids = np.arange(6, dtype=np.int64)[None]
    mask = np.ones((1, 6), np.float32)
    cs = load_calibration([{"ids": ids, "mask": mask}] * 2, TWO)
    assert cs.kind == "dicts" and len(cs.samples) == 2
    x, (h, c) = _nested()
    cs = load_calibration({"x": x, "hx": (h, c)}, NESTED)
    np.testing.assert_array_equal(cs.samples[0]["hx_0"], h)


def test_a_generator():
    cs = load_calibration((_x(i) for i in range(3)), ONE)  # was: expected str ... not generator
    assert cs.kind == "iterator"
    _same(cs, _x(0), _x(1), _x(2))


def test_an_endless_generator_stops_with_a_note():
    def forever():
        while True:
            yield _x()
    cs = load_calibration(forever(), ONE)
    assert len(cs.samples) == 128 and "stopped after 128" in cs.notes[0]


def test_a_dataloader_of_tensors_tuples_and_dicts():
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    xs = torch.from_numpy(np.concatenate([_x(i) for i in range(5)]))          # 5 samples of [3, 4, 4]
    cs = load_calibration(DataLoader(TensorDataset(xs), batch_size=2), ONE)   # batches of (x,): [2, 3, 4, 4]
    assert cs.kind == "dataloader"
    _same(cs, *[_x(i) for i in range(5)])                                   # the batch axis is split
    plain = DataLoader(xs, batch_size=5)                                     # batches are tensors
    assert len(load_calibration(plain, ONE).samples) == 5
    ds = [{"ids": torch.arange(6), "mask": torch.ones(6)} for _ in range(4)]
    cs = load_calibration(DataLoader(ds, batch_size=2), TWO)               # batches are dicts
    assert len(cs.samples) == 4 and cs.samples[0]["ids"].shape == (1, 6)


@pytest.mark.parametrize("source, needle", [
    ([], "holds no samples"),
    (iter([]), "holds no samples"),
    ([np.zeros((1, 3, 5, 5), np.float32)], "sample 0 input 'x' has shape [1, 3, 5, 5]; the model wants [1, 3, 4, 4]"),
    ([_x(), _x().astype(np.float64)], "sample 1 input 'x' has dtype float64; the model wants float32"),
    ([(_x(), _x())], "sample 0 holds 2 array(s); the model has 1 input(s)"),
    ([{"y": _x()}], "sample 0 lacks input(s) x; has y, not inputs of the model"),
    ([_x(), np.full((1, 3, 4, 4), np.nan, np.float32)], "sample 1 of 2 sample(s)"),
    (object(), "calibration is a object"),
    (["nope"], "sample 0 is a str"),
])
def test_each_mistake_is_one_clear_input_error(source, needle):
    with pytest.raises(CalibrationError) as e:
        load_calibration(source, ONE)
    assert needle in str(e.value), str(e.value)
    assert isinstance(e.value, InputError) and e.value.fix


def test_all_nan_is_blamed_on_the_data_for_files_too(tmp_path):
    np.save(tmp_path / "nan.npy", np.full((1, 3, 4, 4), np.nan, np.float32))
    with pytest.raises(CalibrationError) as e:
        load_calibration(tmp_path / "nan.npy", ONE)
    assert "is all NaN" in e.value.problem and "not at fault" in e.value.fix


def test_a_multi_input_model_given_one_array_per_sample_says_how_to_pair_them():
    with pytest.raises(CalibrationError) as e:
        load_calibration([np.zeros((1, 6), np.int64)], TWO)
    assert "one array; the model has 2 inputs" in e.value.problem and "tuple" in e.value.fix


def test_a_generator_that_raises_is_the_users_error_without_our_frames():
    def broken():
        yield _x()
        raise ValueError("disk gone")
    with pytest.raises(CalibrationError) as e:
        load_calibration(broken(), ONE)
    assert "raised ValueError at item 1: disk gone" in e.value.problem


def test_the_seeds_qnncompiler_takes_a_loader_for_an_onnx_model(tmp_path):
    """QNNCompiler(quantization={"calibration_data": <generator>}): was a TypeError traceback."""
    from onnx_models import conv_relu

    from modelexport import QNNCompiler
    model = conv_relu(tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    loader = (rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(3))
    compiler = QNNCompiler()
    res = compiler.compile(str(model), quantization={"enabled": True, "calibration_data": loader,
                                                     "act_bitwidth": 8, "weights_bitwidth": 8}, output=tmp_path / "out")
    b = getattr(compiler, "last_bundle", None) or res    # modelexport.qnn's returns the artifact's path
    cal = b.manifest.calibration
    assert next(iter(cal.values()))["kind"] == "iterator" and next(iter(cal.values()))["samples"] == 3


def test_nested_names_follow_arguments_positions_and_keys():
    from modelexport.core.nested import flatten_args, template, unflatten
    args = (1, (2, 3), {"ids": 4, "mask": [5, 6]})
    leaves = flatten_args(args, ["x", "hx"])
    assert [n for n, _ in leaves] == ["x", "hx_0", "hx_1", "input_2_ids", "input_2_mask_0", "input_2_mask_1"]
    assert unflatten(template(args), [v for _, v in leaves]) == args
