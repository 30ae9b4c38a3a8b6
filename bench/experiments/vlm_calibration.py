"""Before / after calibrating the VLM parts on what they see at run time (issue 23; backends/llm_qnn/vlm_calibration.py).

1. Tiny SmolVLM with image splitting (tests/vlm_tiny.write_tiny_tiling_folder: tiles of 32, longest edge 64,
   16a8w, ar1 + ar16, C = 128): "before" = the vision part calibrated on the whole photos resized to one tile
   and the decoder's image windows on 4 bare image tokens with those rows (the earlier layout); "after" = the
   tiles and global views, and the processor's block of ids with the tiles' rows.
2. Tiny Qwen2-VL (56 x 56, 4 image tokens, 16a8w, ar1 + ar4, C = 32): the decoder's image windows at text
   positions without the wrap ids (as before), at text positions with them, and at the M-RoPE grid positions
   with them (after).

Both at the default 8 calibration samples per variant. Measured on the held-out photos (skimage astronaut and
rocket; calibration uses chelsea and coffee, also listed): the vision part on the simulator vs its float
graph (every view's rows), and the first-step logits ("What is it?", raw) vs the float HF model fed the
processor's inputs, on the CPU (QDQ graphs) and the simulator. SQNR in dB.

usage: PYTHONPATH=src python bench/experiments/vlm_calibration.py [--only tiling|qwen2_vl]
Adds its runs to bench/results/vlm_image_calibration.json under "runtime_views".
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]    # bench/
RESULT = ROOT / "results" / "vlm_image_calibration.json"
sys.path.insert(0, str(ROOT.parent / "tests"))

PHOTOS = ("astronaut", "rocket", "coffee", "chelsea")   # the first two are held out
PROMPT = "What is it?"


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _photos():
    from PIL import Image

    from modelexport.zoo.assets import asset_path
    return {n: Image.open(asset_path(n)).convert("RGB") for n in PHOTOS}


def _idefics3_processor(folder: Path):
    from transformers import AutoImageProcessor, AutoTokenizer, Idefics3Processor
    from transformers.processing_utils import ProcessorMixin

    from vlm_tiny import TOKENS_PER_IMAGE
    # as tests/test_vlm_tiling.py: the class check imports every tokenizer backend; the processing is untouched
    with patched(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
        return Idefics3Processor(image_processor=AutoImageProcessor.from_pretrained(folder),
                                 tokenizer=AutoTokenizer.from_pretrained(folder), image_seq_len=TOKENS_PER_IMAGE)


def tiling_runs(work: Path) -> dict:
    import torch
    from transformers import Idefics3ForConditionalGeneration

    import modelexport
    from modelexport.backends.llm_qnn import vlm
    from modelexport.backends.llm_qnn.vision_session import generate_with_image, tiled_rows
    from modelexport.core.numerics import compare
    from vlm_tiny import write_tiny_tiling_folder
    folder = write_tiny_tiling_folder(work)
    processor = _idefics3_processor(folder)
    model = Idefics3ForConditionalGeneration.from_pretrained(folder).eval()
    photos = _photos()
    refs = {}
    for name, photo in photos.items():
        inputs = processor(images=[photo], text="<image>" + PROMPT, return_tensors="pt")
        with torch.no_grad():
            refs[name] = model(**{k: inputs[k] for k in ("input_ids", "pixel_values", "pixel_attention_mask")}).logits[0, -1].numpy()
    from modelexport.backends.llm_qnn.vlm_calibration import calibration_images, image_blocks
    whole = {"calibration_images": lambda facts, tiling: calibration_images(facts, None),
             "image_blocks": lambda images, facts, tiling, tok, seq: image_blocks(images, facts, None, tok, seq)}
    out = {}
    for label, patches in (("before: whole photos resized, bare image tokens", whole),
                           ("after: tiles + global views, the processor's block", {})):
        with contextlib.ExitStack() as stack:
            for k, v in patches.items():
                stack.enter_context(patched(vlm, k, v))
            bundle = modelexport.compile(str(folder), output=work / f"bundle_{len(out)}", target="SM8650",
                                         precision="16a8w", max_seq_len=128, variants="ar1,ar16",
                                         calibration=str(work / "calib.txt"), force=True)
        row = {"vision_calibration": bundle.manifest.llm.vision.calibration}
        for name, photo in photos.items():
            f, s = tiled_rows(bundle, [photo], True, "float"), tiled_rows(bundle, [photo], True, "htp-sim")
            row[f"vision/htp-sim/{name}"] = round(float(compare(f, s)["sqnr_db"]), 2)
            for backend in ("cpu", "htp-sim"):
                r = generate_with_image(bundle.path, [photo], PROMPT, backend=backend, max_new_tokens=1, raw=True)
                row[f"logits/{backend}/{name}"] = round(float(compare(refs[name], r["first_logits"])["sqnr_db"]), 2)
        row["load_1min"] = round(os.getloadavg()[0], 1)
        out[label] = row
        print(label, json.dumps(row, indent=1), flush=True)
    return out


def qwen2_vl_runs(work: Path) -> dict:
    import modelexport
    from modelexport.backends.llm_qnn import vlm
    from modelexport.backends.llm_qnn.calibration import ImageRows
    from modelexport.backends.llm_qnn.vision_session import generate_with_image, image_rows
    from modelexport.backends.llm_qnn.vlm_calibration import image_blocks
    from modelexport.core.numerics import compare
    from modelexport.llm.model.mrope import RopePositions
    from vlm_tiny import write_tiny_vlm_folder
    from test_vlm_qwen2vl_compile import _float_logits
    folder = write_tiny_vlm_folder(work, "qwen2_vl")
    photos = _photos()

    def bare(images, facts, tiling, tok, seq):   # the earlier layout: the image tokens without their wrap ids
        return [([facts.image_token_id] * facts.tokens_per_image, views) for _, views in image_blocks(images, facts, tiling, tok, seq)]
    text_positions = lambda self: RopePositions.text()   # noqa: E731
    out = {}
    for label, patches in (("before: text positions, bare image tokens", [(vlm, "image_blocks", bare), (ImageRows, "rope_positions", text_positions)]),
                           ("text positions, wrapped image tokens", [(ImageRows, "rope_positions", text_positions)]),
                           ("after: M-RoPE grid positions, wrapped image tokens", [])):
        with contextlib.ExitStack() as stack:
            for obj, k, v in patches:
                stack.enter_context(patched(obj, k, v))
            # a cache of its own: the positions are not in the QDQ graphs' cache key (the rows' .npz is)
            os.environ["MODELEXPORT_CACHE_DIR"] = str(work / f"cache_{len(out)}")
            bundle = modelexport.compile(str(folder), output=work / f"qwen_{len(out)}", target="SM8650",
                                         precision="16a8w", max_seq_len=32, variants="ar1,ar4",
                                         calibration=str(work / "calib.txt"), force=True)
        row = {}
        for name, photo in photos.items():
            f, s = image_rows(bundle, photo, "float")[0], image_rows(bundle, photo, "htp-sim")[0]
            row[f"vision/htp-sim/{name}"] = round(float(compare(f, s)["sqnr_db"]), 2)
            for backend in ("cpu", "htp-sim"):
                r = generate_with_image(bundle.path, photo, PROMPT, backend=backend, max_new_tokens=1, raw=True)
                ref = _float_logits(folder, r["prompt_ids"], photo)
                row[f"logits/{backend}/{name}"] = round(float(compare(ref, r["first_logits"])["sqnr_db"]), 2)
        row["load_1min"] = round(os.getloadavg()[0], 1)
        out[label] = row
        print(label, json.dumps(row, indent=1), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("tiling", "qwen2_vl"))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    os.environ.setdefault("MODELEXPORT_CACHE_DIR", tempfile.mkdtemp(prefix="vlm-calib-cache-"))
    data = json.loads(RESULT.read_text()) if RESULT.is_file() else {}
    runs = data.setdefault("runtime_views", {
        "what": "calibrating the VLM parts on what they see at run time: SQNR dB on the held-out photos astronaut and "
                "rocket (chelsea and coffee are the calibration photos); vision = the vision part on the simulator vs "
                "its float graph, every view; logits = first-step logits vs the float HF VLM on the processor's inputs",
        "script": "bench/experiments/vlm_calibration.py", "calibration_samples": 8, "precision": "16a8w", "target": "SM8650"})
    with tempfile.TemporaryDirectory(prefix="vlm-calib-") as tmp:
        for key, only, run in (("tiny_idefics3_tiling (ar1+ar16, C=128)", "tiling", tiling_runs),
                               ("tiny_qwen2_vl (ar1+ar4, C=32)", "qwen2_vl", qwen2_vl_runs)):
            if args.only in (None, only):
                (Path(tmp) / only).mkdir()
                runs[key] = run(Path(tmp) / only)
    RESULT.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
