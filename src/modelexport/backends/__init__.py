"""Backends: one package per bundle format, each compiling a kind of loaded model into a bundle.

    ort_qnn/         "onnx"  → EPContext models + QNN context binaries (ONNX Runtime's QNN EP)
    executorch_qnn/  "torch" → .pte with the QNN delegate (ExecuTorch)
    llm_qnn/         "llm"   → ar-N static decoders, weight-shared context binaries, Genie config

Each registers itself with `@backend(name, kinds, formats, options, default_precision)` (its
compile module is listed in `core.plugins`); `modelexport.compile` picks the backend by the
frontend's kind and checks the keywords against the backend's options type. A new format is one
new package and one line in the plugin table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..core.errors import InputError
from ..core.registry import Registry
from .spec import CompileOptions


@dataclass(frozen=True)
class Backend:
    name: str
    kinds: tuple[str, ...]
    compile: Callable[..., object]
    description: str = ""
    formats: tuple[str, ...] = ()      # output formats it writes, default first
    options: type[CompileOptions] = CompileOptions   # the keyword options its compile takes
    default_precision: str = "8a8w"

    @property
    def default_format(self) -> str:
        return self.formats[0] if self.formats else "context-binary"


BACKENDS: Registry[Backend] = Registry("backend", plugins="backend")


def backend(name: str, kinds: tuple[str, ...], description: str = "", formats: tuple[str, ...] = (),
            options: type[CompileOptions] = CompileOptions, default_precision: str = "8a8w"):
    def add(fn: Callable[..., object]):
        BACKENDS.register(name)(Backend(name, kinds, fn, description, formats, options, default_precision))
        return fn
    return add


def backend_for_kind(kind: str, name: str | None = None) -> Backend:
    if name:
        b = BACKENDS.get(name)
        if kind not in b.kinds:
            raise InputError(f"backend {name!r} compiles {', '.join(b.kinds)} models, not {kind}",
                             "leave --backend out to pick the right one")
        return b
    for _, b in BACKENDS:
        if kind in b.kinds:
            return b
    raise InputError(f"no backend compiles {kind} models yet", f"backends: {', '.join(BACKENDS.names())}")
