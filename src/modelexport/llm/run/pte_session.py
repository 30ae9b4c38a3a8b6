"""An LLM `.pte` bundle's decoder methods as the generation loop's `Forward`s (`generate
--backend htp-sim`, `eval`, `verify`), at the stages the bundle keeps (`PTE_STAGES`):

    htp-sim     the host twin's program, loaded by the caller (ExecuTorch's runtime with the QNN
                delegate on the simulator, backends/llm_pte/session)
    fake-quant  ExecuTorch's QnnQuantizer's converted graph of each method (`.pt2`), on the CPU
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ...core.errors import InputError
from ..model.static_decoder import DecoderSpec


def _feed(input_ids, position_ids, attention_mask, caches) -> list[torch.Tensor]:
    """The methods' inputs as the program declares them: int32 ids and positions, float32 the rest."""
    def t(x, dtype):
        a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)
    return [t(input_ids, torch.int32), t(position_ids, torch.int32), t(attention_mask, torch.float32),
            *[t(c, torch.float32) for c in caches]]


class PteForward:
    """One decoder method: (input_ids, position_ids, attention_mask, *caches) → (logits, *new KV)."""

    def __init__(self, program, method: str):
        self.method = program.load_method(method)
        self.name = method
        self.calls = 0

    def __call__(self, input_ids, position_ids, attention_mask, *caches):
        self.calls += 1
        return tuple(self.method.execute(_feed(input_ids, position_ids, attention_mask, caches)))


class GraphForward:
    """One method's fake-quant graph (QnnQuantizer's converted GraphModule) on the CPU."""

    def __init__(self, module, name: str):
        self.module = module
        self.name = name
        self.calls = 0

    def __call__(self, input_ids, position_ids, attention_mask, *caches):
        self.calls += 1
        with torch.no_grad():
            return tuple(self.module(*_feed(input_ids, position_ids, attention_mask, caches)))


def load_fake_quant(path) -> torch.nn.Module:
    """A `.pt2` written by `quant.llm_pt2e.save_converted`: the quantize ops it calls are registered
    by torchao's modules, imported here so a fresh process can load it."""
    import torchao.quantization.pt2e  # noqa: F401  (quantized_decomposed ops)
    import torchao.quantization.quant_primitives  # noqa: F401  (torchao.dequantize_affine: the block weights)
    return torch.export.load(str(path)).module()


def _twin(bundle, prog, load_program) -> dict[str, Callable]:
    program = load_program(bundle.file(prog.host_twin))
    return {method: PteForward(program, method) for method in prog.decoder_methods}


def _fake_quant(bundle, prog, load_program) -> dict[str, Callable]:
    return {method: GraphForward(load_fake_quant(bundle.file(rel)), method) for method, rel in prog.fake_quant.items()}


@dataclass(frozen=True)
class PteStage:
    open: Callable           # (bundle, PteLlmProgram, load_program) → {method: Forward}
    kept: Callable           # PteLlmProgram → does the bundle keep what this stage runs
    why_not: str             # said when it does not


PTE_STAGES: dict[str, PteStage] = {
    "htp-sim": PteStage(_twin, lambda prog: True, ""),
    "fake-quant": PteStage(_fake_quant, lambda prog: bool(prog.fake_quant),
                           "the bundle keeps no fake-quant graphs: it was compiled before they were kept"),
}


def program_of(bundle, target: str | None = None):
    m = bundle.manifest
    target = target or m.targets[0]
    prog = (m.llm.pte if m.llm else {}).get(target)
    if prog is None:
        raise InputError(f"{bundle.path} has no .pte for {target}", f"its targets: {', '.join(m.targets)}")
    return prog


def compiled_stages(bundle) -> tuple[str, ...]:
    """The stages besides float that this `.pte` bundle can run."""
    prog = program_of(bundle)
    return tuple(s for s, row in PTE_STAGES.items() if row.kept(prog))


def stage_forwards(bundle, load_program, stage: str, target: str | None = None) -> dict[str, Callable]:
    """{method: Forward} at `stage`; a stage the bundle cannot run is said with the ones it can."""
    prog = program_of(bundle, target)
    row = PTE_STAGES.get(stage)
    if row is None or not row.kept(prog):
        can = [s for s, r in PTE_STAGES.items() if r.kept(prog)]
        why = f": {row.why_not}" if row is not None else ""
        raise InputError(f"the .pte LLM bundle {bundle.path} cannot run stage {stage!r}{why}; it runs "
                         f"{', '.join(['float', *can])}",
                         f"use --stages {','.join(['float', *can])}" + (
                             "" if row is None else ", or compile the model again with "
                             "`modelexport compile MODEL --format pte --force`"))
    return row.open(bundle, prog, load_program)


def pte_forwards(bundle, load_program, target: str | None = None,
                 stage: str = "htp-sim") -> tuple[dict[int, Callable], DecoderSpec, int]:
    """({N: Forward}, spec, max_seq_len) over the bundle's methods for `target` at `stage`."""
    prog = program_of(bundle, target)
    s = bundle.manifest.llm.spec
    spec = DecoderSpec(n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim,
                       hidden_size=s.hidden_size, vocab_size=s.vocab_size, max_seq_len=s.max_seq_len)
    forwards = stage_forwards(bundle, load_program, stage, target)
    return {prog.decoder_methods[m]: f for m, f in forwards.items()}, spec, s.max_seq_len


def pte_session(bundle, load_program, stage: str = "htp-sim"):
    """The generation loop's session over the bundle's methods at `stage`."""
    from .generate import StaticGraphSession
    graphs, spec, max_seq_len = pte_forwards(bundle, load_program, stage=stage)
    return StaticGraphSession(graphs, spec, max_seq_len, vocab_size=spec.vocab_size)
