"""Inspectors for QNN artifacts: a raw context binary (.bin), an EPContext .onnx, a plain .onnx.

Binaries are read through the real libQnnSystem.so (modelexport.toolchain.qnn_context.reader), never by
scraping strings.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

from ...frontends.onnx_model import load_onnx
from ...inspection import inspector
from ...toolchain.native_io import native_stdout_to_stderr
from ...toolchain.qnn_context import extract_from_epcontext, find_epcontext_nodes, read_context_binary


def _binary_summary(info) -> dict:
    d = info.to_dict()
    d.pop("context_metadata_hex", None)
    return d


def _read_bin(path):
    with native_stdout_to_stderr():
        return read_context_binary(path)


def _epcontext_nodes(path: Path) -> bool:
    import onnx
    try:
        m = onnx.load(str(path), load_external_data=False)
    except Exception:
        return False
    return any(n.op_type == "EPContext" for n in m.graph.node)


@inspector("context-binary", lambda p: p.is_file() and p.suffix.lower() == ".bin")
def read_context_binary_file(path: Path) -> dict:
    return {"binary": _binary_summary(_read_bin(path))}


@inspector("epcontext-onnx", lambda p: p.is_file() and p.suffix.lower() == ".onnx" and _epcontext_nodes(p))
def read_epcontext_model(path: Path) -> dict:
    nodes = find_epcontext_nodes(path)
    with native_stdout_to_stderr():
        info = extract_from_epcontext(path)
    return {"epcontext_nodes": [asdict(n) for n in nodes], "binary": _binary_summary(info)}


@inspector("onnx-model", lambda p: p.is_file() and p.suffix.lower() == ".onnx")
def read_onnx_model(path: Path) -> dict:
    m = load_onnx(path, allow_dynamic=True)
    ops = Counter(n.op_type for n in m.model.graph.node)
    return {"sha256": m.sha256, "size": path.stat().st_size, "inputs": [i.to_dict() for i in m.inputs],
            "outputs": [o.to_dict() for o in m.outputs], "nodes": len(m.model.graph.node), "op_types": dict(ops.most_common()),
            "opset": {o.domain or "ai.onnx": o.version for o in m.model.opset_import},
            "dynamic_inputs": [i.name for i in m.dynamic_inputs]}
