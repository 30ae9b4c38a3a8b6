from __future__ import annotations

from pathlib import Path

from ..contract.bundle import is_bundle, open_bundle
from . import inspector


@inspector("bundle", is_bundle)
def read_bundle(path: Path) -> dict:
    b = open_bundle(path, verify=False)
    problems = b.problems()
    return {"manifest": b.manifest.model_dump(mode="json", exclude_none=True), "integrity": {"ok": not problems, "problems": problems}}
