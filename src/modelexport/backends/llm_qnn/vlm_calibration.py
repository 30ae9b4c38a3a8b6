"""What a VLM bundle's parts are calibrated on: the offline photos as the runtime will show them.

The vision part runs on what `generate --image` makes of a photo (vision_session): for a bundle that
splits images (SmolVLM / Idefics3, llm/model/image_tiling.py) the tiles and the global view, each one tile of
the processor's resampling; otherwise the whole photo resized to the tower's size. So it is calibrated
on those views of the calibration photos (each photo also mirrored), at most VISION_CALIBRATION_SAMPLES
of them. The text decoder's image windows (calibration.ImageRows) get the same photos' block of prompt
ids (the tiles' markers and image tokens, or the family's wrap ids around the image tokens) with the
float vision part's rows of those views at the image tokens, and, for an M-RoPE family (Qwen2-VL),
the grid positions those rows take at run time (llm/model/mrope.rope_index).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from ...llm.model.image_tiling import TileGrid, image_text, normalize, split_image
from ...llm.run.vision_inputs import image_prompt_ids, load_pixels
from ...zoo.assets import sample_images

# Vision calibration samples at most (views of the photos). The tiny tiling model's 4 photos are 20 views;
# a real SmolVLM's (longest edge 1536-2048, tiles of 512) 28-52: thinned to this, every global view kept.
VISION_CALIBRATION_SAMPLES = 32


@dataclass
class CalibrationImage:
    """One calibration photo as the runtime shows it: `views` [n, 3, S, S] (the tiles row-major, then
    the global view; or the one resized view) and its tile grid (rows = cols = 0: not split)."""
    name: str
    views: np.ndarray
    rows: int = 0
    cols: int = 0


def calibration_images(facts, tiling: dict | None) -> list[CalibrationImage]:
    """The offline photos (zoo/assets.sample_images) and their mirror images, each preprocessed as the
    runtime does it: split into tiles + the global view when the bundle tiles, else resized (bicubic)."""
    out = []
    for name, path in sample_images().items():
        img = Image.open(path).convert("RGB")
        for label, im in ((name, img), (f"{name} mirrored", ImageOps.mirror(img))):
            if tiling is None:
                x, _ = load_pixels(im, facts.image_size, facts.mean, facts.std, facts.rescale_factor)
                out.append(CalibrationImage(label, x))
                continue
            tiles, grid = split_image(im, tiling["longest_edge"], tiling["tile_size"], tiling["resample"],
                                      tiling["splitting"])
            views = np.concatenate([normalize(t, facts.mean, facts.std, facts.rescale_factor) for t in tiles])
            out.append(CalibrationImage(label, views, grid.rows, grid.cols))
    return out


def vision_samples(images: list[CalibrationImage], limit: int = VISION_CALIBRATION_SAMPLES) -> np.ndarray:
    """Every view of every image, [n, 1, 3, S, S]; beyond `limit`, every image's global view (its last)
    and tiles evenly spread over the rest."""
    views = [v[None] for im in images for v in im.views]
    if len(views) <= limit:
        return np.stack(views)
    keep = set((np.cumsum([len(im.views) for im in images]) - 1).tolist())   # the global views
    tiles = [i for i in range(len(views)) if i not in keep]
    keep |= {tiles[int(j)] for j in np.linspace(0, len(tiles) - 1, max(limit - len(keep), 0))}
    return np.stack([views[i] for i in sorted(keep)])


def write_vision_calibration(images: list[CalibrationImage], dest: Path) -> tuple[Path, str]:
    """The vision part's calibration .npz (`pixel_values` [n, 1, 3, S, S]) → (path, what it is)."""
    x = vision_samples(images)
    np.savez(dest, pixel_values=x)
    split = sum(im.rows * im.cols for im in images)
    what = "real photos (skimage chelsea, coffee, and their mirror images)"
    if not split:
        return dest, f"{len(x)} {what}"
    grids = ", ".join(sorted({f"{im.rows}x{im.cols}" for im in images}))
    return dest, f"{len(x)} views (tiles of {grids} + the global views, as the runtime splits them) of {len(images)} {what}"


def image_blocks(images: list[CalibrationImage], facts, tiling: dict | None, tokenizer, max_seq_len: int
                 ) -> list[tuple[list[int], np.ndarray]]:
    """Per image, the prompt ids its image takes at run time and the indices of its views whose rows go
    at the block's image tokens, in order. A split image whose block would take more than half the
    context (the runtime refuses it there; --no-image-splitting is the way out) gives its global view's
    block instead."""
    out = []
    for im in images:
        if tiling is None:
            out.append((image_prompt_ids([], facts.image_token_id, facts.tokens_per_image, tuple(facts.image_wrap_ids)),
                        np.arange(len(im.views))))
            continue
        views = np.arange(len(im.views))
        block = tokenizer.encode(image_text(TileGrid(im.rows, im.cols), tiling["image_seq_len"]), add_special_tokens=False)
        if len(block) > max_seq_len // 2:
            views = views[-1:]
            block = tokenizer.encode(image_text(TileGrid(0, 0), tiling["image_seq_len"]), add_special_tokens=False)
        out.append((block, views))
    return out


def write_image_rows(vision_onnx: Path, images: list[CalibrationImage], blocks, facts, dest: Path) -> Path:
    """The text decoder's image calibration (.npz read by calibration.ImageRows.load): per image its
    block of ids and the float vision part's rows of its views; the M-RoPE grid of a "mrope_grid" family."""
    import onnxruntime as ort
    sess = ort.InferenceSession(str(vision_onnx), providers=["CPUExecutionProvider"])
    arrays: dict[str, np.ndarray] = {"image_token_id": np.int64(facts.image_token_id), "images": np.int64(len(images))}
    for i, (im, (block, views)) in enumerate(zip(images, blocks)):
        rows = np.concatenate([sess.run(None, {"pixel_values": im.views[v][None]})[0][0] for v in views])   # [k, hidden]
        arrays[f"ids_{i}"] = np.asarray(block, np.int64)
        arrays[f"rows_{i}"] = rows.astype(np.float32)
    if facts.position_rule == "mrope_grid":
        arrays["grid_thw"] = np.asarray(facts.grid_thw, np.int64)
        arrays["spatial_merge_size"] = np.int64(facts.spatial_merge_size)
    np.savez(dest, **arrays)
    return dest
