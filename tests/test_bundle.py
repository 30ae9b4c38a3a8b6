import json
from pathlib import Path

import pytest

from conftest import assert_clean_error
from modelexport.contract import BundleWriter, GraphSpec, TensorSpec, open_bundle
from modelexport.core.atomic import atomic_file
from modelexport.core.errors import IntegrityError, OutputExistsError
from modelexport.core.vocab import GraphKind


def _write(out, force=False, payload=b"abc"):
    with BundleWriter(out, force=force) as w:
        w.path("model.bin").write_bytes(payload)
        w.manifest.targets = ["SM8650"]
        w.manifest.graphs = [GraphSpec(name="g", file="model.bin", kind=GraphKind.CONTEXT_BINARY,
                                       inputs=[TensorSpec(name="x", shape=[1, 3], dtype="float32")])]
    return out


def test_bundle_round_trip_with_hashes(tmp_path):
    out = _write(tmp_path / "b")
    b = open_bundle(out)
    assert [f.path for f in b.manifest.files] == ["model.bin", "report.html"]
    assert b.manifest.files[0].size == 3 and len(b.manifest.files[0].sha256) == 64
    assert b.manifest.versions["torch"].startswith("2.13.0")
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no temp folders left


def test_failure_mid_write_leaves_no_bundle(tmp_path):
    out = tmp_path / "b"
    with pytest.raises(RuntimeError):
        with BundleWriter(out) as w:
            w.path("part.bin").write_bytes(b"half")
            raise RuntimeError("compiler crashed")
    assert list(tmp_path.iterdir()) == []


def test_failure_with_force_keeps_the_old_bundle(tmp_path):
    out = _write(tmp_path / "b", payload=b"old")
    with pytest.raises(RuntimeError):
        with BundleWriter(out, force=True) as w:
            w.path("model.bin").write_bytes(b"new")
            raise RuntimeError("boom")
    assert (out / "model.bin").read_bytes() == b"old"
    _write(out, force=True, payload=b"new")
    assert (out / "model.bin").read_bytes() == b"new" and len(list(tmp_path.iterdir())) == 1


def test_existing_output_needs_force(tmp_path):
    out = _write(tmp_path / "b")
    with pytest.raises(OutputExistsError, match="--force"):
        BundleWriter(out)
    with pytest.raises(OutputExistsError):
        with atomic_file(out / "model.bin"):
            pass


def test_tampered_and_truncated_files_are_reported(tmp_path, cli_here):
    out = _write(tmp_path / "b", payload=b"abcdef")
    assert cli_here("inspect", str(out)).returncode == 0
    (out / "model.bin").write_bytes(b"abcdeX")
    with pytest.raises(IntegrityError, match="sha256"):
        open_bundle(out)
    assert_clean_error(cli_here("inspect", str(out)), "sha256")
    (out / "model.bin").write_bytes(b"abc")
    proc = cli_here("inspect", str(out), "--json")
    info = json.loads(proc.stdout)
    assert proc.returncode == 4 and "truncated" in info["integrity"]["problems"][0]
    (out / "model.bin").unlink()
    assert_clean_error(cli_here("inspect", str(out)), "missing")


def test_inspect_missing_and_foreign_paths(tmp_path, cli_here):
    assert_clean_error(cli_here("inspect", str(tmp_path / "nothing")), "does not exist")
    (tmp_path / "notes.txt").write_text("hello")
    assert_clean_error(cli_here("inspect", str(tmp_path / "notes.txt")), "not an artifact")


def _tamper(out, edit):
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("where", ["file-entry", "graph-file"])
@pytest.mark.parametrize("escape", ["../../../../etc/passwd", "/etc/passwd"])
def test_a_manifest_naming_a_file_outside_the_bundle_is_refused(tmp_path, cli_here, where, escape):
    import os

    from modelexport.core.files import sha256_file
    out = _write(tmp_path / "b")
    outside = {"path": escape, "size": os.stat("/etc/passwd").st_size, "sha256": sha256_file("/etc/passwd")}

    def edit(data):
        if where == "file-entry":     # with the outside file's real size and sha256: still refused
            data["files"].append(outside)
        else:
            data["graphs"][0]["file"] = escape
    _tamper(out, edit)
    with pytest.raises(IntegrityError, match="not a path inside the bundle"):
        open_bundle(out)
    proc = cli_here("inspect", str(out), "--json")
    assert_clean_error(proc, "not a path inside the bundle", "rebuild the bundle")
    assert proc.returncode == 4 and "root:" not in proc.stdout


def test_a_link_out_of_the_bundle_is_refused(tmp_path):
    import os

    from modelexport.core.files import sha256_file
    out = _write(tmp_path / "b")
    (out / "model.bin").unlink()
    os.symlink("/etc/passwd", out / "model.bin")
    _tamper(out, lambda d: d["files"][0].update(size=os.stat("/etc/passwd").st_size, sha256=sha256_file("/etc/passwd")))
    with pytest.raises(IntegrityError, match="leads outside the bundle"):
        open_bundle(out)
    b = open_bundle(out, verify=False)
    with pytest.raises(IntegrityError, match="leads outside the bundle"):
        b.file("model.bin")


def test_an_unwritable_output_is_refused_before_any_work(tmp_path, cli_here):
    from modelexport.core.atomic import check_output
    from modelexport.core.errors import InputError
    with pytest.raises(InputError, match="not writable"):
        check_output(Path("/proc/modelexport-out/bundle"), force=False)   # /proc takes no new files, even as root
    check_output(tmp_path / "new" / "deeper" / "bundle", force=False)      # missing folders are made later
    proc = cli_here("compile", str(tmp_path / "m.onnx"), "-o", "/proc/modelexport-out")
    assert_clean_error(proc, "not writable", "choose an output path")
    assert proc.returncode == 2
