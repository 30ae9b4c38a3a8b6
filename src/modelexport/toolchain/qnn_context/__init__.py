"""QNN context binaries, read through the real libQnnSystem.so (see reader.py, structs.py)."""
from .reader import (
    ContextBinaryInfo, DeviceInfo, EpContextNode, GraphInfo, HtpGraphInfo, QuantInfo, TensorInfo,
    extract_from_epcontext, find_epcontext_nodes, read_context_binary, system_library_info)

__all__ = [
    "ContextBinaryInfo", "DeviceInfo", "EpContextNode", "GraphInfo", "HtpGraphInfo", "QuantInfo",
    "TensorInfo", "extract_from_epcontext", "find_epcontext_nodes", "read_context_binary",
    "system_library_info",
]
