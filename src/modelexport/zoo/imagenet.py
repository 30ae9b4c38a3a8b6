"""ImageNet preprocessing for the sample photos (as torchvision's classification presets do).

Class names are not shipped by any installed package, so results are class indices."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from .assets import sample_images

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def preprocess(path: str | Path, size: int = 224, resize: int = 256) -> np.ndarray:
    """Resize the short side to 256, centre-crop 224, scale to [0,1], normalise: 1x3x224x224 float32."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    scale = resize / min(w, h)
    img = img.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    img = img.crop((left, top, left + size, top + size))
    x = (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def top1(logits: np.ndarray) -> int:
    return int(np.asarray(logits).reshape(-1).argmax())


def save_sample_photos(folder: str | Path) -> dict[str, np.ndarray]:
    """The bundled sample photos, preprocessed, saved as `<name>.npy` in `folder` (a calibration
    folder for MobileNetV2's `image` input); → {name: array}."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    photos = {}
    for name, path in sample_images().items():
        photos[name] = preprocess(path)
        np.save(folder / f"{name}.npy", photos[name])
    return photos
