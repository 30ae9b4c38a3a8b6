#!/usr/bin/env bash
# A vision-language model -> one bundle (vision part + embedder + decoder) -> ask it about a photo.
#   bash examples/vlm.sh [HF_FOLDER] [OUT]
# Without HF_FOLDER, a tiny SmolVLM-shaped model with random weights is built from this repository's
# tests (tests/vlm_tiny.py), so the steps run in a few minutes; its answers are noise.
set -euo pipefail
ME=${MODELEXPORT:-modelexport}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")/.." && pwd)
FOLDER=${1:-}
OUT=${2:-vlm-out}
mkdir -p "$OUT"
CALIB=()
if [ -z "$FOLDER" ]; then
    FOLDER=$("$PY" - "$OUT" "$HERE/tests" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from vlm_tiny import write_tiny_vlm_folder
print(write_tiny_vlm_folder(sys.argv[1]))
PY
)
    CALIB=(--calibration "$OUT/calib.txt" --calibration-samples 2 --precision 16a8w --max-seq-len 32 --variants ar1,ar4)
fi
PHOTO=$("$PY" -c "from modelexport.zoo.assets import asset_path; print(asset_path('chelsea'))")

"$ME" compile "$FOLDER" -t SM8650 "${CALIB[@]}" -o "$OUT/bundle" --force
"$ME" inspect "$OUT/bundle"
"$ME" verify "$OUT/bundle" --input "$PHOTO"                           # vision part: simulator vs float
"$ME" generate "$OUT/bundle" --image "$PHOTO" --raw -p "A photo of" -n 8 --backend htp-sim   # a real model: -p "What is in this picture?"
