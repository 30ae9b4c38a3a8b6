"""The host twin of an LLM `.pte` bundle on the x86 HTP simulator through ExecuTorch's runtime
(the weight-shared program is never loaded here: the simulator cannot run it). Its row in
core/formats.py names `open_pte_session` (generate --backend htp-sim), `open_forwards` and
`stage_why_not` (eval)."""
from __future__ import annotations

from pathlib import Path

from ...core.errors import ToolchainError, clip
from ...llm.run.pte_session import PTE_STAGES, pte_forwards, pte_session
from ...toolchain.native_io import native_stdout_to_stderr
from ..executorch_qnn.specs import qnn_ready


def load_program(source: bytes | Path):
    qnn_ready()
    from executorch.runtime import Runtime
    try:
        with native_stdout_to_stderr():
            return Runtime.get().load_program(source if isinstance(source, bytes) else str(source))
    except Exception as e:
        raise ToolchainError(f"ExecuTorch's runtime could not load the host twin: {clip(str(e), 800)}",
                             "recompile the bundle (modelexport compile MODEL --format pte --force)") from None


def open_pte_session(bundle, stage: str = "htp-sim"):
    return pte_session(bundle, load_program, stage)


def open_forwards(bundle, stage: str):
    """({N: Forward}, spec, max_seq_len) of the bundle's methods at `stage` (eval)."""
    return pte_forwards(bundle, load_program, stage=stage)


def stage_why_not(stage: str) -> str:
    """Why a `.pte` bundle may lack a compiled stage ("" when any bundle has it)."""
    row = PTE_STAGES.get(stage)
    return row.why_not if row else ""
