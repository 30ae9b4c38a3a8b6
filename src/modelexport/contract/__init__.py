"""Bundles (a folder + manifest.json) and atomic writes. Names load on first use so that
`core.atomic` (stdlib only) does not drag pydantic into a cached compile."""
from __future__ import annotations

from ..core.lazy import lazy_attributes

_LAZY = {**dict.fromkeys(("Bundle", "BundleWriter", "open_bundle"), "bundle"),
         **dict.fromkeys(("FileEntry", "GraphSpec", "Manifest", "TensorSpec"), "manifest")}

__getattr__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = list(_LAZY)
