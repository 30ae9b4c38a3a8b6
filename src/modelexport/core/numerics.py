"""How close compiled outputs are to the float reference."""
from __future__ import annotations

import numpy as np


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """10·log10(signal power / error power); +inf when identical."""
    ref = np.asarray(ref, dtype=np.float64).ravel()
    with np.errstate(all="ignore"):             # inf - inf is NaN: counted as no match below
        err = ref - np.asarray(got, dtype=np.float64).ravel()
        noise = float(np.sum(err * err))
        signal = float(np.sum(ref * ref))
    if not np.isfinite(noise):                  # inf or NaN in the compiled output: nothing matches
        return float("-inf")
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * np.log10(signal / noise)


def cosine(ref: np.ndarray, got: np.ndarray) -> float | None:
    """Cosine similarity; None for fewer than 2 values, where it is ±1 whatever the error."""
    a = np.asarray(ref, dtype=np.float64).ravel()
    b = np.asarray(got, dtype=np.float64).ravel()
    if a.size < 2:
        return None
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    if not (np.isfinite(na) and np.isfinite(nb)):
        return None                             # inf or NaN: not defined
    with np.errstate(all="ignore"):
        return float(np.dot(a, b) / (na * nb))


def max_abs(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(ref, dtype=np.float64) - np.asarray(got, dtype=np.float64)))) if np.size(ref) else 0.0


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    return {"sqnr_db": sqnr_db(ref, got), "cosine": cosine(ref, got), "max_abs_error": max_abs(ref, got),
            "ref_abs_max": float(np.max(np.abs(ref))) if np.size(ref) else 0.0}


def class_axis(shape: tuple[int, ...]) -> int | None:
    """The axis whose argmax is a class choice, or None where no axis is one. [N, C] scores and
    [N, T, C] sequences (OCR, tokens): the last. Rank-4 maps: the channel axis, NCHW or NHWC, when it
    holds several classes and is shorter than both spatial axes; a one-channel map (a detector's
    probability map, a depth map) has no class to choose, and the argmax over its width means nothing."""
    if len(shape) in (2, 3):
        return len(shape) - 1 if shape[-1] > 1 else None
    if len(shape) == 4:
        if 1 < shape[1] < min(shape[2], shape[3]):
            return 1
        if 1 < shape[3] < min(shape[1], shape[2]):
            return 3
    return None


def argmax_agreement(ref: np.ndarray, got: np.ndarray, sample_shape: tuple[int, ...]) -> float | None:
    """The share of positions where the class chosen agrees: `ref` and `got` are samples of an output
    of `sample_shape` stacked on a new first axis; None where that output has no class axis."""
    axis = class_axis(tuple(sample_shape))
    if axis is None or ref.shape != got.shape or ref.shape[1:] != tuple(sample_shape):
        return None
    return float(np.mean(ref.argmax(axis + 1) == got.argmax(axis + 1)))
