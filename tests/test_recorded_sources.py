"""Steps that re-read a bundle's source model or calibration text by its recorded path (eval's float
stage, verify --per-layer, generate --backend cpu on a bundle) check it is still what compile read."""
import pytest

from modelexport.contract.manifest import Manifest, SourceModel
from modelexport.core.errors import InputError, IntegrityError
from modelexport.frontends.source_hash import recorded_source, source_sha256
from modelexport.llm.run.text import read_text, recorded_text

PROSE = " ".join(["The quick brown fox jumps over the lazy dog while the cat sleeps."] * 10)


def _manifest(src, text=None):
    m = Manifest(source=SourceModel(path=str(src), sha256=source_sha256(src), format="hf-folder"))
    if text is not None:
        m.calibration = {"llm": {"text": str(text), "sha256": read_text(text).sha256}}
    return m


def test_a_changed_or_missing_source_folder_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    m = _manifest(folder)
    assert recorded_source(m, "the float stage") == folder
    (folder / "model.safetensors").write_bytes(b"\1" * 65)
    with pytest.raises(IntegrityError, match="changed since it was compiled") as e:
        recorded_source(m, "the float stage")
    assert "recompile" in e.value.fix
    (folder / "model.safetensors").unlink()
    (folder / "config.json").unlink()
    folder.rmdir()
    with pytest.raises(InputError, match="is gone: the float stage needs the float model"):
        recorded_source(m, "the float stage")


def test_a_changed_calibration_text_is_refused(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    text = tmp_path / "calib.txt"
    text.write_text(PROSE)
    m = _manifest(gguf, text)
    assert recorded_text(m, "per-layer numerics").text == PROSE
    text.write_text(PROSE + " And then it rained.")
    with pytest.raises(IntegrityError, match="calibration text .* changed since it was compiled"):
        recorded_text(m, "per-layer numerics")
