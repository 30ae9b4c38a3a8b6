"""Bundles (a folder + manifest.json) and atomic writes. Names load on first use so that
`artifacts.atomic` (stdlib only) does not drag pydantic into a cached compile."""
from __future__ import annotations

from typing import Any

_LAZY = {**{n: "bundle" for n in ("Bundle", "BundleWriter", "open_bundle")},
         **{n: "manifest" for n in ("FileEntry", "GraphSpec", "Manifest", "TensorSpec")}}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_LAZY)
