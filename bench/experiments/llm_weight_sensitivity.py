"""How far rounding the weights alone moves an LLM's logits, activations left float: the float decoder vs
the same decoder with every linear's weights (lm_head's aside) rounded per output row to 8 bits, or in
blocks of 32 input channels to 4 bits (round to nearest), on the tokens compile's own check ran.

    python bench/experiments/llm_weight_sensitivity.py HF_FOLDER reference/window.json

Used on the Llama-3.1-8B-shaped folder of random weights (bench/llm_sizes.py) to tell its check's
0.2 dB apart from a compile defect (bench/results/llm_self_check.json, llama-8b_checked_after).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from modelexport.core.numerics import sqnr_db
from modelexport.frontends import find_frontend
from modelexport.llm.export.weight_dtype import float32_per_module
from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
from modelexport.llm.run.static_runner import StaticRunner

BITS = {"bits": None}     # the rounding the patched linear applies now (None: float)


def rounded(w: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 4:       # blocks of 32 input channels, symmetric, as 16a4w_block's weights
        o, i = w.shape
        wb = w.reshape(o, i // 32, 32)
        s = wb.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 7
        return (torch.round(wb / s).clamp(-8, 7) * s).reshape(o, i)
    s = w.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127     # per output row, symmetric
    return torch.round(w / s).clamp(-128, 127) * s


def linear(self, x):
    w = self.weight
    if BITS["bits"] and "lm_head" not in getattr(self, "_name", ""):
        w = rounded(w, BITS["bits"])
    return torch.nn.functional.linear(x, w, self.bias)


def main() -> None:
    src = sys.argv[1]
    ids = json.loads(Path(sys.argv[2]).read_text())["ids"][:32]
    llm = find_frontend(src).load(src, dtype=torch.bfloat16)
    for name, mod in llm.model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod._name = name
    torch.nn.Linear.forward = linear
    dec = build_static_decoder(llm.model, StaticDecoderConfig(32, 512))
    out = {}
    for bits in (None, 8, 4):
        BITS["bits"] = bits
        with float32_per_module(dec):
            out[bits] = StaticRunner.from_decoder(dec, [32]).feed(ids).float().numpy()
        if bits:
            agree = np.mean(out[None].argmax(-1) == out[bits].argmax(-1))
            print(json.dumps({"weights": f"w{bits}", "activations": "float", "sqnr_db": round(sqnr_db(out[None], out[bits]), 2),
                              "top1_agreement": round(float(agree), 4)}), flush=True)


if __name__ == "__main__":
    main()
