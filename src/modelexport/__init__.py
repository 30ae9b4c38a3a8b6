"""modelexport: audit, quantize, compile, inspect, run and verify models for Snapdragon NPUs (Hexagon HTP)."""
from __future__ import annotations

from .core.lazy import lazy_attributes

# Every name loads on first use: the CLI imports this package on each start, and a cached compile
# must not pay for pydantic, numpy or onnx it never touches.
_LAZY = {**{n: "api" for n in ("audit", "compile", "sweep", "inspect", "run", "verify", "profile")}, "QNNCompiler": "qnn",
         "Bundle": "contract", "open_bundle": "contract", "ModelExportError": "core.errors"}

__getattr__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = ["audit", "compile", "sweep", "run", "verify", "profile", "inspect", "QNNCompiler", "Bundle", "open_bundle", "ModelExportError"]
