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
