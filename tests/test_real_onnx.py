"""Real ONNX models shipped in PyPI packages (zoo/real_onnx.py): audit → compile → verify on the
HTP simulator, each showing one repair working on the model that needed it (issue 19).
The larger ones run in bench/real_models.py."""
from __future__ import annotations

import pytest

import modelexport
from modelexport.core.errors import InputError
from modelexport.zoo.real_onnx import REAL_ONNX, get, model_path, real_input


def _compile(tmp_path, name, precision, **kw):
    m = get(name)
    sample = real_input(m, next(iter(m.input_shapes)))
    return modelexport.compile(str(model_path(m)), output=tmp_path / f"{name}_{precision}", target="SM8650",
                               precision=precision, input_shapes=m.input_shapes,
                               calibration=[sample] if sample is not None else ("random" if precision != "fp16" else None),
                               use_cache=False, **kw)


def test_every_row_names_an_installed_file():
    for m in REAL_ONNX:
        assert model_path(m).stat().st_size > 10_000, m.name
    assert len(REAL_ONNX) >= 10 and len({m.kind for m in REAL_ONNX}) >= 10


def test_silero_vad_audit_names_the_if_and_the_flag():
    m = get("silero_vad")
    with pytest.raises(InputError) as e:
        modelexport.audit(str(model_path(m)), target="SM8650", input_shapes=m.input_shapes)
    assert "sr" in e.value.problem and "If" in e.value.problem
    # the fix in the Python API's words, as it was called (the CLI's: tests/test_onnx_repairs.py)
    assert 'input_values={"sr": VALUE}' in e.value.fix and "--input-value" not in e.value.fix
    assert "input_shapes" not in e.value.fix


def test_silero_vad_folded_compiles_at_8a8w_on_the_htp(tmp_path):
    m = get("silero_vad")
    b = _compile(tmp_path, "silero_vad", "8a8w", input_values=m.input_values)
    part = b.manifest.parts[0]
    assert {"name": "input-values", "values": {"sr": 16000}} in part.repairs
    assert any(r["name"] == "fold-control-flow" and r["control_flow_nodes"][1] == 0 for r in part.repairs)
    assert [i.name for i in part.inputs] == ["input", "state"]
    pl = b.manifest.placement[part.name]["SM8650"]
    assert pl["htp_nodes"] > 20 and not pl["cpu_fallbacks"]
    v = modelexport.verify(b.path).to_dict()
    assert v["graphs"][0]["outputs"][1]["sqnr_db"] > 5          # stateN; random audio, measured 12 dB


def test_mtcnn_opset12_quantizes_after_the_upgrade(tmp_path):
    """Per-channel QDQ of an opset-12 model did not load (DequantizeLinear axis); the real face verifies."""
    b = _compile(tmp_path, "mtcnn_onet", "8a8w")
    part = b.manifest.parts[0]
    assert any(r["name"] == "opset-upgrade" and r["to"] == 13 for r in part.repairs)
    assert not b.manifest.placement[part.name]["SM8650"]["cpu_fallbacks"]
    v = modelexport.verify(b.path).to_dict()
    assert v["graphs"][0]["inputs"].startswith("stored") and "random" not in v["graphs"][0]["inputs"]   # the real face
    assert min(o["sqnr_db"] for o in v["graphs"][0]["outputs"]) > 10


def test_ppocr_cls_fp16_verifies_on_real_text(tmp_path):
    b = _compile(tmp_path, "ppocr_cls", "fp16")
    part = b.manifest.parts[0]
    assert not b.manifest.placement[part.name]["SM8650"]["cpu_fallbacks"]
    v = modelexport.verify(b.path).to_dict()
    assert v["passed"] and v["graphs"][0]["inputs"].startswith("stored") and "random" not in v["graphs"][0]["inputs"]
