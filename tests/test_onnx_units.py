"""Fast checks of the ONNX path's pure-Python pieces (no QNN session)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from modelexport.auditing.fixes import suggest_fix
from modelexport.backends.ort_qnn.audit import parse_ep_log
from modelexport.frontends.module_paths import _collapse
from modelexport.core.cache import Cache, cache_key
from modelexport.core.errors import CalibrationError, InputError
from modelexport.frontends.onnx_model import IOSpec, parse_input_shapes
from modelexport.quant import get_precision, load_calibration, precision_from_bitwidths

INPUTS = [IOSpec("image", [1, 3, 4, 4], "float32")]

LOG = """2026-11-26 [V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (Reshape) :
\tOperator type: Reshape Node name: /head/Reshape Node index: 2
\tREASON : Failed to add node.

[0;93m2026-11-26 [W:onnxruntime:, qnn_model_wrapper.cc:565 CreateQnnNode] QNN.backendValidateOpConfig() failed for node `/head/Reshape` of type `Reshape` with error code 3110
2026-11-26 [V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (Det) :
\tOperator type: Det Node name: /head/det/Det Node index: 3
\tREASON : Operators of type `Det` are not supported by QNN EP.Det node `/head/det/Det` will not be assigned to QNN EP.

"""


def test_ep_log_reasons_are_matched_to_nodes():
    r = parse_ep_log(LOG + LOG)   # the EP logs each pass; reasons are not repeated
    assert r["/head/det/Det"] == ["Operators of type `Det` are not supported by QNN EP. Det node `/head/det/Det` will not be assigned to QNN EP."]
    assert any("3110" in x for x in r["/head/Reshape"]) and "Failed to add node." in r["/head/Reshape"]
    assert "3110" in suggest_fix("Reshape", " | ".join(r["/head/Reshape"]))
    assert "determinant" in suggest_fix("Det", r["/head/det/Det"][0])
    assert "--input-shape" in suggest_fix("Relu", "Cannot get shape")


def test_module_paths_from_exporter_scopes():
    assert _collapse(["features", "features.3", "conv", "conv.0", "conv.0.0"]) == "features.3.conv.0.0"
    assert _collapse(["layers.3", "mlp", "act"]) == "layers.3.mlp.act"


def test_input_shapes_and_precisions():
    assert parse_input_shapes(["image=1,3,224,224", "mask=1x128"]) == {"image": [1, 3, 224, 224], "mask": [1, 128]}
    with pytest.raises(InputError):
        parse_input_shapes(["image"])
    assert precision_from_bitwidths(8, 8, True).name == "8a8w"
    assert precision_from_bitwidths(16, 4, True).name == "16a4w"
    assert precision_from_bitwidths(None, None, False).name == "fp16"
    with pytest.raises(InputError):
        precision_from_bitwidths(4, 4, True)
    assert get_precision("W8A16").name == "16a8w"


def test_calibration_formats(tmp_path):
    x = np.ones((1, 3, 4, 4), np.float32)
    (tmp_path / "folder").mkdir()
    np.save(tmp_path / "folder" / "a.npy", x)
    x.tofile(tmp_path / "folder" / "b.raw")
    assert len(load_calibration(tmp_path / "folder", INPUTS).samples) == 2
    np.savez(tmp_path / "batch.npz", image=np.stack([x[0]] * 3)[:, None])
    assert len(load_calibration(tmp_path / "batch.npz", INPUTS).samples) == 3
    (tmp_path / "list.txt").write_text("# comment\nfolder/a.npy\nimage:=folder/b.raw\n")
    cal = load_calibration(tmp_path / "list.txt", INPUTS)
    assert cal.kind == "input-list" and len(cal.samples) == 2 and cal.representative
    rnd = load_calibration("random", INPUTS)
    assert not rnd.representative and "not representative" in rnd.describe()["warning"]


@pytest.mark.parametrize("bad,needle", [
    (np.ones((1, 3, 5, 5), np.float32), "shape"),
    (np.ones((1, 3, 4, 4), np.float64), "dtype"),
])
def test_calibration_mismatch_names_the_input(tmp_path, bad, needle):
    np.save(tmp_path / "x.npy", bad)
    with pytest.raises(CalibrationError) as e:
        load_calibration(tmp_path / "x.npy", INPUTS)
    assert "image" in e.value.problem and needle in e.value.problem
    np.savez(tmp_path / "named.npz", pixels=np.ones((1, 3, 4, 4), np.float32), other=np.ones(2))
    with pytest.raises(CalibrationError, match="image"):
        load_calibration(tmp_path / "named.npz", INPUTS)


def test_cache_builds_once_under_concurrency(tmp_path):
    calls = []

    def build(d):
        calls.append(1)
        (d / "out.bin").write_bytes(b"x" * 1000)
        return {"n": len(calls)}
    key = cache_key("t", b"model", {"opt": 1}, "v2.51")
    assert key != cache_key("t", b"model", {"opt": 2}, "v2.51")
    results = []
    threads = [threading.Thread(target=lambda: results.append(Cache(tmp_path).get_or_create("ns", key, build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sum(1 for _, hit in results if not hit) == 1
    assert (results[0][0] / "out.bin").read_bytes() == b"x" * 1000


def test_a_stale_static_output_shape_follows_the_fixed_input(tmp_path):
    """ppocr_v2_rec (paddle2onnx) declares 25 output steps while its 320-wide input gives 80: ONNX
    Runtime warned about it on every session. Fixing the input shape re-infers the outputs too."""
    import onnx
    from onnx import TensorProto, helper

    from modelexport.frontends.onnx_model import load_onnx
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 25])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    m = load_onnx(str(path), {"x": [1, 80]}).model
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == [1, 80]


def test_argmax_agreement_only_where_an_axis_holds_classes():
    from modelexport.backends.ort_qnn.verify import check_output
    rng = np.random.default_rng(0)
    scores = [rng.normal(size=(1, 10)) for _ in range(3)]
    assert check_output("s", scores, scores, 20.0).argmax_agreement == 1.0          # [N, C]: the last axis
    seq = [rng.normal(size=(1, 40, 97))]
    flipped = [s[..., ::-1] for s in seq]
    assert check_output("t", seq, flipped, 20.0).argmax_agreement < 0.2            # [N, T, C]
    prob_map = [rng.random(size=(1, 1, 32, 48))]                                     # a detector's map: no class
    assert check_output("m", prob_map, prob_map, 20.0).argmax_agreement is None
    seg = [rng.normal(size=(1, 3, 32, 48))]                                          # NCHW class map: channels
    swapped = [s[:, [1, 0, 2]] for s in seg]
    agree = check_output("g", seg, swapped, 20.0).argmax_agreement
    assert 0.2 < agree < 0.5                                                         # where class 2 wins
    nhwc = [rng.normal(size=(1, 32, 48, 3))]
    assert check_output("h", nhwc, nhwc, 20.0).argmax_agreement == 1.0


def test_image_bgr_gives_the_model_blue_green_red(tmp_path):
    from PIL import Image

    from modelexport.backends.ort_qnn.compile import media_options
    from modelexport.backends.spec import OnnxCompileOptions
    from modelexport.quant.media_calibration import MediaOptions, image_array
    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "red.png")
    rgb = image_array(tmp_path / "red.png", "x", (1, 3, 8, 8), np.float32, MediaOptions())
    opts = media_options(OnnxCompileOptions(image_bgr=True, image_mean="0.5,0.1,0.2"))
    bgr = image_array(tmp_path / "red.png", "x", (1, 3, 8, 8), np.float32, opts)
    assert rgb[0, :, 0, 0].tolist() == [1.0, 0.0, 0.0]
    np.testing.assert_allclose(bgr[0, :, 0, 0], [0 - 0.5, 0 - 0.1, 1 - 0.2], rtol=1e-6)   # mean in B, G, R order
    nhwc = image_array(tmp_path / "red.png", "x", (1, 8, 8, 3), np.float32, MediaOptions(bgr=True))
    assert nhwc[0, 0, 0].tolist() == [0.0, 0.0, 1.0]


def test_one_number_normalizes_every_channel_of_a_grayscale_image(tmp_path):
    """--image-std 0.00392157 gives a grayscale model trained on 0..255 pixels (afis's LEADER, NHWC with one
    channel) its range; a wrong count says what is wanted."""
    from PIL import Image

    from modelexport.backends.ort_qnn.compile import media_options
    from modelexport.backends.spec import OnnxCompileOptions
    from modelexport.core.errors import InputError
    from modelexport.quant.media_calibration import image_array
    Image.new("L", (8, 8), 255).save(tmp_path / "white.png")
    opts = media_options(OnnxCompileOptions(image_std="0.00392157"))
    gray = image_array(tmp_path / "white.png", "input", (1, 8, 8, 1), np.float32, opts)
    np.testing.assert_allclose(gray, 255.0, rtol=1e-5)
    with pytest.raises(InputError, match="three numbers R,G,B, or one for every channel"):
        media_options(OnnxCompileOptions(image_std="1,2"))


@pytest.mark.parametrize("dims, fix", [
    ({"atoms": ["num_atoms"], "edges": [2, "num_edges"]}, "atoms=NUM_ATOMS --input-shape edges=2,NUM_EDGES (replace NUM_ATOMS, NUM_EDGES by the sizes"),
    ({"a": ["unk__1", 3], "b": ["unk__2", 3]}, "a=N,3 --input-shape b=N,3 (replace N by the size"),   # tf2onnx's names
    ({"a": ["batch", 3], "b": ["batch"]}, "a=N,3 --input-shape b=N (replace N by the size"),
])
def test_the_fix_for_dynamic_inputs_names_each_dimension_to_give(tmp_path, dims, fix):
    """A graph model's inputs carry several symbolic sizes (caustic-nmr's PaiNN: num_atoms, num_edges,
    num_residues): the fix says which size goes where, not N everywhere."""
    import onnx
    from onnx import TensorProto, helper
    from modelexport.frontends.onnx_model import load_onnx
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in dims.items()]
    nodes = [helper.make_node("Identity", [n], [f"{n}_out"]) for n in dims]
    outs = [helper.make_tensor_value_info(f"{n}_out", TensorProto.FLOAT, s) for n, s in dims.items()]
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", ins, outs), opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(InputError) as e:
        load_onnx(str(path), {}).require_static()
    assert fix in e.value.in_words_of("cli").fix
