"""SmolVLM / Idefics3 image splitting, as transformers' Idefics3 processor does it (PIL backend,
transformers 5.24 models/idefics3/image_processing_pil_idefics3.py and processing_idefics3.py):

1. the image is resized so its longest edge is `longest_edge` (the other edge keeps the aspect ratio,
   made even; up or down), then up to whole multiples of the tile size;
2. it is cut into rows x cols tiles of `tile_size` (row-major), and the resized image is scaled down to
   one tile, the global image, which comes last; an image of one tile is not split (rows = cols = 0);
3. in the prompt each `<image>` becomes, per tile, `<fake_token_around_image><row_i_col_j>` and
   image_seq_len `<image>` tokens, a "\\n" after each row, then "\\n" and the global image's
   `<fake_token_around_image><global-img>` + image tokens + `<fake_token_around_image>`.

With splitting off, each image is resized to one tile and only the global image's part is written.
The vision part runs once per tile (batch 1, its fixed size is the tile size); the i-th image token of
the prompt takes the i-th row of the tiles' rows in this order (replace_in_order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...core.errors import InputError

IMAGE_TOKEN, FAKE_TOKEN, GLOBAL_TAG = "<image>", "<fake_token_around_image>", "<global-img>"
MAX_IMAGE_SIDE = 4096     # the processor's absolute cap after the first resize
MAX_GRID = 6              # the processor's tokenizer holds <row_1_col_1> .. <row_6_col_6>


@dataclass(frozen=True)
class TileGrid:
    rows: int          # 0 and 0: not split (the global image only)
    cols: int

    @property
    def tiles(self) -> int:
        """Vision part runs for this image (the tiles and the global image)."""
        return self.rows * self.cols + 1


def _even_longest(height: int, width: int, longest: int) -> tuple[int, int]:
    """_resize_output_size_rescale_to_max_len then _resize_output_size_scale_below_upper_bound."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIDE:
        width, height = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE / aspect)
    elif height > width and height > MAX_IMAGE_SIDE:
        height, width = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE * aspect)
    return max(height, 1), max(width, 1)


def _whole_tiles(height: int, width: int, tile: int) -> tuple[int, int]:
    """resize_for_vision_encoder: both edges up to multiples of the tile, aspect kept on the way."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def tile_grid(width: int, height: int, longest_edge: int, tile: int, splitting: bool = True) -> TileGrid:
    """The grid an image of width x height pixels is cut into (no pixel touched): for the context check."""
    if not splitting:
        return TileGrid(0, 0)
    h, w = _whole_tiles(*_even_longest(height, width, longest_edge), tile)
    if h > tile or w > tile:
        return TileGrid((h - tile) // tile + 1, (w - tile) // tile + 1)
    return TileGrid(0, 0)


def split_image(image, longest_edge: int, tile: int, resample: int, splitting: bool = True):
    """An RGB PIL image → (tiles as PIL images in the processor's order, TileGrid)."""
    if not splitting:
        return [image.resize((tile, tile), resample=resample)], TileGrid(0, 0)
    h, w = _even_longest(image.height, image.width, longest_edge)
    image = image.resize((w, h), resample=resample)
    h, w = _whole_tiles(h, w, tile)
    image = image.resize((w, h), resample=resample)
    grid = TileGrid((h - tile) // tile + 1, (w - tile) // tile + 1) if (h > tile or w > tile) else TileGrid(0, 0)
    tiles = [image.crop((c * tile, r * tile, (c + 1) * tile, (r + 1) * tile))
             for r in range(grid.rows) for c in range(grid.cols)]
    tiles.append(image.resize((tile, tile), resample=resample) if tiles else image)
    return tiles, grid


def normalize(tile, mean, std, rescale_factor: float) -> np.ndarray:
    """A tile → pixel_values float32 [1, 3, S, S] (rescale, then normalize, as the processor does)."""
    x = np.asarray(tile, np.float32) * np.float32(rescale_factor)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def image_text(grid: TileGrid, image_seq_len: int) -> str:
    """What one `<image>` of the prompt becomes (Idefics3Processor.replace_image_token)."""
    tokens = IMAGE_TOKEN * image_seq_len
    global_part = f"{FAKE_TOKEN}{GLOBAL_TAG}{tokens}{FAKE_TOKEN}"
    if grid.rows == 0 and grid.cols == 0:
        return global_part
    text = "".join("".join(f"{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>{tokens}" for c in range(grid.cols)) + "\n"
                   for r in range(grid.rows))
    return f"{text}\n{global_part}"


def expand_prompt(text: str, grids: list[TileGrid], image_seq_len: int) -> str:
    """`text` with its i-th `<image>` replaced by image i's tokens; the count must match the images."""
    pieces = text.split(IMAGE_TOKEN)
    if len(pieces) - 1 != len(grids):
        raise InputError(f"the prompt holds {len(pieces) - 1} {IMAGE_TOKEN} markers for {len(grids)} images",
                         f"write one {IMAGE_TOKEN} per --image where each goes, or none (the images are put first)")
    out = [pieces[0]]
    for grid, piece in zip(grids, pieces[1:]):
        out += [image_text(grid, image_seq_len), piece]
    return "".join(out)

