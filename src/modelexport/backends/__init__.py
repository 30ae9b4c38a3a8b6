"""Backends: one package per bundle format, each compiling a kind of loaded model into a bundle.

    ort_qnn/         "onnx"  → EPContext models + QNN context binaries (ONNX Runtime's QNN EP)
    executorch_qnn/  "torch" → .pte with the QNN delegate (ExecuTorch)
    llm_qnn/         "llm"   → ar-N static decoders, weight-shared context binaries, Genie config
                             (`--format pte`, backend llm_pte: the same bundle with qnn_llama_runner's .pte)

Each registers itself with `@backend(name, kinds, formats, options, default_precision)` (its
compile module is named by its row in `core.formats`, which `core.plugins` imports); `modelexport.compile`
picks the backend by the frontend's kind and checks the keywords against the backend's options type.
A new format is one new package, one row in `core.formats.FORMATS` and its word in `core.vocab.Format`.
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
    precisions: tuple[str, ...] = ()   # names in quant.precision's table it compiles; () = all
    only_by_format: bool = False       # picked only when its format is asked for (not its kind's default)

    @property
    def default_format(self) -> str:
        return self.formats[0] if self.formats else "context-binary"


BACKENDS: Registry[Backend] = Registry("backend", plugins="backend")


def backend(name: str, kinds: tuple[str, ...], description: str = "", formats: tuple[str, ...] = (),
            options: type[CompileOptions] = CompileOptions, default_precision: str = "8a8w",
            precisions: tuple[str, ...] = (), only_by_format: bool = False):
    def add(fn: Callable[..., object]):
        BACKENDS.register(name)(Backend(name, kinds, fn, description, formats, options, default_precision, precisions,
                                        only_by_format))
        return fn
    return add


KIND_LABELS = {"onnx": "ONNX", "torch": "PyTorch", "llm": "LLM"}


def _kinds_label(kinds) -> str:
    order = list(KIND_LABELS)
    ordered = sorted(set(kinds), key=lambda k: order.index(k) if k in order else len(order))
    return " and ".join(KIND_LABELS.get(k, k) for k in ordered)


def check_offered(be: Backend, kind: str, output_format: str | None = None, precisions=()) -> None:
    """A format or precision documented for another kind of model (`--format pte` or
    `-p 16a4w_block` on an ONNX model) is said to be that kind's, with this backend's own choices;
    only a value no backend offers is called unknown."""
    from ..quant.precision import PRECISIONS, get_precision
    me = _kinds_label([kind])
    if output_format and be.formats and output_format not in be.formats:
        owners = [k for _, b in BACKENDS for k in b.kinds if output_format in b.formats and k != kind]
        if not owners and any(output_format in b.formats for _, b in BACKENDS):   # this kind's, another backend's
            raise InputError(f"--format {output_format} is not written by {be.name}",
                             f"{be.name} writes: {', '.join(be.formats)} (or leave --format out)")
        if not owners:
            every = sorted({f for _, b in BACKENDS for f in b.formats})
            raise InputError(f"unknown format {output_format!r}", f"choose one of: {', '.join(every)}")
        raise InputError(f"--format {output_format} is for {_kinds_label(owners)} models, not {me} ones",
                         f"{me} models compile to: {', '.join(be.formats)} (or leave --format out)")
    for name in precisions:
        if not name:
            continue
        p = get_precision(name).name          # an unknown spelling fails here, with the whole table
        offered = be.precisions or tuple(PRECISIONS)
        if p not in offered:
            owners = [k for _, b in BACKENDS for k in b.kinds if p in (b.precisions or tuple(PRECISIONS))]
            if kind in owners:   # another format of the same kind takes it
                raise InputError(f"--format {output_format or be.default_format} of {me} models takes precision "
                                 f"{', '.join(offered)}, not {p}",
                                 f"use --precision {offered[0]} (its default), or leave --format out for a format that takes {p}")
            raise InputError(f"precision {p} is for {_kinds_label(owners)} models, not {me} ones",
                             f"{me} models take: {', '.join(offered)}")


def backend_for_kind(kind: str, name: str | None = None, output_format: str | None = None) -> Backend:
    """The named backend, else the first for `kind` that writes `output_format`, else the kind's first."""
    if name:
        b = BACKENDS.get(name)
        if kind not in b.kinds:
            raise InputError(f"backend {name!r} compiles {', '.join(b.kinds)} models, not {kind}",
                             "leave --backend out to pick the right one")
        return b
    for _, b in BACKENDS:
        if kind in b.kinds and output_format and output_format in b.formats:
            return b
    for _, b in BACKENDS:
        if kind in b.kinds and not b.only_by_format:
            return b
    raise InputError(f"no backend compiles {kind} models yet", f"backends: {', '.join(BACKENDS.names())}")
