"""ExecuTorch's Qualcomm backend on the QAIRT libraries at hand (the onnxruntime-qnn wheel's 2.51
through a small ABI adapter, or a user's own 2.37 SDK directly). See adapter.py for why."""
from .adapter import AdapterBuild, build_adapter, cache_dir, is_adapter_sdk_root, read_build_id
from .environment import AdapterState, current_state, ensure_executorch_qnn, load_adapter_first, loaded_by_name
from .status import adapter_status

__all__ = [
    "AdapterBuild", "AdapterState", "adapter_status", "build_adapter", "cache_dir", "current_state",
    "ensure_executorch_qnn", "is_adapter_sdk_root", "load_adapter_first", "loaded_by_name",
    "read_build_id",
]
