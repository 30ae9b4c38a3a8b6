"""What the real libraries print that reads like a failure but is not one — each line with its
source and the reason it is harmless. Only these exact messages are filtered, at their source (the
QNN EP's log on fd 2 around a session; ExecuTorch's Python logging around the quantizer); any
other line, every real error included, stays visible. MODELEXPORT_DEBUG=1, or QNN_LOG_LEVEL set to
INFO or more verbose, shows them again.
"""
from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from .native_io import filtered_stderr, native_stdout_to_stderr
from .qnn_log_level import LEVELS, requested


@dataclass(frozen=True)
class Note:
    pattern: re.Pattern
    source: str
    why: str


# Printed on fd 2 (red, "[E:onnxruntime:...]") by ONNX Runtime's QNN EP.
EP_LOG_NOTES = (
    Note(re.compile(r"CreateHtpPowerConfigId\] Failed to create HTP power config id"),
         "ONNX Runtime QNN EP, qnn_execution_provider.cc (CreateHtpPowerConfigId)",
         "at session start the EP asks the backend for an HTP power-config id (clock and voltage votes on a phone); "
         "backends without HTP power control — libQnnIr.so, which writes --format dlc, and the x86 HTP simulator — "
         "refuse it and the EP carries on without one: nothing compiled or computed depends on it"),
    Note(re.compile(r"# LIBNATIVE: No alternate configuration present in libnative_tls\.conf"),
         "libQnnHtp.so / libHtpPrepare.so (QAIRT), when the library is loaded",
         "the library looks for an optional thread-local-storage tuning file and, finding none, says it uses "
         "the default — the only configuration QAIRT documents"),
)

# Printed on fd 2 by ExecuTorch's CPU thread pool the first time it is sized.
THREADPOOL_NOTES = (
    Note(re.compile(r"^\[cpuinfo_utils\.cpp:\d+\] "),
         "ExecuTorch extension/threadpool/cpuinfo_utils.cpp (get_num_performant_cores)",
         "to count the big cores it reads ARM-only files (/sys/devices/soc0/image_version, the MIDR register); "
         "on x86 they do not exist, it says so line by line, and falls back to every core — which is what "
         "the CPU program should use here"),
)

# Logged through Python's root logger by ExecuTorch when a QnnQuantizer is built.
PYTHON_NOTES = (
    Note(re.compile(r"The backend_opinfo module couldn't be imported"),
         "executorch.backends.qualcomm.quantizer.backend_opinfo_adapter",
         "QnnQuantizer looks for the QNN SDK's Python op-info table (qti.aisw.converters.common.backend_opinfo), "
         "which the onnxruntime-qnn wheel does not ship; it then quantizes with its own built-in specs, and every "
         "quantized op is still checked by QNN's validator when it is lowered (audit, compile)"),
)


def _shown() -> bool:
    """The user asked for everything the libraries say."""
    level = requested()
    return bool(os.environ.get("MODELEXPORT_DEBUG")) or (level is not None and LEVELS[level][0] <= 1)


def is_note(line: str, notes: tuple[Note, ...] = EP_LOG_NOTES) -> bool:
    return any(n.pattern.search(line) for n in notes)


@contextmanager
def quiet_native_notes(notes: tuple[Note, ...] = EP_LOG_NOTES) -> Iterator[None]:
    """Around a native call (by default a QNN EP session's creation): its harmless fd-2 lines are not shown."""
    if _shown():
        yield
        return
    with filtered_stderr(lambda line: is_note(line, notes)):
        yield


@contextmanager
def quiet_library_load() -> Iterator[None]:
    """Around loading a QAIRT library (or a session that loads one): what it prints on fd 1 goes
    to stderr (`--json` keeps stdout), and its harmless lines (EP_LOG_NOTES) are not shown."""
    with quiet_native_notes(), native_stdout_to_stderr():
        yield


class _DropNotes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not is_note(record.getMessage(), PYTHON_NOTES)


@contextmanager
def quiet_python_notes() -> Iterator[None]:
    """Around ExecuTorch calls that log PYTHON_NOTES through the root logger."""
    if _shown():
        yield
        return
    f = _DropNotes()
    root = logging.getLogger()
    root.addFilter(f)
    try:
        yield
    finally:
        root.removeFilter(f)
