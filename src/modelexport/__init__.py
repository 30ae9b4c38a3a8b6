"""modelexport: audit, quantize, compile, inspect, run and verify models for Snapdragon NPUs (Hexagon HTP)."""
from __future__ import annotations

from typing import Any

# Every name loads on first use: the CLI imports this package on each start, and a cached compile
# must not pay for pydantic, numpy or onnx it never touches.
_LAZY = {**{n: "api" for n in ("audit", "compile", "inspect", "run", "verify", "QNNCompiler")},
         "Bundle": "artifacts", "open_bundle": "artifacts", "ModelExportError": "errors"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["audit", "compile", "run", "verify", "inspect", "QNNCompiler", "Bundle", "open_bundle", "ModelExportError"]
