"""`verify BUNDLE` on a vision-language bundle: its vision part, the one graph of an LLM bundle that has a
float model of its own, on the HTP simulator against that float graph (ONNX Runtime's CPU EP).

The inputs are the photos the compile stored (`vision/verify_inputs.npz`: calibration photos as the runtime
shows them), or the user's `--input` images, each resized and normalized as `generate --image` does. The
decoders run in a generation loop over a KV cache and have no one float graph to set beside them: they are
compared with `verify --per-layer` (every decoder module and the logits) or `eval --stages`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...contract import open_bundle
from ...core.errors import InputError, UnsupportedError
from ...llm.run.vision_inputs import load_pixels
from ...quant.precision import pass_mark
from ..ort_qnn.verify import GraphCheck, VerifyReport, check_output, read_samples
from .vision_session import vision_runner
from .vlm import VISION_PART

DECODER_FIX = ("the decoders: `modelexport verify BUNDLE --per-layer` (every decoder module and the logits on the "
               "calibration text) or `modelexport eval BUNDLE --stages float,fake-quant,htp-sim`")


def vision_samples(bundle, v, inputs, max_samples: int | None) -> tuple[list[np.ndarray], str]:
    """pixel_values [1, 3, S, S] per sample and how they were chosen."""
    if inputs:
        return [load_pixels(p, v.image_size, v.mean, v.std, v.rescale_factor)[0] for p in inputs], "given images"
    stored = f"{VISION_PART}/verify_inputs.npz"
    if not any(f.path == stored for f in bundle.manifest.files):
        raise InputError(f"{bundle.path} keeps no stored photos for its vision part",
                         "pass images to compare on: verify BUNDLE --input photo.jpg")
    xs = [s["pixel_values"] for s in read_samples(bundle.file(stored))]
    return xs[:max_samples] if max_samples else xs, "stored photos"


def verify_vision_part(bundle_path: str | Path, inputs=None, part: str | None = None, target: str | None = None,
                       min_sqnr: float | None = None, max_samples: int | None = None):
    """The vision part of each target (or `target`) on the simulator vs float → VerifyReport."""
    import onnxruntime as ort

    bundle = open_bundle(bundle_path)
    v = bundle.manifest.llm.vision if bundle.manifest.llm is not None else None
    if v is None:
        raise UnsupportedError(f"{bundle.path} is an LLM bundle: its graphs run in a generation loop over a KV cache, "
                               "so plain `verify` (one graph against its float model) does not apply",
                               "compare " + DECODER_FIX)
    if part not in (None, VISION_PART):
        raise InputError(f"--part {part}: plain `verify` of a vision-language bundle compares its vision part only",
                         f"use --part {VISION_PART} or leave --part out; for " + DECODER_FIX)
    if isinstance(inputs, dict):
        raise InputError("verify of a vision part takes image files", "pass --input photo.jpg (one or more)")
    targets = [g.target for g in v.graphs if g.epcontext_model and (target is None or g.target == target)]
    if not targets:
        raise InputError(f"{bundle.path}'s vision part has no graph for {target}",
                         f"its targets: {', '.join(bundle.manifest.targets)}")
    xs, kind = vision_samples(bundle, v, inputs, max_samples)
    ref_sess = ort.InferenceSession(str(bundle.file(v.model)), providers=["CPUExecutionProvider"])
    refs = [ref_sess.run(None, {"pixel_values": x})[0].reshape(v.tokens_per_image, -1) for x in xs]
    threshold = pass_mark(min_sqnr, v.precision)
    report = VerifyReport(str(bundle.path), [])
    for t in targets:
        run = vision_runner(bundle, "htp-sim", t)
        gots = [run(x) for x in xs]
        gc = GraphCheck(VISION_PART, t, v.precision, threshold, len(xs), kind)
        out = check_output("image_embeds", refs, gots, threshold)
        out.argmax_agreement = None       # rows of features, not class scores
        gc.outputs = [out]
        report.graphs.append(gc)
    return report
