"""The whole-bundle memo: an identical compile copies the bundle it wrote before.

The stage caches (quantized model, context binaries; `cache.py`) already skip the work of a
repeated compile, but reaching them costs loading the model, onnx, numpy, pydantic and the QAIRT
libraries: about a second, against ~9 s for MobileNetV2 cold. This memo is consulted first and
touches nothing but the standard library, so a repeat costs hashing the inputs and copying a few
megabytes.

The key covers everything a bundle depends on: each model's absolute path and bytes, the
calibration data's path and bytes, every option, the QAIRT libraries and onnxruntime on disk (path,
size, mtime) and the modelexport code itself (its files' sizes and mtimes), so an upgrade or an
edited source never serves an old bundle. Inputs that cannot be fingerprinted that cheaply (a
PyTorch model, a pipeline file naming other files, an ONNX model with external data, an LLM)
simply skip the memo; their stage caches still apply.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..core.atomic import check_output, replace_path, sibling_temp
from ..core.files import MANIFEST_NAME, sha256_file
from ..core.cache import Cache, cache_key, code_fingerprint

NAMESPACE = "bundle"
ENTRY_BUNDLE = "bundle"
# An ONNX tensor stored outside the file carries a StringStringEntry whose key is "location":
# protobuf field 1, length 8. Finding it means "skip the memo" (a false positive only costs speed).
_EXTERNAL_DATA_MARK = b"\x0a\x08location"
_CALIBRATION_LISTS = (".txt", ".lst", ".list")


def _onnx_fingerprint(model: Any) -> list[str] | None:
    if not isinstance(model, (str, Path)):
        return None
    p = Path(model)
    if p.suffix.lower() != ".onnx" or not p.is_file():
        return None
    data = p.read_bytes()
    if _EXTERNAL_DATA_MARK in data:
        return None
    return [str(p.resolve()), hashlib.sha256(data).hexdigest()]


def _listed_files(listing: Path) -> list[Path] | None:
    """The files an input list names (as `quant.calibration` resolves them), or None if one is missing."""
    out = []
    for line in listing.read_text(errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for tok in line.split():
            rel = tok.partition(":=")[2] or tok
            p = Path(rel) if Path(rel).is_absolute() else listing.parent / rel
            if not p.is_file():
                return None
            out.append(p)
    return out


def _calibration_fingerprint(spec: Any) -> list[str] | None:
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "random"):
        return [str(spec)]
    if not isinstance(spec, (str, Path)):
        return None                              # in-memory arrays: not worth hashing here
    p = Path(spec)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
    elif p.is_file():
        listed = _listed_files(p) if p.suffix.lower() in _CALIBRATION_LISTS else []
        if listed is None:
            return None                          # let the real loader say which file is missing
        files = [p, *listed]
    else:
        return None
    return [str(p.resolve())] + [f"{f.resolve()}={sha256_file(f)}" for f in files]


def _stat_of(path: Path) -> str:
    try:
        st = path.stat()
        return f"{path}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return f"{path}:missing"


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec and spec.origin else None


def _toolchain_fingerprint() -> list[str]:
    """Where the QAIRT libraries and onnxruntime live, by stat (loading them costs ~0.3 s)."""
    out = [f"QNN_SDK_ROOT={os.environ.get('QNN_SDK_ROOT', '')}"]
    sdk = os.environ.get("QNN_SDK_ROOT")
    if sdk:
        out.append(_stat_of(Path(sdk).expanduser() / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"))
    for pkg, pattern in (("onnxruntime_qnn", "libQnn*.so"), ("onnxruntime", "capi/*.so")):
        d = _package_dir(pkg)
        out += [_stat_of(f) for f in sorted(d.glob(pattern))] if d else [f"{pkg}:absent"]
    return out


class BundleMemo:
    """`memo = BundleMemo.for_compile(...)`; `memo.restore(out, force)` or, after a real compile,
    `memo.store(bundle_path)`. `for_compile` returns None when the inputs are not memoizable."""

    def __init__(self, key: str, cache: Cache):
        self.key = key
        self.cache = cache

    @classmethod
    def for_compile(cls, models: list[Any], calibration: Any, options: dict[str, Any]) -> BundleMemo | None:
        if not options.get("use_cache", True) or not models:
            return None
        fingerprints = [_onnx_fingerprint(m) for m in models]
        calib = _calibration_fingerprint(calibration)
        if calib is None or any(f is None for f in fingerprints):
            return None
        opts = {k: v for k, v in sorted(options.items())         # unset (None, []) and given-as-unset hash alike
                if k not in ("use_cache", "jobs", "force", "progress") and v not in (None, [], ())}
        key = cache_key(NAMESPACE, fingerprints, calib, opts, _toolchain_fingerprint(), code_fingerprint())
        return cls(key, Cache())

    def restore(self, output: Path, force: bool) -> Path | None:
        """Copy the memoized bundle to `output` (atomically), marking the copy as a memo hit."""
        entry = self.cache.get(NAMESPACE, self.key)
        if entry is None:
            return None
        t0 = time.perf_counter()
        check_output(output, force)
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = sibling_temp(output)
        try:
            shutil.copytree(entry / ENTRY_BUNDLE, tmp)
            manifest = tmp / MANIFEST_NAME
            data = json.loads(manifest.read_text())   # schema 2 (the code fingerprint keeps older entries out)
            data["cache"] = {"enabled": True, "root": str(self.cache.root), "bundle_memo": True,   # Manifest.cache
                             "hits": 1, "misses": 0}
            data.setdefault("timings", {})["memo_restore_s"] = round(time.perf_counter() - t0, 4)
            manifest.write_text(json.dumps(data, indent=2))   # manifest.json is not in its own file list
            replace_path(tmp, output)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return output

    def store(self, bundle_path: Path) -> None:
        def build(tmp: Path) -> dict:
            shutil.copytree(bundle_path, tmp / ENTRY_BUNDLE)
            return {"kind": NAMESPACE}
        self.cache.get_or_create(NAMESPACE, self.key, build)
