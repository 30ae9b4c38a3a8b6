"""Registers the PyTorch inputs (kind "torch"): an nn.Module, `model.py:factory`, a `.pt2`.

The loaders themselves are in torch_module.py; this file only says which inputs they accept, so
`modelexport.compile` / `audit` dispatch a PyTorch model to the backend registered for "torch".
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..core.errors import InputError
from . import find_frontend, frontend
from .torch_module import LoadedModule, from_module, load_factory, load_pt2


def _is_factory(obj: Any) -> bool:
    if not isinstance(obj, (str, Path)):
        return False
    file_part, sep, func = str(obj).rpartition(":")
    return bool(sep) and file_part.endswith(".py") and func.isidentifier()


def _is_pt2(obj: Any) -> bool:
    return isinstance(obj, (str, Path)) and str(obj).lower().endswith(".pt2")


def _is_module(obj: Any) -> bool:
    if isinstance(obj, LoadedModule):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


@frontend("torch_factory", kind="torch", accepts=_is_factory)
def _load_factory(obj: Any, example_inputs: Any = None) -> LoadedModule:
    return load_factory(str(obj))


@frontend("torch_pt2", kind="torch", accepts=_is_pt2)
def _load_pt2(obj: Any, example_inputs: Any = None) -> LoadedModule:
    return load_pt2(obj)


@frontend("torch_module", kind="torch", accepts=_is_module)
def _load_module(obj: Any, example_inputs: Any = None) -> LoadedModule:
    if isinstance(obj, LoadedModule):
        return obj
    return from_module(obj, example_inputs)


def load_torch(obj: Any, example_inputs: Any = None) -> LoadedModule:
    """Any PyTorch input → LoadedModule (module in eval mode, example inputs, source, sha256)."""
    fe = find_frontend(obj)
    if fe.kind != "torch":
        raise InputError(f"{obj!r} is a {fe.kind} model, not a PyTorch one", "give an nn.Module, model.py:factory or a .pt2 file")
    return fe.load(obj, example_inputs)
