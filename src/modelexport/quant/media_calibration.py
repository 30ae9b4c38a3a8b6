"""Calibration from the files a user has, by modality: photos for an image input, .wav files for an
audio input (`--calibration photos/`, `--calibration speech/`).

An image input is a 4-D float input with 1 or 3 channels first (N, C, H, W) or last (N, H, W, C):
each photo is converted to RGB (or grey; --image-bgr: B, G, R), resized to H × W, scaled to 0..1 and
normalized with --image-mean / --image-std (default none: 0..1 pixels). An audio input is a float input with one
dimension longer than 1 (the samples: [1, N], [1, N, 1], [1, 1, N]): each file is mixed to mono,
scaled to -1..1 and cut or zero-padded to N samples; its sample rate is kept (resample the file
if the model wants another).
"""
from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..core.errors import CalibrationError

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
AUDIO_EXTS = (".wav",)
MEDIA_EXTS = IMAGE_EXTS + AUDIO_EXTS


@dataclass(frozen=True)
class MediaOptions:
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)      # on 0..1 pixels, in the model's channel order
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    bgr: bool = False                              # channels B, G, R (models trained on OpenCV-read images)


def is_media(path: Path) -> bool:
    return path.suffix.lower() in MEDIA_EXTS


def media_sample(path: Path, name: str, shape: tuple[int, ...], dtype: np.dtype, opts: MediaOptions) -> np.ndarray:
    """One photo or recording → the array for input `name` of `shape`."""
    if path.suffix.lower() in AUDIO_EXTS:
        return audio_array(path, name, shape, dtype)
    return image_array(path, name, shape, dtype, opts)


def image_layout(shape: tuple[int, ...]) -> str | None:
    """NCHW, NHWC, or None when the shape is not an image's."""
    if len(shape) != 4:
        return None
    if shape[1] in (1, 3) and shape[2] > 3 and shape[3] > 3:
        return "NCHW"
    if shape[3] in (1, 3) and shape[1] > 3 and shape[2] > 3:
        return "NHWC"
    return None


def image_array(path: Path, name: str, shape, dtype, opts: MediaOptions) -> np.ndarray:
    layout = image_layout(tuple(shape))
    if layout is None or not np.issubdtype(dtype, np.floating):
        raise CalibrationError(f"{path.name} is an image, but input {name!r} is not: it takes {np.dtype(dtype).name} "
                               f"{list(shape)} (an image input is float N×C×H×W or N×H×W×C with 1 or 3 channels)",
                               "give .npy/.npz arrays of that shape with --calibration DIR (or `random`)")
    c, h, w = (shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2])
    try:
        img = Image.open(path).convert("RGB" if c == 3 else "L").resize((w, h), Image.BILINEAR)
    except OSError as e:
        raise CalibrationError(f"{path} is not an image Pillow can read ({e})", "give PNG or JPEG files") from None
    x = np.asarray(img, dtype=np.float32).reshape(h, w, c) / 255.0
    if opts.bgr and c == 3:
        x = x[..., ::-1]
    x = (x - np.asarray(opts.mean[:c], np.float32)) / np.asarray(opts.std[:c], np.float32)
    x = x.transpose(2, 0, 1) if layout == "NCHW" else x
    return x[None].astype(dtype)


def audio_array(path: Path, name: str, shape, dtype) -> np.ndarray:
    long = [i for i, d in enumerate(shape) if d > 1]
    if len(long) != 1 or not np.issubdtype(dtype, np.floating):
        raise CalibrationError(f"{path.name} is audio, but input {name!r} is not a waveform: it takes "
                               f"{np.dtype(dtype).name} {list(shape)} (a waveform input is float with one long axis, "
                               "e.g. [1, 16000])", "give .npy/.npz arrays of that shape with --calibration DIR (or `random`)")
    try:
        with wave.open(str(path)) as f:
            width, channels, frames = f.getsampwidth(), f.getnchannels(), f.readframes(f.getnframes())
    except (wave.Error, EOFError) as e:
        raise CalibrationError(f"{path} is not a PCM .wav file ({e})", "convert it, e.g. `sox in.mp3 -b 16 out.wav`") from None
    kinds = {1: (np.uint8, 128.0, 128.0), 2: (np.int16, 0.0, 32768.0), 4: (np.int32, 0.0, 2147483648.0)}
    if width not in kinds:
        raise CalibrationError(f"{path}: {8 * width}-bit samples are not read here", "convert it to 16-bit PCM (sox -b 16)")
    kind, offset, scale = kinds[width]
    pcm = (np.frombuffer(frames, kind).astype(np.float32) - offset) / scale
    mono = pcm.reshape(-1, channels).mean(axis=1)
    n = shape[long[0]]
    mono = mono[:n] if mono.size >= n else np.pad(mono, (0, n - mono.size))
    return mono.reshape(shape).astype(dtype)
