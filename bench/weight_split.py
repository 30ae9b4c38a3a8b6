"""What `--split-weights` gives deep CNNs bound by their 8-bit weights, on the CPU and on the HTP.

    .venv/bin/python bench/weight_split.py [--only ppocr_det]    # → bench/results/weight_split.json

Per corpus model (zoo/real_onnx.py; its repaired float graph, quantized as a compile quantizes it):
all of scikit-image's photos calibrate, and two of them are scored: the model's own photo (page.png)
and coffee.png, as compile's own check scores the samples it calibrated on. (Held out, page.png falls
outside the ranges the other photos set, and every precision gives about 17 dB on PP-OCRv4's
detector: that measures the ranges, not the weights.)
Each precision's QDQ model runs on ONNX Runtime's CPU EP with graph optimizations off (exact
fake-quant) and on the QNN EP on the x86 HTP simulator (SM8650, finalization level 1); SQNR in dB
of each scored photo's worst output, against the float model (a detector that finds nothing in a
photo has a float output near 0 there, `float_output_rms`, and its dB says nothing). Also the first depthwise
Conv's output on the page photo: CPU and HTP at 16a16w, and the CPU at 16a8w (8-bit weights).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from modelexport.backends.ort_qnn.repair import load_repaired
from modelexport.core.numerics import sqnr_db
from modelexport.quant.calibration import CalibrationSet
from modelexport.quant.onnx_qdq import quantize_onnx
from modelexport.quant.precision import PRECISIONS
from modelexport.toolchain.ort_qnn import SessionPlan, create_session
from modelexport.zoo.real_onnx import get, model_path, package_file, photo_input

RESULT = Path(__file__).parent / "results" / "weight_split.json"
MODELS = ("ppocr_det", "ppocrv6_small_det", "ppocr_v2_det")
SCORED = ("page.png", "coffee.png")
CASES = (("16a8w", False), ("16a8w", True), ("16a16w", False))
PROVIDER = {"soc_model": "57", "htp_arch": "75", "enable_htp_fp16_precision": "1",
            "htp_graph_finalization_optimization_mode": "1"}


def _photos() -> tuple[list[Path], list[Path]]:
    folder = package_file("scikit-image", "skimage/data/page.png", "scikit-image's photos").parent
    photos = sorted(p for p in folder.iterdir() if p.suffix in (".png", ".jpg"))
    scored = [folder / n for n in SCORED]
    return photos, scored


def _feeds(m, photos: list[Path], name: str) -> list[dict]:
    out = []
    for p in photos:
        try:
            out.append(photo_input(m, p, name))
        except Exception:          # a photo the row's preprocessing cannot take (a grey image for RGB)
            continue
    return out


def _cpu(path: Path | bytes, feed: dict, names=None) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(names, feed)


def _per_photo(ref: list[list], got: list[list]) -> dict[str, float]:
    """Each scored photo's worst output, in dB."""
    return {name: round(min(sqnr_db(r, np.asarray(g, np.float32)) for r, g in zip(rs, gs)), 2)
            for name, rs, gs in zip(SCORED, ref, got)}


def _with_output(path: Path, tensor: str) -> bytes:
    m = onnx.load(str(path))
    m.graph.output.append(helper.make_empty_tensor_value_info(tensor))
    return m.SerializeToString()


def _first_depthwise(float_path: Path, qdq: dict[str, Path], feed: dict) -> dict:
    m = onnx.load(str(float_path))
    inits = {t.name for t in m.graph.initializer}
    node = next((n for n in m.graph.node if n.op_type == "Conv" and n.input[1] in inits
                 and any(a.name == "group" and a.i > 1 for a in n.attribute)), None)
    if node is None:
        return {}
    t = node.output[0]
    dq = t + "_DequantizeLinear_Output"
    if not any(dq in n.output for n in onnx.load(str(qdq["16a16w"])).graph.node):
        return {"node": node.name, "note": "its output is not quantized on its own (fused with the op after it)"}
    ref = _cpu(_with_output(float_path, t), feed, [t])[0]
    b16 = _with_output(qdq["16a16w"], dq)
    htp = create_session(b16, SessionPlan(provider_options=PROVIDER)).run([dq], feed)[0]
    return {"node": node.name, "cpu_16a16w_db": round(sqnr_db(ref, _cpu(b16, feed, [dq])[0]), 1),
            "htp_16a16w_db": round(sqnr_db(ref, np.asarray(htp, np.float32)), 1),
            "cpu_16a8w_db": round(sqnr_db(ref, _cpu(_with_output(qdq["16a8w"], dq), feed, [dq])[0]), 1)}


def one(name: str, work: Path) -> dict:
    m = get(name)
    loaded = load_repaired(model_path(m), m.input_shapes or None, dict(m.input_values) or None, quantized=True)
    float_path = work / "float.onnx"
    onnx.save(loaded.model, str(float_path))
    first = loaded.inputs[0].name
    cal_photos, scored_photos = _photos()
    calib = CalibrationSet(_feeds(m, cal_photos, first), "photos", "scikit-image")
    scored = _feeds(m, scored_photos, first)
    ref = [_cpu(float_path, f) for f in scored]
    row: dict = {"model": name, "kind": m.kind, "calibration_photos": len(calib.samples),
                 "float_output_rms": {n: [round(float(np.sqrt(np.mean(np.square(o, dtype=np.float64)))), 6) for o in r]
                                      for n, r in zip(SCORED, ref)}}
    qdq: dict[str, Path] = {}
    for prec, split in CASES:
        key = prec + ("_split" if split else "")
        path = work / f"{key}.onnx"
        info = quantize_onnx(float_path, path, PRECISIONS[prec], calib, split_weights=split)
        pre = Path(info["preprocessed_model"])
        if pre != float_path and pre.exists():
            pre.unlink()
        if not split:
            qdq[prec] = path
        htp = create_session(str(path), SessionPlan(provider_options=PROVIDER))
        row[key] = {"cpu_db": _per_photo(ref, [_cpu(path, f) for f in scored]),
                    "htp_db": _per_photo(ref, [htp.run(None, f) for f in scored]),
                    **({"split_layers": info["split_weights"]["layers"]} if split else {})}
        print(name, key, row[key], flush=True)
    row["first_depthwise"] = _first_depthwise(float_path, qdq, scored[0])
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    rows = []
    for name in args.only:
        with tempfile.TemporaryDirectory(prefix="bench-split-") as work:
            rows.append(one(name, Path(work)))
    RESULT.write_text(json.dumps({"target": "SM8650", "machine": {"cpus": os.cpu_count()},
                                  "provider_options": PROVIDER, "rows": rows}, indent=1))
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
