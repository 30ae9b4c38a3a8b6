"""Names and hashing every bundle reader shares; standard library only, so a cached compile can
use them without importing the manifest's pydantic models."""
from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST_NAME = "manifest.json"
REPORT_NAME = "report.html"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_onnx(path: Path) -> str:
    """An ONNX model's hash with its external weights (`<name>.data` beside it, as our exports write
    them): the .onnx alone is the same for two models of one shape, so a cache keyed on it would
    hand one model's compiled binary to the other."""
    data = path.with_name(path.name + ".data")
    if not data.is_file():
        return sha256_file(path)
    return hashlib.sha256(f"{sha256_file(path)}:{sha256_file(data)}".encode()).hexdigest()
