"""modelexport: audit, quantize, compile, inspect, run and verify models for Snapdragon NPUs (Hexagon HTP)."""
from __future__ import annotations

from .api import QNNCompiler, audit, compile, inspect, run, verify
from .artifacts import Bundle, open_bundle
from .errors import ModelExportError

__all__ = ["audit", "compile", "run", "verify", "inspect", "QNNCompiler", "Bundle", "open_bundle", "ModelExportError"]
