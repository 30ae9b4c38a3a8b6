"""M-RoPE positions (Qwen2-VL): each token has a (temporal, height, width) position triple that picks
its RoPE angles, one axis per section of the rotary frequencies (frontends/llm_families.mrope_sections).

A decoder built for M-RoPE (`StaticDecoder.mrope`) takes them as `rope_position_ids` int32 [3, 1, N]
beside `position_ids` [1, N], which stays the cache slot and the mask's position (slot p = the p-th
token). Text tokens have three equal axes; an image's tokens get its merged grid (t, row, column)
offset by where the image starts, and the text after it continues from the image's largest position + 1:
transformers' `Qwen2VLModel.get_rope_index`. So after the prompt, slot p has the position
p + delta on every axis (delta = the prompt's largest position + 1 - its length: 0 for text alone).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ...core.errors import InputError

ROPE_POSITION_IDS = "rope_position_ids"
AXES = 3


@dataclass(frozen=True)
class RopePositions:
    """The 3-axis positions of a sequence's first slots (`rows` [3, T]) and the offset of every later slot."""

    rows: np.ndarray
    delta: int = 0

    @classmethod
    def text(cls) -> "RopePositions":
        """Plain text: every axis is the slot."""
        return cls(np.zeros((AXES, 0), np.int64), 0)

    def __call__(self, position_ids) -> np.ndarray:
        """int32 [3, 1, N] for the slots `position_ids` [1, N]."""
        slots = np.asarray(position_ids, np.int64).reshape(-1)
        out = np.repeat((slots + self.delta)[None], AXES, axis=0)
        known = slots < self.rows.shape[1]
        out[:, known] = self.rows[:, slots[known]]
        return out[:, None, :].astype(np.int32)


def rope_index(ids, image_token_id: int, grid_thw: tuple[int, int, int], merge: int) -> RopePositions:
    """`get_rope_index` for one sequence whose every run of image tokens is one image of the patch grid
    `grid_thw` (t, h, w) merged by `merge` x `merge`: text runs count on from the current position, an
    image run takes t x (h/merge) x (w/merge) grid positions from it and moves it on by max(h, w) / merge."""
    t, h, w = (int(grid_thw[0]), int(grid_thw[1]) // merge, int(grid_thw[2]) // merge)
    is_image = [int(i) == int(image_token_id) for i in ids]
    parts, pos = [], 0
    for image, run in itertools.groupby(is_image):
        n = len(list(run))
        if not image:
            parts.append(np.repeat((np.arange(n) + pos)[None], AXES, axis=0))
            pos += n
            continue
        if n % (t * h * w):
            raise InputError(f"a run of {n} image tokens is not a whole number of images of {t * h * w} tokens",
                             "put exactly one image's tokens into the prompt")
        for _ in range(n // (t * h * w)):
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            parts.append(np.stack([tt, hh, ww]).reshape(AXES, -1) + pos)
            pos += max(h, w)
    rows = np.concatenate(parts, axis=1) if parts else np.zeros((AXES, 0), np.int64)
    return RopePositions(rows.astype(np.int64), int(rows.max()) + 1 - len(ids) if len(ids) else 0)
