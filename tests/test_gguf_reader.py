"""The fast GGUF header parse (frontends/gguf_reader.py) gives what gguf-py's own reader gives:
every field with its parts, indices and types, and every tensor, on the real SmolLM2 file and on a
file with every kind of array (strings, numbers, empty, nested) written by gguf-py's writer."""
from __future__ import annotations

import numpy as np
import pytest


def _same(path):
    import gguf
    from modelexport.frontends.gguf_reader import FastGGUFReader
    real, fast = gguf.GGUFReader(str(path)), FastGGUFReader(str(path))
    assert list(fast.fields) == list(real.fields)
    for key, want in real.fields.items():
        got = fast.fields[key]
        assert (got.offset, got.data, got.types, len(got.parts)) == (want.offset, want.data, want.types, len(want.parts)), key
        for a, b in zip(got.parts, want.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), key
        assert got.contents() == want.contents(), key
    assert [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset) for t in fast.tensors] == \
        [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset) for t in real.tensors]
    for a, b in zip(fast.tensors, real.tensors):
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    return fast


def test_same_as_gguf_py_on_the_real_smollm2_file(smollm2_gguf):
    fast = _same(smollm2_gguf)
    assert len(fast.fields["tokenizer.ggml.tokens"].data) == 49152


def test_same_as_gguf_py_on_every_kind_of_array(tmp_path):
    import gguf
    path = tmp_path / "arrays.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("t.strings", ["a", "", "ü€", "x" * 300])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False])
    w.add_array("t.empty", [])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_string("t.scalar", "plain")
    w.add_uint32("t.u32", 7)
    w.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fast = _same(path)
    assert fast.fields["t.strings"].contents() == ["a", "", "ü€", "x" * 300]
