"""gguf-py's `GGUFReader`, with its header parse made fast for large vocabularies.

The reader builds one numpy view per array element (a string element is two: its length and its
bytes), each sliced from a `np.memmap`, whose per-view bookkeeping dominates: Gemma 3's 262,144-token
vocabulary (tokens, scores, token types) took 20 s to parse, before any weight is read. This subclass
yields the same fields, parts and tensors (tests/test_gguf_reader.py compares them with the real
reader's on real files); it slices a plain view of the same mapping and walks arrays of fixed-size
items and of strings in one loop each. transformers' GGUF loader gets this reader too
(gguf_file._reuse_parsed_gguf), so a load parses the header once, fast.
"""
from __future__ import annotations

import struct

import gguf
import numpy as np
from gguf import GGUFValueType


class FastGGUFReader(gguf.GGUFReader):
    def _plain(self) -> np.ndarray:
        plain = self.__dict__.get("_plain_bytes")
        if plain is None:      # the same pages as self.data, without np.memmap's per-slice bookkeeping
            plain = self._plain_bytes = self.data.view(np.ndarray)
        return plain

    def _get(self, offset, dtype, count=1, override_order=None):
        count = int(count)
        dt = np.dtype(dtype)
        arr = self._plain()[offset:offset + dt.itemsize * count].view(dt)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs, raw_type):
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        n, offs = int(alen[0]), orig_offs + 12
        itype = GGUFValueType(raw_itype[0])
        nptype = self.gguf_scalar_to_np.get(itype)
        if n == 0 or (itype != GGUFValueType.STRING and nptype is None):
            return super()._get_field_parts(orig_offs, raw_type)   # empty or nested: as the reader does
        parts: list[np.ndarray] = [raw_itype, alen]
        if nptype is not None:                  # n items of one size: one read, one view per item
            whole = self._get(offs, nptype, n)
            parts += [whole[i:i + 1] for i in range(n)]
            return 12 + int(whole.nbytes), parts, list(range(2, 2 + n)), [GGUFValueType.ARRAY, itype]
        plain = self._plain()
        len_dtype = self._get(offs, np.uint64).dtype
        byte_dtype = self._get(offs, np.uint8, 0).dtype
        order = "<" if self.byte_order != "S" else ">"
        unpack = struct.Struct(f"{order}Q").unpack_from
        buf = memoryview(plain)
        idxs = []
        for _ in range(n):
            (length,) = unpack(buf, offs)
            parts.append(plain[offs:offs + 8].view(len_dtype))
            parts.append(plain[offs + 8:offs + 8 + length].view(byte_dtype))
            idxs.append(len(parts) - 1)
            offs += 8 + length
        return offs - orig_offs, parts, idxs, [GGUFValueType.ARRAY, GGUFValueType.STRING]
