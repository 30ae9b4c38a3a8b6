"""What the Gemma 3 HTP precision experiments share (htp_attention_fp16.py, htp_norm_fp16.py): the
real Gemma 3 270M GGUF as the float static decoder the LLM graphs are exported from (the stream at
1/8, the scaled RMSNorm), one ar32 call over BOS then tokens 5120+ of the default text, the first
positional input of chosen modules captured on the way; and their results file."""
from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable

import numpy as np

TOKENS = "BOS, then tokens 5120-5150 of lee_background.cor (one ar32 call, 512 slots)"
MODEL = "Gemma 3 270M (gemma-3-270m-q4_k_m.gguf), float static decoder, stream at 1/8"
TARGET = "SM8650 (x86 HTP simulator), optimization level 1"


def capture(select: Callable[[str, object], bool], n_args: int = 1) -> tuple[dict[str, tuple[np.ndarray, ...]], object]:
    """{module name: its first `n_args` inputs} for every module `select(name, module)` picks → (that, decoder)."""
    import torch

    from modelexport.frontends import find_frontend
    from modelexport.llm.model.static_decoder import ONNX_RMS_NORM, StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.static_runner import StaticRunner
    from modelexport.llm.run.text import dialog_start, read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.zoo.assets import asset_path
    src = str(asset_path("gemma3_270m_gguf"))
    llm = find_frontend(src).load(src)
    tok = from_transformers(llm.tokenizer)
    ids = dialog_start(tok) + tokenize(tok, read_text(None).text, 5152)[5120:5151]
    dec = build_static_decoder(llm.model, StaticDecoderConfig(32, 512), rms_norm=ONNX_RMS_NORM, residual_scale=8.0)
    got: dict[str, tuple[np.ndarray, ...]] = {}

    def keep(name: str):
        def hook(_mod, args):
            got.setdefault(name, tuple(t.detach().float().numpy().copy() for t in args[:n_args]))
        return hook
    for name, mod in dec.named_modules():
        if select(name, mod):
            mod.register_forward_pre_hook(keep(name))
    with torch.no_grad():
        StaticRunner.from_decoder(dec, [32]).feed(ids[:32])
    return got, dec


def write_result(path: Path, rows: list[dict]) -> None:
    import onnxruntime as ort
    path.write_text(json.dumps({"model": MODEL, "tokens": TOKENS, "target": TARGET, "onnxruntime": ort.__version__,
                                "rows": rows}, indent=1) + "\n")
