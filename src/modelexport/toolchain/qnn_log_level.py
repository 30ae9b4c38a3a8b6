"""QNN_LOG_LEVEL, the QNN SDK's variable (seed 004), honoured.

The QNN libraries here do not read it: whoever loads them sets their log level. ONNX Runtime's QNN
EP maps the session's log severity onto QNN's (`QnnBackendManager::MapOrtSeverityToQNNLogLevel`),
ExecuTorch passes its compile spec's `log_level`. So the variable is mapped onto those two; it
only ever makes the log more verbose than a verb's own choice (the audit's verbose log stays).
QNN's messages then go to stderr; --json output on stdout is unaffected.
"""
from __future__ import annotations

import os

from ..core.errors import InputError

ENV = "QNN_LOG_LEVEL"
# QNN_LOG_LEVEL value → (ONNX Runtime log severity, ExecuTorch QnnExecuTorchLogLevel name)
LEVELS = {"ERROR": (3, "error"), "WARN": (2, "warn"), "WARNING": (2, "warn"), "INFO": (1, "info"),
          "VERBOSE": (0, "verbose"), "DEBUG": (0, "debug")}
_ET_ORDER = ("off", "error", "warn", "info", "verbose", "debug")


def requested() -> str | None:
    """The level QNN_LOG_LEVEL names (upper case), or None when it is unset or empty."""
    value = os.environ.get(ENV, "").strip().upper()
    if not value:
        return None
    if value not in LEVELS:
        raise InputError(f"{ENV}={os.environ[ENV]} is not a QNN log level",
                         f"set it to one of {', '.join(LEVELS)}, or unset it")
    return value


def ort_severity(default: int) -> int:
    """The session log severity: the verb's own, or more verbose if QNN_LOG_LEVEL asks."""
    level = requested()
    return default if level is None else min(default, LEVELS[level][0])


def executorch_log_level(default: str) -> str:
    level = requested()
    if level is None:
        return default
    wanted = LEVELS[level][1]
    return max(default, wanted, key=_ET_ORDER.index)


def describe() -> str | None:
    """One sentence for the user saying what QNN_LOG_LEVEL was mapped to, or None when unset."""
    level = requested()
    if level is None:
        return None
    severity, et = LEVELS[level]
    return (f"{ENV}={level}: the QNN libraries take their log level from their loader here, so it is mapped to "
            f"ONNX Runtime's session log severity {severity} (the QNN EP sets QNN's log level from it; its most "
            f"verbose is QNN VERBOSE) and ExecuTorch's compile spec log_level {et}; QNN's messages go to stderr")
