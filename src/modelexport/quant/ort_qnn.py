"""ONNX Runtime's QNN quantization helpers (`get_qnn_qdq_config`, `qnn_preprocess_model`), imported
without torch. Their package imports `onnxruntime.tools`, whose `__init__` imports torch whenever it
is installed, for a PyTorch helper (`infer_input_info`) the quantizer never calls: 2-3 CPU s and
~180 MB in every quantization worker of an LLM compile (SmolLM2: 2 workers), and in an ONNX compile.
"""
from __future__ import annotations

import sys
import types
from typing import Any

_TORCH_HELPERS = "onnxruntime.tools.pytorch_export_helpers"


def _no_torch_helpers(*_args, **_kwargs):
    raise RuntimeError(f"{_TORCH_HELPERS} was not imported (modelexport.quant.ort_qnn): import it directly")


def qnn_quantization() -> Any:
    """The module `onnxruntime.quantization.execution_providers.qnn`."""
    if "torch" not in sys.modules and _TORCH_HELPERS not in sys.modules:
        placeholder = types.ModuleType(_TORCH_HELPERS)
        placeholder.infer_input_info = _no_torch_helpers
        sys.modules[_TORCH_HELPERS] = placeholder
        try:
            import onnxruntime.tools  # noqa: F401  (its __init__ takes the placeholder)
        finally:
            if sys.modules.get(_TORCH_HELPERS) is placeholder:
                del sys.modules[_TORCH_HELPERS]     # a direct import later loads the real module
    from onnxruntime.quantization.execution_providers import qnn
    return qnn
