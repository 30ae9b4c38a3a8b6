"""What a zero shift before a ReLU does on the HTP, with and without the `add-zero` repair.

    python bench/htp_zero_shift.py              # → bench/results/htp_zero_shift.json
    python bench/htp_zero_shift.py --models     # and two real configs with random weights (minutes each)

x · γ + β → ReLU over [1, 64, 14, 14] (γ per channel around 1), compiled for SM8650 by
`modelexport.compile` on 4 random inputs at each quantized precision, for β = 0, β = 1e-6 and a
random β: the SQNR its own check reports (the HTP simulator against the float model). With
`--models`, BiT-50 (transformers' real config, random weights: 49 GroupNorms with zero shifts) at
16a16w and DETR (ResNet-50 backbone with frozen BatchNorms, random weights, 480x480) at 8a8w, each
exported by torch's dynamo exporter and calibrated on random data, with and without the repair.
"""
from __future__ import annotations

import argparse
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

OUT = Path(__file__).parent / "results" / "htp_zero_shift.json"
C, H = 64, 14
PRECISIONS = ["8a8w", "16a8w", "16a16w"]


def scale_shift_relu(path: Path, shift: np.ndarray) -> None:
    gamma = (1 + 0.1 * np.random.default_rng(0).standard_normal((C, 1, 1))).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "gamma"], ["m"]), helper.make_node("Add", ["m", "beta"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])],
                          [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(shift.astype(np.float32), "beta")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))


def worst_db(model: str, precision: str, out: Path, repaired: bool, calibration) -> float:
    every = repairs.all_repairs
    if not repaired:
        repairs.all_repairs = lambda: [r for r in every() if r.name != "add-zero"]
    try:
        b = modelexport.compile(model, output=out, target="SM8650", precision=precision, calibration=calibration,
                                use_cache=False, force=True)
    finally:
        repairs.all_repairs = every
    return round(min(o["sqnr_db"] for o in b.manifest.numerics["outputs"]), 1)


def micro_rows(tmp: Path) -> list[dict]:
    shifts = {"zero": np.zeros((C, 1, 1)), "1e-6": np.full((C, 1, 1), 1e-6),
              "random": 0.1 * np.random.default_rng(1).standard_normal((C, 1, 1))}
    calib = [{"x": np.random.default_rng(i).standard_normal((1, C, H, H)).astype(np.float32)} for i in range(4)]
    rows = []
    for name, shift in shifts.items():
        scale_shift_relu(tmp / "m.onnx", shift)
        for p in PRECISIONS:
            row = {"shift": name, "precision": p,
                   "as_is_db": worst_db(str(tmp / "m.onnx"), p, tmp / "b", False, calib),
                   "repaired_db": worst_db(str(tmp / "m.onnx"), p, tmp / "b", True, calib)}
            print(row, flush=True)
            rows.append(row)
    return rows


def export_bit50(path: Path) -> None:
    import torch
    from transformers import BitConfig, BitForImageClassification
    cfg = BitConfig(layer_type="preactivation", global_padding="SAME", embedding_dynamic_padding=True, num_groups=32,
                    depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048], num_labels=1000)
    torch.manual_seed(0)
    model = BitForImageClassification(cfg).eval()
    torch.onnx.export(_Logits(model), (torch.randn(1, 3, 224, 224),), str(path), input_names=["pixel_values"],
                      output_names=["logits"], dynamo=True)


def export_detr(path: Path) -> None:
    import torch
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig
    cfg = DetrConfig(use_timm_backbone=False, backbone_config=ResNetConfig(out_features=["stage4"]),
                     use_pretrained_backbone=False)
    torch.manual_seed(0)
    model = DetrForObjectDetection(cfg).eval()
    torch.onnx.export(_Logits(model, boxes=True), (torch.randn(1, 3, 480, 480),), str(path),
                      input_names=["pixel_values"], output_names=["logits", "pred_boxes"], dynamo=True)


def _Logits(model, boxes: bool = False):
    import torch

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, pixel_values):
            o = self.m(pixel_values=pixel_values)
            return (o.logits, o.pred_boxes) if boxes else o.logits
    return Wrap()


def model_rows(tmp: Path) -> list[dict]:
    rows = []
    for name, export, precision in [("bit50", export_bit50, "16a16w"), ("detr_r50", export_detr, "8a8w")]:
        export(tmp / f"{name}.onnx")
        row = {"model": name, "precision": precision, "calibration": "random",
               "as_is_db": worst_db(str(tmp / f"{name}.onnx"), precision, tmp / "b", False, "random"),
               "repaired_db": worst_db(str(tmp / f"{name}.onnx"), precision, tmp / "b", True, "random")}
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", action="store_true", help="also BiT-50 and DETR (real configs, random weights)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"target": "SM8650", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                  "block": f"x * gamma + beta -> Relu over [1, {C}, {H}, {H}]", "micro": micro_rows(Path(tmp))}
        if args.models:
            result["models"] = model_rows(Path(tmp))
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
