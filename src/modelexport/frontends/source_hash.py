"""The content address of an LLM source (a GGUF file or a Hugging Face folder), as compile records it in
the manifest, and the check a later step makes before it re-reads that source by its recorded path."""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..core.errors import InputError, IntegrityError
from ..core.file_hash import file_sha256


def _hf_sha(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        if f.is_file() and (f.suffix in (".json", ".safetensors", ".model", ".txt", ".jinja")):
            h.update(f.name.encode() + file_sha256(f).encode())
    return h.hexdigest()


def source_sha256(p: Path) -> str:
    """The content address of a GGUF file or an HF folder, as compile records it in the manifest."""
    return file_sha256(p) if p.is_file() else _hf_sha(p)


def recorded_source(manifest, why: str) -> Path:
    """The model a bundle was compiled from, re-read by a later step (`why`): it must still be at its
    recorded path with its recorded sha256, or the numbers would describe another model."""
    src = Path(manifest.source.path or "")
    if not manifest.source.path or not src.exists():
        raise InputError(f"the bundle's source model {src} is gone: {why} needs the float model",
                         "put the model back at that path (or recompile the bundle from where it is now)")
    if manifest.source.sha256 and source_sha256(src) != manifest.source.sha256:
        raise IntegrityError(f"the bundle's source model {src} changed since it was compiled "
                             f"(sha256 {manifest.source.sha256[:12]}... then, {source_sha256(src)[:12]}... now)",
                             "put back the model the bundle was compiled from, or recompile the bundle from this one")
    return src
