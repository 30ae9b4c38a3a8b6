"""Turning an image and a prompt into what a VLM bundle's parts take: the image resized and normalized
as the manifest's vision entry says, and the projected rows placed at the image tokens.

Resizing or converting an image is not silent: each returns a note the caller shows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ...core.errors import InputError
from ..model.image_tiling import normalize
from ..model.input_modes import INPUT_IDS, INPUTS_EMBEDS


def open_rgb(image):
    """`image` (a path or a PIL image) → (the RGB PIL image, notes on what was changed)."""
    notes = []
    if not isinstance(image, Image.Image):
        p = Path(image)
        if not p.is_file():
            raise InputError(f"image not found: {p}", "pass --image with the path of a JPEG or PNG file")
        try:
            image = Image.open(p)
            image.load()
        except (UnidentifiedImageError, OSError) as e:
            raise InputError(f"{p} is not an image PIL can read ({e})", "pass --image a JPEG or PNG file") from None
    if image.mode in _SIXTEEN_BIT:   # PIL's convert("RGB") clips these at 255: a mostly white image, silently
        pixels = np.asarray(image, dtype=np.float64) / 257.0
        image = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "L")
        notes.append("16-bit image scaled to 8 bits")
    elif image.mode == "F":
        raise InputError(f"{getattr(image, 'filename', None) or 'the image'} holds floating-point pixels (mode F): "
                         "their range is not known", "save it as an 8- or 16-bit PNG or a JPEG and pass that to --image")
    if image.mode != "RGB":
        notes.append(f"image mode {image.mode} converted to RGB")
        image = image.convert("RGB")
    return image, notes


# The modes PIL opens 16-bit greyscale PNG / TIFF as; 65535 / 257 = 255.
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


def load_pixels(image, size: int, mean, std, rescale_factor: float) -> tuple[np.ndarray, list[str]]:
    """`image` (a path or a PIL image) → pixel_values float32 [1, 3, size, size] and the notes on what
    was changed (mode converted, size changed). Bicubic, as the Idefics3 / CLIP processors resize."""
    image, notes = open_rgb(image)
    if image.size != (size, size):
        notes.append(f"image of {image.size[0]}x{image.size[1]} resized to {size}x{size} (the vision part's size)")
        image = image.resize((size, size), Image.Resampling.BICUBIC)
    return normalize(image, mean, std, rescale_factor), notes


def image_prompt_ids(ids: list[int], image_token_id: int, tokens_per_image: int, wrap: tuple[int, ...] = ()) -> list[int]:
    """The prompt's ids with one image's tokens: if the prompt has none, `tokens_per_image` image tokens
    are put after its first token (one image, before the text), between the family's `wrap` ids when it
    has them (Qwen2-VL: <|vision_start|>, <|vision_end|>); if it has some, their count must be tokens_per_image."""
    n = sum(1 for t in ids if t == image_token_id)
    if n == 0:
        block = [*wrap[:1], *[image_token_id] * tokens_per_image, *wrap[1:]]
        return [*ids[:1], *block, *ids[1:]] if ids else block
    if n != tokens_per_image:
        raise InputError(f"the prompt holds {n} image tokens; one image is {tokens_per_image}",
                         "leave the image tokens out of the prompt (they are inserted) or write exactly one image's")
    return ids


def place_image_rows(embeds: np.ndarray, ids: list[int], image_token_id: int, rows: np.ndarray) -> np.ndarray:
    """Placement rule `replace_in_order`: the i-th image token's embedding becomes rows[i]
    (transformers' masked_scatter). embeds [1, T, H], rows [1, K, H] or [K, H]; → a new array."""
    rows = np.asarray(rows, np.float32).reshape(-1, embeds.shape[-1])
    where = np.flatnonzero(np.asarray(ids) == image_token_id)
    if len(where) != len(rows):
        raise InputError(f"{len(where)} image tokens but {len(rows)} image rows",
                         "put exactly one image's tokens into the prompt")
    out = np.array(embeds, np.float32, copy=True)
    out[0, where] = rows
    return out


def place_rows_at_positions(first: dict, position_ids, rows_at: dict, no_token_id: int | None) -> dict:
    """One graph call's first inputs (llm/model/input_modes.text_inputs) with the image rows put at their
    absolute positions: `inputs_embeds` takes the row; in `both` mode the id there becomes
    `no_token_id` so the decoder looks nothing up. Padding positions past the chunk are left alone."""
    pos = np.asarray(position_ids).reshape(-1)
    hits = [(j, rows_at[int(p)]) for j, p in enumerate(pos) if int(p) in rows_at]
    if not hits:
        return first
    out = dict(first)
    emb = np.array(out[INPUTS_EMBEDS], np.float32, copy=True)
    for j, row in hits:
        emb[0, j] = row
    out[INPUTS_EMBEDS] = emb
    if INPUT_IDS in out:
        ids = np.array(out[INPUT_IDS], copy=True)
        ids[0, [j for j, _ in hits]] = no_token_id
        out[INPUT_IDS] = ids
    return out
