"""Frontends: turn what the user gives (a path, a torch module, ...) into a loaded model.

Each frontend registers itself with `@frontend(name, accepts=...)`; `load_model` picks the first
that accepts the input, so supporting a new input kind is one new registration (e.g. a torch
`nn.Module` frontend for the ExecuTorch backend).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.errors import InputError
from ..core.registry import Registry


@dataclass(frozen=True)
class Frontend:
    name: str
    kind: str                          # what it produces: "onnx", "torch", "llm", ...
    accepts: Callable[[Any], bool]
    load: Callable[..., Any]


FRONTENDS: Registry[Frontend] = Registry("frontend", plugins="frontend")


def frontend(name: str, kind: str, accepts: Callable[[Any], bool]):
    def add(load: Callable[..., Any]):
        FRONTENDS.register(name)(Frontend(name, kind, accepts, load))
        return load
    return add


def find_frontend(obj: Any) -> Frontend:
    for _, fe in FRONTENDS:
        if fe.accepts(obj):
            return fe
    what = str(obj) if isinstance(obj, (str, Path)) else f"a {type(obj).__name__}"
    if isinstance(obj, (str, Path)) and not Path(str(obj).split(":", 1)[0]).exists():   # model.py:FUNCTION names a file too
        raise InputError(f"{what} does not exist", "check the path")
    if str(obj).endswith(".py"):
        raise InputError(f"{what}: a Python file needs the name of the function that builds the model",
                         f"write {what}:FUNCTION (it returns the module and its example inputs)")
    raise InputError(f"modelexport cannot load {what}",
                     "give an ONNX model (.onnx), model.py:FUNCTION, an exported program (.pt2), a GGUF file, "
                     "a Hugging Face folder, or in Python an nn.Module with example inputs")
