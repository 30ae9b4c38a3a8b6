"""Run an LLM `.pte` bundle's host twin on the x86 HTP simulator through ExecuTorch's runtime:
a `Forward` per decoder method for the generation loop (`generate --backend htp-sim`), `verify`
and `eval`. The weight-shared program is never loaded here: the simulator cannot run it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...core.errors import InputError, ToolchainError, clip
from ...llm.static_decoder import DecoderSpec


def load_program(source: bytes | Path):
    """An ExecuTorch Program (QnnBackend on the simulator, through the ABI adapter)."""
    from ..executorch_qnn.specs import qnn_ready
    qnn_ready()
    from executorch.runtime import Runtime
    from ...toolchain.native_io import native_stdout_to_stderr
    try:
        with native_stdout_to_stderr():
            return Runtime.get().load_program(source if isinstance(source, bytes) else str(source))
    except Exception as e:
        raise ToolchainError(f"ExecuTorch's runtime could not load the host twin: {clip(str(e), 800)}",
                             "recompile the bundle (modelexport compile MODEL --format pte)") from None


class PteForward:
    """One decoder method of the twin as the generation loop's `Forward`."""

    def __init__(self, program, method: str):
        from ...toolchain.native_io import native_stdout_to_stderr
        with native_stdout_to_stderr():
            self.method = program.load_method(method)
        self.name = method
        self.calls = 0

    def __call__(self, input_ids, position_ids, attention_mask, *caches):
        def t(x, dtype):
            return torch.as_tensor(np.ascontiguousarray(x.detach().cpu().numpy() if isinstance(x, torch.Tensor)
                                                        else np.asarray(x)), dtype=dtype)
        feed = [t(input_ids, torch.int32), t(position_ids, torch.int32), t(attention_mask, torch.float32),
                *[t(c, torch.float32) for c in caches]]
        self.calls += 1
        return tuple(self.method.execute(feed))


def open_pte_forwards(bundle, target: str | None = None) -> tuple[dict[int, PteForward], DecoderSpec, int]:
    """({N: Forward}, spec, max_seq_len) over the bundle's host twin for `target`."""
    m = bundle.manifest
    target = target or m.targets[0]
    prog = (m.llm.pte if m.llm else {}).get(target)
    if prog is None:
        raise InputError(f"{bundle.path} has no .pte for {target}", f"its targets: {', '.join(m.targets)}")
    s = m.llm.spec
    spec = DecoderSpec(n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim,
                       hidden_size=s.hidden_size, vocab_size=s.vocab_size, max_seq_len=s.max_seq_len)
    program = load_program(bundle.file(prog.host_twin))
    return {n: PteForward(program, method) for method, n in prog.decoder_methods.items()}, spec, s.max_seq_len


def open_pte_session(bundle, stage: str = "htp-sim"):
    from ...llm.generate import StaticGraphSession
    if stage != "htp-sim":
        raise InputError(f"a .pte LLM bundle runs at stage htp-sim only, not {stage!r}",
                         "use --stages float,htp-sim (its QDQ stage is the ONNX path's: compile without --format pte)")
    graphs, spec, max_seq_len = open_pte_forwards(bundle)
    return StaticGraphSession(graphs, spec, max_seq_len, vocab_size=spec.vocab_size)


def _register() -> None:
    from ...core.vocab import Format
    from ..llm_qnn.session import COMPILED_SESSIONS
    COMPILED_SESSIONS[Format.PTE] = open_pte_session


_register()
