"""ExecuTorch QNN compile specs for a target SoC, with the QNN log level we need.

ExecuTorch's `generate_qnn_executorch_compiler_spec` offers log level error (default) or debug;
the audit wants warn, so that QNN's validator says why it refuses an op config. The spec is a
flatbuffer; it is decoded, the level changed, and encoded again.
"""
from __future__ import annotations

import logging

from ...toolchain.executorch_env import ensure_executorch_qnn
from ...toolchain.executorch_env.chipset import chipset
from ...core.targets import SoC
from ...toolchain.native_io import native_stdout_to_stderr
from ...toolchain.qnn_log_level import executorch_log_level

LOG_LEVELS = {"off": 0, "error": 1, "warn": 2, "info": 3, "verbose": 4, "debug": 5}


def compile_specs(soc: SoC, use_fp16: bool, log_level: str = "error", weight_sharing: bool = False,
                  from_context_binary: bool = False) -> list:
    from executorch.backends.qualcomm.serialization.qc_schema import QnnExecuTorchLogLevel
    from executorch.backends.qualcomm.serialization.qc_schema_serialize import (flatbuffer_to_option,
                                                                                option_to_flatbuffer)
    from executorch.backends.qualcomm.utils.constants import QCOM_QNN_COMPILE_SPEC
    from executorch.backends.qualcomm.utils.utils import (generate_htp_compiler_spec,
                                                          generate_qnn_executorch_compiler_spec)
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=chipset(soc),
        backend_options=generate_htp_compiler_spec(use_fp16=use_fp16, use_weight_sharing=weight_sharing),
        is_from_context_binary=from_context_binary)
    option = flatbuffer_to_option(specs[0].value)
    option.log_level = QnnExecuTorchLogLevel(LOG_LEVELS[executorch_log_level(log_level)])   # QNN_LOG_LEVEL
    return [CompileSpec(QCOM_QNN_COMPILE_SPEC, option_to_flatbuffer(option))]


def qnn_ready():
    """ensure_executorch_qnn() with its native banner kept off stdout (--json output stays clean),
    then ExecuTorch's Qualcomm modules imported without letting them reconfigure logging: one of
    them (_passes/convert_mha_to_sha.py) calls logging.basicConfig(level=INFO) at import, which
    would turn every library's INFO chatter on in the user's process."""
    with native_stdout_to_stderr():
        state = ensure_executorch_qnn()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    import executorch.backends.qualcomm._passes  # noqa: F401  (the import with the side effect)
    root.setLevel(level)
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    for name in ("executorch", "executorch.backends.qualcomm", "executorch.exir"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return state
