"""The whole-bundle memo: an identical compile copies its earlier bundle; any changed input misses."""
from __future__ import annotations

import json

import numpy as np
import pytest

from modelexport.contract.bundle_memo import BundleMemo
from modelexport.core.errors import OutputExistsError
from onnx_models import conv_relu

OPTIONS = {"target": "SM8650", "precision": "8a8w", "use_cache": True}


@pytest.fixture
def inputs(tmp_path):
    model = conv_relu(tmp_path / "m.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(2):
        np.save(calib / f"{i}.npy", np.random.default_rng(i).standard_normal((1, 3, 16, 16)).astype(np.float32))
    return model, calib


def test_key_follows_every_input(inputs, tmp_path):
    model, calib = inputs
    key = BundleMemo.for_compile([model], calib, OPTIONS).key
    assert BundleMemo.for_compile([model], calib, OPTIONS).key == key
    assert BundleMemo.for_compile([model], calib, {**OPTIONS, "precision": "16a8w"}).key != key
    assert BundleMemo.for_compile([model], calib, {**OPTIONS, "jobs": 4}).key == key        # how, not what
    np.save(calib / "0.npy", np.zeros((1, 3, 16, 16), np.float32))
    assert BundleMemo.for_compile([model], calib, OPTIONS).key != key
    (tmp_path / "other").mkdir()
    other = conv_relu(tmp_path / "other" / "m.onnx", channels=4)
    assert BundleMemo.for_compile([other], calib, OPTIONS).key != key


def test_inputs_it_cannot_fingerprint_skip_it(inputs, tmp_path):
    model, calib = inputs
    assert BundleMemo.for_compile([model], calib, {**OPTIONS, "use_cache": False}) is None
    assert BundleMemo.for_compile(["model.py:build"], calib, OPTIONS) is None
    assert BundleMemo.for_compile([model], [{"x": np.zeros(1)}], OPTIONS) is None
    listing = tmp_path / "list.txt"
    listing.write_text("calib/0.npy\nmissing.npy\n")
    assert BundleMemo.for_compile([model], listing, OPTIONS) is None          # the loader names the missing file
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data
    m = onnx.load(str(model))
    convert_model_to_external_data(m, all_tensors_to_one_file=True, location="m.data", size_threshold=0)
    onnx.save(m, str(tmp_path / "ext.onnx"))
    assert BundleMemo.for_compile([tmp_path / "ext.onnx"], calib, OPTIONS) is None


def test_second_compile_is_a_copy_that_runs(inputs, tmp_path, cli_here):
    model, calib = inputs
    args = ["compile", str(model), "-c", str(calib), "-p", "8a8w", "--json"]
    first = json.loads(cli_here(*args, "-o", str(tmp_path / "a"), check=True).stdout)
    assert "bundle_memo" not in first["cache"]
    second = json.loads(cli_here(*args, "-o", str(tmp_path / "b"), check=True).stdout)
    assert second["cache"]["bundle_memo"] is True
    assert [f["sha256"] for f in second["files"]] == [f["sha256"] for f in first["files"]]
    ran = json.loads(cli_here("run", str(tmp_path / "b"), "-i", str(calib / "1.npy"), "--json", check=True).stdout)
    assert ran["outputs"]["y"]["shape"] == [1, 8, 16, 16]
    refused = cli_here(*args, "-o", str(tmp_path / "b"))
    assert refused.returncode != 0 and "already exists" in refused.stderr
    fresh = json.loads(cli_here(*args, "-o", str(tmp_path / "c"), "--no-cache", check=True).stdout)
    assert "bundle_memo" not in fresh["cache"] and fresh["cache"]["enabled"] is False


def test_restore_never_overwrites_without_force(inputs, tmp_path):
    model, calib = inputs
    memo = BundleMemo.for_compile([model], calib, OPTIONS)
    src = tmp_path / "built"
    src.mkdir()
    (src / "manifest.json").write_text(json.dumps({"schema_version": 2}))
    memo.store(src)
    (tmp_path / "out").mkdir()
    with pytest.raises(OutputExistsError):
        memo.restore(tmp_path / "out", force=False)
    assert memo.restore(tmp_path / "out", force=True) == tmp_path / "out"
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["cache"]["bundle_memo"] is True
