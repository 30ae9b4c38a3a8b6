#!/usr/bin/env bash
# ONNX -> SM8650 at 8a8w, calibrated on real photos, then checked on the HTP simulator.
#   bash examples/onnx_8a8w.sh [OUT]        (default OUT: onnx-8a8w-out)
# Uses the bundled MobileNetV2 (ImageNet weights) and two real photos; swap in your own
# model.onnx and calibration folder for the first two steps.
set -euo pipefail
OUT=${1:-onnx-8a8w-out}
ME=${MODELEXPORT:-modelexport}
PY=${PYTHON:-python}
mkdir -p "$OUT"

# 1. a model and real calibration data (.npy samples, one per photo)
"$PY" - "$OUT" <<'PY'
import sys
from pathlib import Path
from modelexport.zoo.imagenet import save_sample_photos
from modelexport.zoo.mobilenet_v2 import export_onnx
out = Path(sys.argv[1])
export_onnx(out / "mobilenet_v2.onnx")
save_sample_photos(out / "calib")
PY

# 2. which node runs where (exit 3 with --strict if any falls back to the CPU)
"$ME" audit "$OUT/mobilenet_v2.onnx" --target SM8650 --precision 8a8w --strict

# 3. compile: quantize on the calibration samples, one QNN context binary for SM8650
"$ME" compile "$OUT/mobilenet_v2.onnx" -t SM8650 --precision 8a8w --calibration "$OUT/calib" \
    -o "$OUT/bundle" --force

# 4. what the bundle holds, and what goes to the phone
"$ME" inspect "$OUT/bundle"

# 5. the check: float model (CPU) vs compiled graph (HTP simulator); exit 5 below the pass mark
"$ME" verify "$OUT/bundle"
