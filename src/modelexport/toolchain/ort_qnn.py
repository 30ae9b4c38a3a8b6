"""ONNX Runtime's QNN execution provider, registered the way that really runs on HTP.

The plugin EP must be registered as a library and attached to the session through its
device (`add_provider_for_devices`). The old `providers=[...]` spelling silently runs every
node on CPU, so every session made here records which EP took which node and callers check it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import onnxruntime_qnn
except ImportError:   # a broken install: said as a ToolchainError where its libraries are needed
    onnxruntime_qnn = None

from ..core.errors import ToolchainError
from .library_notes import quiet_library_load
from .qnn_log_level import ort_severity
from .qairt import claim_libqnnhtp_name

EP_NAME = "QNNExecutionProvider"
CPU_EP_NAME = "CPUExecutionProvider"


@functools.lru_cache(maxsize=1)
def register_qnn_ep() -> str:
    """Register the onnxruntime-qnn plugin library once per process; returns the EP name."""
    import onnxruntime as ort

    claim_libqnnhtp_name()
    if onnxruntime_qnn is None:
        raise ToolchainError("onnxruntime-qnn is not installed", "run `make setup`")
    try:
        with quiet_library_load():
            ort.register_execution_provider_library(onnxruntime_qnn.EP_NAME, onnxruntime_qnn.get_library_path())
    except Exception as e:  # already registered in this process by someone else is fine
        if "already" not in str(e).lower():
            raise ToolchainError(f"ONNX Runtime refused the QNN EP plugin: {e}",
                                 "onnxruntime and onnxruntime-qnn must fit together (1.32.0 + 2.7.0); run `make setup`") from None
    return onnxruntime_qnn.EP_NAME


def qnn_devices() -> list:
    import onnxruntime as ort
    name = register_qnn_ep()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == name]
    if not devices:
        raise ToolchainError("the QNN EP is registered but offers no device",
                             "reinstall onnxruntime-qnn (make setup)")
    return devices


@dataclass
class SessionPlan:
    """What to ask of a session: provider options, session config entries, logging."""
    provider_options: dict[str, str] = field(default_factory=dict)
    config_entries: dict[str, str] = field(default_factory=dict)
    log_severity: int = 3
    disable_cpu_fallback: bool = False


def session_options(plan: SessionPlan):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = ort_severity(plan.log_severity)   # QNN_LOG_LEVEL can ask for more
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if plan.disable_cpu_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in plan.config_entries.items():
        so.add_session_config_entry(k, str(v))
    opts = {"backend_type": "htp"} | {k: str(v) for k, v in plan.provider_options.items()}
    so.add_provider_for_devices(qnn_devices(), opts)
    return so


def create_session(model: str | Path | bytes, plan: SessionPlan):
    """An InferenceSession with the QNN EP first and CPU as fallback."""
    import onnxruntime as ort
    so = session_options(plan)
    src = model if isinstance(model, bytes) else str(model)
    with quiet_library_load():
        session = ort.InferenceSession(src, sess_options=so)
    # A graph the QNN EP fails to execute raises its own error. ONNX Runtime's Python session would
    # otherwise retry on the CPU EP alone, which cannot load an EPContext node, and raise that instead.
    session.disable_fallback()
    return session


def node_assignment(session) -> dict[str, list[tuple[str, str]]]:
    """{ep name: [(node name, op type), ...]} as the session reports it."""
    out: dict[str, list[tuple[str, str]]] = {}
    for sub in session.get_provider_graph_assignment_info():
        ep = sub.ep_name
        out.setdefault(ep, []).extend((n.name, n.op_type) for n in sub.get_nodes())
    return out


def provider_options_for_target(soc_model: int, **extra: Any) -> dict[str, str]:
    return {"soc_model": str(soc_model)} | {k: str(v) for k, v in extra.items() if v is not None}
