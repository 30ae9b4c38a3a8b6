"""`inspect`: one reader per kind of artifact, chosen by a registry of detectors.

Each inspector turns a path into a plain dict (the `--json` output); the CLI renders the dict.
Other modules add inspectors for their formats with `@inspector(...)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from ..core.errors import InputError
from ..core.plugins import load_plugins


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


def inspect_path(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p} does not exist", "check the path")
    load_plugins("inspector")      # the readers register themselves (core.plugins)
    for ins in _inspectors:
        if ins.detect(p):
            return {"kind": ins.name, "path": str(p)} | ins.read(p)
    raise InputError(f"{p} is not an artifact modelexport can read",
                     "give a bundle folder, a context binary (.bin), an EPContext .onnx, a .pte or a .gguf; "
                     f"known kinds: {', '.join(i.name for i in _inspectors)}")
