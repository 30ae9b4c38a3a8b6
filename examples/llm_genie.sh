#!/usr/bin/env bash
# A GGUF file or Hugging Face folder -> a Genie bundle for SM8650 -> Genie on the HTP simulator ->
# the files and the command for the phone.
#   bash examples/llm_genie.sh [MODEL] [OUT]     MODEL: a .gguf or HF folder (default: the bundled
#                                                SmolLM2-135M-Instruct Q4_1 GGUF; its compile takes minutes)
#   bash examples/llm_genie.sh --tiny [OUT]      a tiny random-weight Llama from tests/llm_tiny.py (seconds;
#                                                its answers are noise)
set -euo pipefail
ME=${MODELEXPORT:-modelexport}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:-}
OUT=${2:-llm-genie-out}
mkdir -p "$OUT"
OPTS=()
PROMPT="What is the capital of France?"
if [ "$MODEL" = "--tiny" ]; then
    "$PY" - "$OUT" "$HERE/tests" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from llm_tiny import write_tiny_llm_folder
write_tiny_llm_folder(sys.argv[1])
PY
    MODEL="$OUT/tiny_hf"
    OPTS=(--precision 16a4w --max-seq-len 32 --variants ar1,ar4 --calibration "$OUT/calib.txt" --calibration-samples 4)
    PROMPT="The quick"
elif [ -z "$MODEL" ]; then
    MODEL=$("$PY" -c "from modelexport.zoo.assets import asset_path; print(asset_path('smollm2_gguf'))")
    OPTS=(--variants ar1,ar32)
fi

# 1. the plan: parts, peak memory and disk, checked against this machine (loads no weights)
"$ME" compile "$MODEL" -t SM8650 "${OPTS[@]}" --dry-run

# 2. the Genie bundle: decoder graphs sharing one copy of the weights, genie_config.json, tokenizer
"$ME" compile "$MODEL" -t SM8650 "${OPTS[@]}" -o "$OUT/bundle" --force

# 3. the check: Genie (libGenie.so) runs the bundle on the HTP simulator
"$ME" generate "$OUT/bundle" --backend genie --raw -p "$PROMPT" -n 8

# 4. what goes to the phone ("on the phone": files, libraries, memory per part)
"$ME" inspect "$OUT/bundle"
"$ME" inspect "$OUT/bundle" --json | "$PY" -c '
import json, sys
d = json.load(sys.stdin)["deployment"]
for r in d["runtimes"]:
    if r["runtime"] == "Genie":
        print("copy to the phone (keep the paths):", " ".join(r["files"]))
        print("it needs:", r["needs"])
print("then on the phone, in that folder:")
print("  LD_LIBRARY_PATH=. ADSP_LIBRARY_PATH=. ./genie-t2t-run -c genie_config.json -p \"What is the capital of France?\"")
'
