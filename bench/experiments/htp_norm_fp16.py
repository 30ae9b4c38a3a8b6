"""Do the HTP's fp16 RMSNorms depart from float on Gemma 3's real inputs, and more in its last layers?
Gemma 3 270M's float static decoder (all 18 layers, the stream at 1/8, the norms in the "scaled" form
the LLM graphs export) runs BOS then tokens 5120+ of the default text (one ar32 call); every RMSNorm's
input is captured, and each norm alone is exported to ONNX (float, as the LLM graphs keep the norms)
and run by ONNX Runtime's CPU EP and on the x86 HTP simulator (SM8650, level 1: fp16 inside).

    python bench/experiments/htp_norm_fp16.py     # → bench/results/htp_norm_fp16.json
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemma3_window  # noqa: E402
from htp_matmul_precision import _sqnr  # noqa: E402

RESULT = Path(__file__).resolve().parent.parent / "results" / "htp_norm_fp16.json"
WANTED = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def main() -> int:
    import onnxruntime as ort
    import torch

    from modelexport.core.targets import get_target
    from modelexport.llm.model.blocks import RMSNorm
    from modelexport.toolchain.htp_options import compile_provider_options
    from modelexport.toolchain.ort_qnn import SessionPlan, create_session

    def wanted(name: str, mod) -> bool:
        parts = name.split(".")
        return isinstance(mod, RMSNorm) and parts[-1] in WANTED and parts[-2].isdigit()
    captured, dec = gemma3_window.capture(wanted)
    norms = {name: mod for name, mod in dec.named_modules() if name in captured}
    got = {name: x[0] for name, x in captured.items()}
    options = compile_provider_options(get_target("SM8650"), None, 1)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, x in got.items():
            path = Path(d) / f"{name}.onnx"
            mod = norms[name].float()
            torch.onnx.export(mod, (torch.from_numpy(x),), str(path), input_names=["x"], output_names=["y"], dynamo=False)
            ref = mod(torch.from_numpy(x)).detach().numpy()
            cpu = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
            htp = create_session(path, SessionPlan(provider_options=options)).run(None, {"x": x})[0]
            rows.append({"norm": name, "htp_vs_float_db": _sqnr(ref, htp), "cpu_vs_float_db": _sqnr(ref, cpu),
                         "max_abs_in": round(float(np.abs(x).max()), 1), "max_abs_out": round(float(np.abs(ref).max()), 1)})
            print(json.dumps(rows[-1]), flush=True)
    gemma3_window.write_result(RESULT, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
