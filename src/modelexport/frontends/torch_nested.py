"""Modules whose forward takes nested inputs (an LSTM's `(x, (h0, c0))`) → flat tensor inputs.

The HTP graph, the .pte and the bundle take flat tensors; so the module is given a forward that
takes the flattened leaves and rebuilds the nesting before calling the user's forward. It is a
shallow copy whose class derives from the user's (same parameters, same submodules, so module
paths such as `lstm.layers.0` stay as they were) — the user's module is left untouched. Leaves
are named by `core.nested` (`hx_0`, `hx_1`), and those names are the bundle's input names.
"""
from __future__ import annotations

import copy
import inspect
from typing import Any

from ..core.errors import InputError
from ..core.nested import flatten_args, is_nested, template, unflatten


def forward_params(module) -> list[str]:
    """The positional parameter names of module.forward (empty when it cannot be read)."""
    try:
        return [p.name for p in inspect.signature(module.forward).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []


def flatten_module_inputs(module, example_inputs: tuple) -> tuple[Any, tuple, list[str] | None]:
    """→ (module, flat example inputs, their names); unchanged (names None) when nothing is nested."""
    import torch
    if not is_nested(example_inputs):
        return module, tuple(example_inputs), None
    leaves = flatten_args(example_inputs, forward_params(module))
    for name, v in leaves:
        if not isinstance(v, torch.Tensor):
            raise InputError(f"example input {name} is a {type(v).__name__}; the inputs of a compiled model are tensors",
                             "make non-tensor arguments constants of the module (attributes or defaults)")
    tmpl = template(tuple(example_inputs))
    cls = type(module)

    def forward(self, *flat):
        return cls.forward(self, *unflatten(tmpl, flat))

    flat = copy.copy(module)
    flat.__class__ = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__,
                                                 "__qualname__": cls.__qualname__})
    return flat, tuple(v for _, v in leaves), [n for n, _ in leaves]
