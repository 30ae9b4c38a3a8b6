"""The host twin of an LLM `.pte` bundle on the x86 HTP simulator through ExecuTorch's runtime
(the weight-shared program is never loaded here: the simulator cannot run it)."""
from __future__ import annotations

from pathlib import Path

from ...core.errors import ToolchainError, clip
from ...core.vocab import Format
from ...llm.pte_session import pte_session
from ..llm_qnn.session import COMPILED_SESSIONS


def load_program(source: bytes | Path):
    from ...toolchain.native_io import native_stdout_to_stderr
    from ..executorch_qnn.specs import qnn_ready
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


# a .pte LLM bundle's session for `generate --backend htp-sim` and `eval`
COMPILED_SESSIONS[Format.PTE] = open_pte_session
