"""Give the graphs of a QNN context binary the names a runtime looks them up by.

ExecuTorch's QNN delegate runs the graph whose name is the method's (`kv_forward`, `prefill_forward`);
ONNX Runtime's QNN EP names every graph `QNNExecutionProvider_QNNExecutionProvider_<hash>_<i>_0` and
takes no name. A graph name sits in the binary as length-prefixed strings (flatbuffer strings: a
little-endian uint32 length, the bytes, a NUL), the name alone or after a short prefix
(`PICKLE/256/<name>`). A shorter name is written in place: the length shrinks, the freed bytes
become NULs, nothing moves, so every offset in the binary still holds. The compiled graph is
untouched; the result is read back through libQnnSystem, and runs bit for bit as the original on the
simulator (tests/test_pte_runner.py).
"""
from __future__ import annotations

import re
import struct

from ...core.errors import InputError, VerificationError
from .reader import read_context_binary

_MAX_PREFIX = 64     # printable bytes before the name inside one string (`PICKLE/256/`)


def rename_graphs(blob: bytes, names: dict[str, str]) -> bytes:
    """The binary with each graph `old` of `names` renamed to `names[old]`; checked by reading it back."""
    before = {g.name for g in read_context_binary(blob).graphs}
    missing = sorted(set(names) - before)
    if missing:
        raise InputError(f"the context binary has no graph {missing[0]} (it has {sorted(before)})",
                         "rename the graphs the binary holds")
    out = bytearray(blob)
    for old, new in names.items():
        _rename_one(out, old, new)
    after = [g.name for g in read_context_binary(bytes(out)).graphs]
    want = sorted(names.get(n, n) for n in before)
    if sorted(after) != want:
        raise VerificationError(f"renamed graphs read back as {sorted(after)}, expected {want}",
                                "report this: the context binary's layout changed")
    return bytes(out)


def _rename_one(buf: bytearray, old: str, new: str) -> None:
    o, n = old.encode(), new.encode()
    if not n or len(n) > len(o) or b"\0" in n:
        raise InputError(f"cannot name graph {old!r} {new!r}: a new name is written in place, so it must be "
                         f"non-empty and at most {len(o)} bytes", "choose a shorter graph name")
    hits = [m.start() for m in re.finditer(re.escape(o), bytes(buf))]
    for at in hits:
        start = _string_start(buf, at)
        length = struct.unpack_from("<I", buf, start - 4)[0]
        if start + length != at + len(o) or buf[at + len(o)] != 0:
            raise VerificationError(f"graph name {old!r} found inside a longer string of the binary",
                                    "report this: the context binary's layout changed")
        text = bytes(buf[start:at]) + n
        struct.pack_into("<I", buf, start - 4, len(text))
        buf[start:start + length + 1] = text + b"\0" * (length + 1 - len(text))
    if not hits:
        raise VerificationError(f"graph name {old!r} not found in the binary's bytes",
                                "report this: the context binary's layout changed")


def _string_start(buf: bytearray, at: int) -> int:
    """Where the length-prefixed string holding the name at `at` begins: the name itself, or a short
    printable prefix before it whose length field matches."""
    for start in range(at, max(at - _MAX_PREFIX, 4) - 1, -1):
        if start < at and not 32 <= buf[start] < 127:
            break
        length = struct.unpack_from("<I", buf, start - 4)[0]
        if start + length >= at and length < (1 << 20):
            return start
    raise VerificationError("a graph name in the binary has no length prefix",
                            "report this: the context binary's layout changed")
