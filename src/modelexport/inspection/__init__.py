"""`inspect`: one reader per kind of artifact, chosen by a registry of detectors.

Each inspector turns a path into a plain dict (the `--json` output); the CLI renders the dict.
Other modules add inspectors for their formats with `@inspector(...)`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.errors import InputError


@dataclass(frozen=True)
class Inspector:
    name: str
    detect: Callable[[Path], bool]
    read: Callable[[Path], dict]


_inspectors: list[Inspector] = []


def inspector(name: str, detect: Callable[[Path], bool], first: bool = False):
    """Register a reader; `first=True` puts it before the others (a specialisation of a kind,
    e.g. bundles holding a .pte before plain bundles)."""
    def add(read: Callable[[Path], dict]):
        if any(i.name == name for i in _inspectors):
            return read
        ins = Inspector(name, detect, read)
        _inspectors.insert(0, ins) if first else _inspectors.append(ins)
        return read
    return add


# Modules that register readers when imported, in the order they are asked (a `first=True` reader
# goes before the others). A missing module is a bug, not an option: no ImportError is swallowed.
_BUILTIN = ("modelexport.inspection.bundle_inspector", "modelexport.backends.executorch_qnn.inspect",
            "modelexport.frontends.gguf_inspect", "modelexport.backends.ort_qnn.inspect")


def _load_builtin() -> None:
    for mod in _BUILTIN:
        importlib.import_module(mod)


def inspect_path(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p} does not exist", "check the path")
    _load_builtin()
    for ins in _inspectors:
        if ins.detect(p):
            return {"kind": ins.name, "path": str(p)} | ins.read(p)
    raise InputError(f"{p} is not an artifact modelexport can read",
                     "give a bundle folder, a context binary (.bin), an EPContext .onnx, a .pte or a .gguf; "
                     f"known kinds: {', '.join(i.name for i in _inspectors)}")
