"""Read an ExecuTorch `.pte` through ExecuTorch's own flatbuffer schema, and inspect it.

What a .pte holds: the extended header (flatbuffer size, where segments start), the program's
methods (execution plans) with their inputs and outputs, the delegates each calls (backend id,
where its blob lives), the segments (absolute offsets, sizes, alignment) and the instructions
(delegate calls vs portable kernel calls). For every QnnBackend delegate the blob is
ExecuTorch's QnnContextCustomProtocol: a 256-byte header (magic 0x5678ABCD, a signature, the
binary size) followed by the QNN context binary, which is read through the real libQnnSystem.so
(qnn_context.read_context_binary) for its target, HTP arch and QAIRT build.
"""
from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from ...contract.bundle import is_bundle
from ...core.errors import InputError
from ...core.vocab import Format, Role
from ...inspection import inspector
from ...inspection.bundle_inspector import read_bundle
from ...toolchain.native_io import native_stdout_to_stderr
from ...toolchain.qnn_context import read_context_binary

PTE_MAGIC_OFFSET = 4                    # "ET12" etc. at bytes 4..8 of a flatbuffer with file identifier
QNN_PROTOCOL_MAGIC = 0x5678ABCD
QNN_PROTOCOL_HEADER = 256               # QNN_CTX_BIN_ALIGNMENT in executorch's QnnCustomProtocol.h
_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
           11: "bool", 15: "bfloat16", 27: "uint16", 28: "uint32", 29: "uint64"}


def is_pte(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(8)
    return len(head) == 8 and head[4:6] == b"ET"


def _alignment(offset: int, cap: int = 1 << 20) -> int:
    """The largest power of two (≤ cap) dividing `offset`."""
    if offset == 0:
        return cap
    a = offset & -offset
    return min(a, cap)


def strip_qnn_protocol(blob: bytes) -> tuple[bytes, dict]:
    """ExecuTorch's QnnContextCustomProtocol → (QNN context binary, header fields)."""
    if len(blob) < QNN_PROTOCOL_HEADER:
        raise InputError("a QnnBackend delegate blob is shorter than its 256-byte header", "rebuild the .pte")
    magic, signature, size = struct.unpack_from("<Iqq", blob, 0)
    if magic != QNN_PROTOCOL_MAGIC:
        return blob, {"protocol": None}                # a bare context binary (older executorch)
    binary = blob[QNN_PROTOCOL_HEADER:QNN_PROTOCOL_HEADER + size]
    if len(binary) != size:
        raise InputError(f"a QnnBackend delegate says its binary has {size} bytes; {len(binary)} are present",
                         "the .pte is truncated: rebuild it")
    return binary, {"protocol": "QnnContextCustomProtocol", "signature": signature, "header_bytes": QNN_PROTOCOL_HEADER,
                    "binary_bytes": size}


def _tensor(v) -> dict | None:
    t = getattr(v.val, "sizes", None)
    if t is None:
        return {"kind": type(v.val).__name__}
    return {"kind": "Tensor", "dtype": _DTYPES.get(int(v.val.scalar_type), str(v.val.scalar_type)), "shape": list(v.val.sizes)}


def read_pte(data: bytes, read_binaries: bool = True) -> dict[str, Any]:
    """A plain dict describing the program (the `inspect --json` shape)."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header
    from executorch.exir.schema import DataLocation, DelegateCall, KernelCall
    eh = _get_extended_header(data)
    program_size = eh.program_size if eh else len(data)
    base = eh.segment_base_offset if eh else 0
    try:
        program = _flatbuffer_to_program(data[:program_size])
        if program.segments is None or program.execution_plan is None:   # bytes that decode to no program
            raise ValueError("no execution plan")
    except Exception as e:  # flatc/flatbuffers raise various types for garbage
        raise InputError(f"not a readable ExecuTorch program: {type(e).__name__}: {str(e)[:200]}",
                         "give a .pte written by ExecuTorch (to_executorch().write_to_file)") from None
    segments = [{"index": i, "offset": base + s.offset, "size": s.size, "alignment": _alignment(base + s.offset)}
                for i, s in enumerate(program.segments)]
    out: dict[str, Any] = {
        "size": len(data), "program_version": program.version,
        "header": {"program_size": program_size, "segment_base_offset": base,
                   "segment_data_size": eh.segment_data_size if eh else 0} if eh else None,
        "segments": segments,
        "segment_alignment": min((s["alignment"] for s in segments), default=None),
        "constant_buffers": len(program.constant_buffer),
        "methods": [], "delegates": [], "qnn_binaries": [],
    }
    for plan in program.execution_plan:
        calls = Counter()
        kernels = Counter()
        for chain in plan.chains:
            for ins in chain.instructions:
                a = ins.instr_args
                if isinstance(a, DelegateCall):
                    calls[plan.delegates[a.delegate_index].id] += 1
                elif isinstance(a, KernelCall):
                    op = plan.operators[a.op_index]
                    kernels[op.name + (f".{op.overload}" if op.overload else "")] += 1
        method = {"name": plan.name,
                  "inputs": [_tensor(plan.values[i]) for i in plan.inputs],
                  "outputs": [_tensor(plan.values[i]) for i in plan.outputs],
                  "delegate_calls": dict(calls), "kernel_calls": dict(kernels),
                  "delegates": []}
        total = sum(calls.values()) + sum(kernels.values())
        method["delegated_instruction_share"] = round(sum(calls.values()) / total, 4) if total else None
        for di, d in enumerate(plan.delegates):
            loc = d.processed.location
            entry: dict[str, Any] = {"method": plan.name, "index": di, "backend_id": d.id,
                                     "location": "segment" if loc == DataLocation.SEGMENT else "inline",
                                     "compile_specs": [c.key for c in d.compile_specs]}
            if loc == DataLocation.SEGMENT:
                seg = segments[d.processed.index]
                entry |= {"segment": d.processed.index, "offset": seg["offset"], "size": seg["size"],
                          "alignment": seg["alignment"]}
                blob = data[seg["offset"]:seg["offset"] + seg["size"]]
            else:
                blob = bytes(program.backend_delegate_data[d.processed.index].data)
                entry |= {"size": len(blob)}
            if d.id == "QnnBackend" and read_binaries:
                binary, proto = strip_qnn_protocol(blob)
                entry["qnn"] = proto | {"context_binary": qnn_binary_summary(binary)}
                out["qnn_binaries"].append(entry["qnn"]["context_binary"])
            method["delegates"].append(di)
            out["delegates"].append(entry)
        out["methods"].append(method)
    return out


def qnn_binary_summary(binary: bytes) -> dict:
    with native_stdout_to_stderr():
        info = read_context_binary(binary)
    d = info.to_dict()
    d.pop("context_metadata_hex", None)
    return d


def qnn_binaries(data: bytes) -> list[tuple[str, bytes]]:
    """(method name, QNN context binary) for every QnnBackend delegate of a .pte."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    program = deserialize_pte_binary(data).program
    out = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            if d.id == "QnnBackend":
                out.append((plan.name, strip_qnn_protocol(bytes(program.backend_delegate_data[d.processed.index].data))[0]))
    return out


@inspector("pte", is_pte)
def read_pte_file(path: Path) -> dict:
    return {"pte": read_pte(path.read_bytes())}


def _is_pte_bundle(path: Path) -> bool:
    if not is_bundle(path):
        return False
    try:
        m = json.loads((path / "manifest.json").read_text())
        return isinstance(m, dict) and m.get("format") == Format.PTE
    except (OSError, ValueError):
        return False


@inspector("pte-bundle", _is_pte_bundle, first=True)
def read_pte_bundle(path: Path) -> dict:
    info = read_bundle(path)
    m = info["manifest"]
    ptes = {}
    for f in m.get("files", []):
        if f.get("role") == Role.PTE and (path / f["path"]).is_file():
            ptes[f["path"]] = read_pte((path / f["path"]).read_bytes())
    return info | {"ptes": ptes, "placement_summary": (m.get("placement") or {}).get("summary")}
