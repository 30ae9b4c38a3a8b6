from .bundle import Bundle, BundleWriter, open_bundle
from .manifest import FileEntry, GraphSpec, Manifest, TensorSpec

__all__ = ["Bundle", "BundleWriter", "open_bundle", "Manifest", "GraphSpec", "TensorSpec", "FileEntry"]
