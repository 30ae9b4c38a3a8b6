"""The scaled RMSNorm the LLM graphs export (llm/model/blocks.RMSNorm, form "scaled") on the HTP
simulator, where it runs in fp16. A row near zero is what Gemma 3's post-norms see at its BOS token in
late layers (|x| ~ 1e-3, weights near 1,000): written as eps / m², m² underflowed fp16, the row came out
0 and the compiled Gemma 3 270M departed from its own QDQ graphs by 16.9 dB
(bench/experiments/htp_norm_fp16.py, bench/experiments/llm_depth_departure.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from modelexport.core.numerics import sqnr_db
from modelexport.llm.model.blocks import RMSNorm


def _htp(module: torch.nn.Module, x: np.ndarray, tmp_path) -> np.ndarray:
    from modelexport.core.targets import get_target
    from modelexport.toolchain.htp_options import compile_provider_options
    from modelexport.toolchain.ort_qnn import SessionPlan, create_session
    path = tmp_path / "norm.onnx"
    torch.onnx.export(module, (torch.from_numpy(x),), str(path), input_names=["x"], output_names=["y"], dynamo=False)
    options = compile_provider_options(get_target("SM8650"), None, 1)
    return create_session(path, SessionPlan(provider_options=options)).run(None, {"x": x})[0]


@pytest.mark.parametrize("row_scale", [1e-3, 1e-5, 1.0, 5000.0])
def test_a_row_near_zero_or_huge_keeps_its_norm_on_the_htp(row_scale, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 0.5, (1, 4, 640)).astype(np.float32)
    x[0, 0] *= row_scale / np.abs(x[0, 0]).max()           # the row under test; the others ordinary
    weight = torch.nn.Parameter(torch.from_numpy(rng.uniform(0, 1200, 640).astype(np.float32)), requires_grad=False)
    norm = RMSNorm(weight, 1e-6, "scaled", offset=1.0).eval()
    with torch.no_grad():
        ref = norm(torch.from_numpy(x)).numpy()
        exact = torch.nn.functional.rms_norm(torch.from_numpy(x), (640,), weight + 1.0, 1e-6).numpy()
    assert sqnr_db(exact, ref) > 100                      # the scaled form is RMSNorm
    got = _htp(norm, x, tmp_path)
    # measured 43-66 dB (a row at 1e-5 is in fp16's subnormals); eps / m² written plainly: the small rows far below 0 dB
    assert sqnr_db(ref[0, 0], got[0, 0]) > 40, sqnr_db(ref[0, 0], got[0, 0])
    assert sqnr_db(ref, got) > 40
