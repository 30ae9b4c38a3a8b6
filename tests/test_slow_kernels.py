"""Activations the HTP runs on a slow kernel when quantized, written as what they are defined as
(passes/onnx/softplus.py, selu.py, softsign.py): the same numbers, a fraction of the cycles."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import modelexport
from onnx_models import conv_act_conv


def _compile(tmp_path, op, precision):
    rng = np.random.default_rng(1)
    cal = [{"x": rng.standard_normal((1, 8, 64, 64)).astype(np.float32)} for _ in range(4)]
    return modelexport.compile(str(conv_act_conv(tmp_path / f"{op}.onnx", op)), output=tmp_path / f"{op}_{precision}",
                               target="SM8650", precision=precision, calibration=cal if precision != "fp16" else None,
                               use_cache=False)


def _ops(b) -> set[str]:
    pm = b.manifest.parts[0]
    return {n.op_type for n in onnx.load(str(b.file(pm.files.quantized_model or pm.files.float_model))).graph.node}


@pytest.mark.parametrize(("op", "precision", "repair"), [("Softplus", "16a8w", "softplus-as-log-exp"),
                                                         ("Selu", "8a8w", "selu-as-elu"),
                                                         ("Softsign", "8a8w", "softsign-as-div")])
def test_a_slow_activation_is_written_out_and_verifies(tmp_path, op, precision, repair):
    b = _compile(tmp_path, op, precision)
    assert repair in [r["name"] for r in b.manifest.parts[0].repairs or []]
    assert op not in _ops(b)
    mark = 40 if precision == "16a8w" else 25
    assert b.manifest.numerics["passed"] and b.manifest.numerics["outputs"][0]["sqnr_db"] > mark, b.manifest.numerics


@pytest.mark.parametrize(("op", "precision"), [("Softplus", "8a8w"), ("Softplus", "fp16"), ("Selu", "fp16")])
def test_where_the_htp_kernel_is_cheap_it_stays(tmp_path, op, precision):
    b = _compile(tmp_path, op, precision)
    assert op in _ops(b)
