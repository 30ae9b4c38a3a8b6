"""torch.export with errors a user can act on: the exporter's reason, shortened, with the module path.

When torch.export cannot capture a module (data-dependent control flow, unsupported Python), its
message is long and names no module. The traceback still holds the frames of the user's
`forward` methods; the innermost one whose `self` is a submodule of the model gives the module
path (`blocks.1`), its class, file and line.
"""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import InputError
from ..toolchain.native_io import capture_native_output
from .torch_nested import forward_params


@dataclass(frozen=True)
class TorchIO:
    """One tensor input of a module's forward, in the shape calibration readers expect."""
    name: str
    static_shape: tuple[int, ...]
    dtype: str                          # numpy dtype name

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.static_shape), "dtype": self.dtype}


def input_specs(module, example_inputs: tuple, names: list[str] | None = None) -> list[TorchIO]:
    """One TorchIO per (flat) example input, named by `names` (flattened nested inputs) or forward's parameters."""
    import torch
    params = names or forward_params(module)
    out = []
    for i, x in enumerate(example_inputs):
        name = params[i] if i < len(params) else f"input_{i}"
        if not isinstance(x, torch.Tensor):
            raise InputError(f"example input {name} is a {type(x).__name__}; the inputs of a compiled model are tensors",
                             "make non-tensor arguments constants of the module (attributes or defaults)")
        out.append(TorchIO(name, tuple(int(d) for d in x.shape), str(torch.empty(0, dtype=x.dtype).numpy().dtype)))
    return out


def _module_names(root) -> dict[int, str]:
    return {id(m): name for name, m in root.named_modules()}


def _innermost_user_frame(exc: BaseException, root) -> tuple[str | None, str | None, str | None]:
    """(module path, 'Class.forward at file:line', source line) of the deepest frame inside the model."""
    names = _module_names(root)
    found = (None, None, None)
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        me = frame.f_locals.get("self")
        fname = frame.f_code.co_filename
        if me is not None and id(me) in names and "/torch/" not in fname.replace("\\", "/"):
            line = linecache.getline(fname, tb.tb_lineno).strip()
            where = f"{type(me).__name__}.{frame.f_code.co_name} at {Path(fname).name}:{tb.tb_lineno}"
            found = (names[id(me)] or "<root>", where, line or None)
        tb = tb.tb_next
    return found


_KINDS = (
    (re.compile(r"data-dependent|GuardOnDataDependent|Could not guard on data-dependent", re.I),
     "data-dependent control flow",
     "replace Python `if`/`while` on tensor values with torch.where / torch.cond, or move that logic out of forward()"),
    (re.compile(r"Dynamic control flow|dynamic control", re.I), "dynamic control flow",
     "use torch.cond, or make the branch depend on shapes or constants only"),
    (re.compile(r"Unsupported|not supported|graph break", re.I), "Python that torch.export cannot trace",
     "rewrite the construct named above, or mark that code as a leaf"),
)


def _short_reason(exc: BaseException) -> str:
    text = str(exc).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    first = re.sub(r"\s*\(unhinted:.*?\)", "", first)
    return first[:240]


def export_error(exc: BaseException, root, source: str) -> InputError:
    path, where, line = _innermost_user_frame(exc, root)
    text = f"{type(exc).__name__}: {exc}"
    kind, fix = "a construct it cannot trace", "see the reason, change that code, and try again"
    for pattern, k, f in _KINDS:
        if pattern.search(text):
            kind, fix = k, f
            break
    at = f" in module {path} ({where}" + (f": `{line}`" if line else "") + ")" if path else ""
    return InputError(f"torch.export cannot capture {source}{at}: {kind} — {_short_reason(exc)}", fix)


def export_program(module, example_inputs: tuple, source: str = "<nn.Module>", dynamic_shapes: Any = None):
    """torch.export.export (non-strict) → ExportedProgram; an InputError naming the module on failure."""
    import torch
    try:
        with capture_native_output():  # the exporter prints graphs and hints to stderr on failure
            return torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:  # torch raises many types; every one is the model's, not ours
        raise export_error(e, module, source) from None


def to_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy()
