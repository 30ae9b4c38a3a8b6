"""QNN context binaries, read through the real libQnnSystem.so (see reader.py, decode.py, structs.py)."""
from .decode import ContextBinaryInfo, DeviceInfo, GraphInfo, HtpGraphInfo, QuantInfo, TensorInfo
from .reader import (
    EpContextNode, extract_from_epcontext, find_epcontext_nodes, read_context_binary, system_library_info)

__all__ = [
    "ContextBinaryInfo", "DeviceInfo", "EpContextNode", "GraphInfo", "HtpGraphInfo", "QuantInfo",
    "TensorInfo", "extract_from_epcontext", "find_epcontext_nodes", "read_context_binary",
    "system_library_info",
]
