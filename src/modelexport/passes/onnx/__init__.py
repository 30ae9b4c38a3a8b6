"""Repairs of ONNX graphs, applied before quantization to every ONNX model (not opt-in).

Each repair is one file here registering itself with `@onnx_repair(name, order)`. A repair takes
the model (an onnx.ModelProto, changed in place) and the user's fixed input values, and returns
what it did (recorded in the manifest as `parts[].repairs`) or None when the model did not need
it. Which repairs exist is decided by what real models ship with and the real toolchain refuses
(the corpus in zoo/real_onnx.py), not by guides.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.registry import Registry


@dataclass
class RepairContext:
    input_values: dict[str, Any] = field(default_factory=dict)   # name → numpy array the user fixed
    quantized: bool = False                      # the model will be quantized (QDQ) after the repairs
    activation_bits: int = 0                     # its activations' bits when quantized (8 or 16), else 0
    weight_bits: int = 0                         # its weights' bits when quantized (4, 8 or 16), else 0
    detached_metadata: list[tuple[str, str]] = field(default_factory=list)  # re-attached to the written models


@dataclass(frozen=True)
class OnnxRepair:
    name: str
    order: int                                   # repairs run by ascending order
    description: str
    run: Callable[[Any, RepairContext], dict | None]


REPAIRS: Registry[OnnxRepair] = Registry("ONNX repair")


def onnx_repair(name: str, order: int, description: str):
    def add(fn):
        REPAIRS.register(name)(OnnxRepair(name, order, description, fn))
        return fn
    return add


def all_repairs() -> list[OnnxRepair]:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return sorted((r for _, r in REPAIRS), key=lambda r: r.order)


def apply_repairs(model, ctx: RepairContext) -> list[dict]:
    """Run every repair in order on `model` (in place); the records of those that changed it."""
    done = []
    for r in all_repairs():
        record = r.run(model, ctx)
        if record is not None:
            done.append({"name": r.name, **record})
    return done
