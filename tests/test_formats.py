"""The bundle formats' table (core/formats.py): every entry point it names exists, each row's compile is
the backend registered under its name, and a bundle finds its row by its manifest's (format, kind)."""
from __future__ import annotations

import importlib
import json

import pytest

from modelexport.backends import BACKENDS
from modelexport.core.formats import ENTRY_POINTS, FORMATS, bundle_format
from modelexport.core.plugins import PLUGINS
from modelexport.core.vocab import BundleKind, Format
from modelexport.runtime.runners import format_row


@pytest.mark.parametrize("row", FORMATS, ids=lambda r: f"{r.format}/{r.kind}")
def test_every_entry_point_is_a_function(row):
    for name in ENTRY_POINTS:
        fn = row.entry(name)
        assert fn is None or callable(fn), f"{row.format}/{row.kind}.{name}"
    if row.inspect:
        importlib.import_module(row.inspect)


@pytest.mark.parametrize("row", FORMATS, ids=lambda r: f"{r.format}/{r.kind}")
def test_compile_is_the_registered_backend(row):
    be = BACKENDS.get(row.backend)
    assert be.compile is row.entry("compile") and row.format in be.formats


def test_one_row_per_format_and_kind():
    keys = [(r.format, r.kind) for r in FORMATS]
    assert len(keys) == len(set(keys))
    assert bundle_format(None, None) is bundle_format(Format.CONTEXT_BINARY, BundleKind.MODEL)
    assert bundle_format("onnx", BundleKind.MODEL) is None


def test_plugins_import_the_formats_modules():
    assert {r.compile.partition(":")[0] for r in FORMATS} == set(PLUGINS["backend"])
    assert {r.inspect for r in FORMATS if r.inspect} <= set(PLUGINS["inspector"])


@pytest.mark.parametrize("fields, key", [
    ({"format": "context-binary", "kind": "llm"}, (Format.CONTEXT_BINARY, BundleKind.LLM)),
    ({"format": "pte"}, (Format.PTE, BundleKind.MODEL)),
    ({"format": "dlc", "kind": "model"}, (Format.DLC, BundleKind.MODEL)),
    ({"format": "pte", "kind": "other"}, (Format.PTE, BundleKind.MODEL)),      # the format's model row
    ({"format": "other"}, (Format.CONTEXT_BINARY, BundleKind.MODEL)),          # the default
    (None, (Format.CONTEXT_BINARY, BundleKind.MODEL)),                          # no manifest: the default reports it
])
def test_a_bundle_finds_its_row(tmp_path, fields, key):
    if fields is not None:
        (tmp_path / "manifest.json").write_text(json.dumps(fields))
    assert format_row(tmp_path) is bundle_format(*key)


def test_a_retired_pair_is_refused_not_run_by_another_row(tmp_path):
    """An LLM .pte bundle (a manifest format no row writes any more) is refused with the fix, not handed
    to the model .pte's runner."""
    from modelexport.core.errors import InputError
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "pte", "kind": "llm"}))
    assert bundle_format(Format.PTE, BundleKind.LLM) is None
    with pytest.raises(InputError, match="does not run") as e:
        format_row(tmp_path)
    assert "--format pte" in e.value.fix


def test_an_entry_point_a_format_lacks_is_refused_with_what_it_offers():
    """A row that names no verify (a format that runs but cannot be checked yet) is one UnsupportedError,
    not `'NoneType' object is not callable`."""
    from modelexport.core.errors import UnsupportedError
    from modelexport.core.formats import BundleFormat
    from modelexport.runtime.runners import Entries
    row = BundleFormat("onnx-cpu", BundleKind.MODEL, "onnx_cpu", "modelexport.backends.ort_qnn.compile:compile_onnx",
                       run="modelexport.backends.ort_qnn.run:run_bundle")
    assert callable(Entries(row).run)
    with pytest.raises(UnsupportedError, match="have no `verify`") as e:
        _ = Entries(row).verify
    assert "run" in e.value.fix


def test_the_format_help_names_every_format_word():
    from modelexport.core.compile_flags import FORMAT_HELP
    for row in FORMATS:
        assert row.format in FORMAT_HELP
