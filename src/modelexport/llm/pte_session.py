"""An LLM `.pte` bundle's decoder methods as the generation loop's `Forward`s (`generate
--backend htp-sim`, `eval`): the host twin's program, loaded by the caller (ExecuTorch's runtime
with the QNN delegate on the simulator, backends/llm_pte/session)."""
from __future__ import annotations

import numpy as np
import torch

from ..core.errors import InputError
from .static_decoder import DecoderSpec


class PteForward:
    """One decoder method: (input_ids, position_ids, attention_mask, *caches) → (logits, *new KV)."""

    def __init__(self, program, method: str):
        self.method = program.load_method(method)
        self.name = method
        self.calls = 0

    def __call__(self, input_ids, position_ids, attention_mask, *caches):
        def t(x, dtype):
            a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)
        feed = [t(input_ids, torch.int32), t(position_ids, torch.int32), t(attention_mask, torch.float32),
                *[t(c, torch.float32) for c in caches]]
        self.calls += 1
        return tuple(self.method.execute(feed))


def pte_forwards(bundle, load_program, target: str | None = None) -> tuple[dict[int, PteForward], DecoderSpec, int]:
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


def twin_sqnr(program, decoders: dict) -> dict[str, float]:
    """{method: SQNR dB} of each method's logits vs its float decoder; `decoders`: {method: (decoder, sample)}."""
    from ..core.numerics import sqnr_db
    out = {}
    for method, (dec, sample) in decoders.items():
        feed = [torch.from_numpy(sample[k]) for k in dec.input_names()]
        got = PteForward(program, method)(*feed)
        with torch.inference_mode():
            ref = dec(*feed)
        out[method] = round(float(sqnr_db(ref[0].float().numpy(), got[0].float().numpy())), 2)
    return out


def pte_session(bundle, load_program, stage: str = "htp-sim"):
    """The generation loop's session over the twin (the only stage a `.pte` bundle has: htp-sim)."""
    from .generate import StaticGraphSession
    if stage != "htp-sim":
        raise InputError(f"a .pte LLM bundle runs at stage htp-sim only, not {stage!r}",
                         "use --stages float,htp-sim (the QDQ stage is the context-binary bundle's: compile without --format pte)")
    graphs, spec, max_seq_len = pte_forwards(bundle, load_program)
    return StaticGraphSession(graphs, spec, max_seq_len, vocab_size=spec.vocab_size)
