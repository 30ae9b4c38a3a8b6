"""How far an LLM `.pte` bundle's decoder methods are from float, stage by stage, on the same samples.

    float       the static decoder built from the source model, eager, CPU
    fake-quant  ExecuTorch's QnnQuantizer's converted graph (what quantization alone does), CPU
    htp-sim     the host twin's method on the x86 HTP simulator (what the phone's program computes)

Compile records these per method in `PteLlmProgram.numerics` (on calibration samples) and in
`manifest.numerics` (the twin vs float, the rows inspect and report.html show); `verify` measures
them again on windows of the calibration text that calibration did not use.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

# (reference, compared): the pairs recorded, named "A vs B" as `eval` names its SQNR pairs
PAIRS = (("float", "fake-quant"), ("float", "htp-sim"), ("fake-quant", "htp-sim"))
JUDGED = "float vs htp-sim"     # the pair pass marks judge: the compiled program against float


def pair_name(a: str, b: str) -> str:
    return f"{a} vs {b}"


def stage_logits(forward: Callable, samples: list[dict[str, np.ndarray]], names_in: list[str]) -> np.ndarray:
    """The logits output of `forward(*inputs)` for every sample, stacked."""
    import torch
    out = []
    with torch.inference_mode():
        for s in samples:
            got = forward(*[torch.from_numpy(np.ascontiguousarray(s[k])) for k in names_in])
            out.append(got[0].float().numpy())
    return np.stack(out)


def agreement(ref: np.ndarray, got: np.ndarray, samples: int):
    from ...contract.manifest import LogitsAgreement
    from ...core.numerics import compare
    c = compare(ref, got)
    top1 = float(np.mean(ref.reshape(-1, ref.shape[-1]).argmax(-1) == got.reshape(-1, got.shape[-1]).argmax(-1)))
    return LogitsAgreement(sqnr_db=round(float(min(c["sqnr_db"], 200.0)), 3),
                           cosine=None if c["cosine"] is None else round(float(c["cosine"]), 6),
                           max_abs_error=round(float(c["max_abs_error"]), 5), top1_agreement=round(top1, 4),
                           samples=samples)


def compare_stages(forwards: dict[str, dict[str, Callable]], samples: dict[str, list[dict[str, np.ndarray]]],
                   names_in: dict[str, list[str]]) -> dict[str, dict[str, object]]:
    """{method: {stage: forward}} on {method: samples} → {method: {"A vs B": LogitsAgreement}} for
    every pair of PAIRS whose two stages were given."""
    out: dict[str, dict[str, object]] = {}
    for method, by_stage in forwards.items():
        logits = {stage: stage_logits(f, samples[method], names_in[method]) for stage, f in by_stage.items()}
        out[method] = {pair_name(a, b): agreement(logits[a], logits[b], len(samples[method]))
                       for a, b in PAIRS if a in logits and b in logits}
    return out


def manifest_numerics(numerics: dict, threshold_db: float, target: str, inputs: str) -> dict:
    """`manifest.numerics` in the shape every bundle records (`outputs` rows: what inspect and
    report.html show), one row per method: its logits on the simulator vs float; every pair beside."""
    rows = []
    for method, pairs in numerics.items():
        a = pairs[JUDGED]
        rows.append({"name": f"{method} logits", "sqnr_db": a.sqnr_db, "cosine": a.cosine,
                     "max_abs_error": a.max_abs_error, "top1_agreement": a.top1_agreement})
    samples = max((p[JUDGED].samples or 0 for p in numerics.values()), default=0)
    return {"outputs": rows, "threshold_db": threshold_db, "part": "decoder", "target": target, "samples": samples,
            "inputs": inputs, "compared": JUDGED,
            "stages": {m: {k: v.model_dump(mode="json", exclude_none=True) for k, v in p.items()}
                       for m, p in numerics.items()}}
