"""`modelexport inspect` of a CPU program: its cache folder (`model.pte` + `llm.json`), or the
`model.pte` in it. Shows what `llm.json` records: how the weights are held (a GGUF's blocks as
stored, or quantized from float), which of our kernel fusions it got, the options, the source
and its sha256, sizes and build times."""
from __future__ import annotations

import json
from pathlib import Path

from ...inspection import inspector
from .export import META_NAME, PTE_NAME


def _program_folder(p: Path) -> Path | None:
    folder = p if p.is_dir() else p.parent if p.name == PTE_NAME else None
    if folder is not None and (folder / META_NAME).is_file() and (folder / PTE_NAME).is_file():
        return folder
    return None


@inspector("cpu-llm-program", lambda p: _program_folder(p) is not None, first=True)
def inspect_cpu_program(p: Path) -> dict:
    folder = _program_folder(p)
    meta = json.loads((folder / META_NAME).read_text())
    keys = ("weights", "kernels", "architecture", "source", "source_sha256", "options", "n_layers", "vocab_size",
            "max_seq_len", "bytes", "export_seconds", "format_version")
    return {"program": str(folder / PTE_NAME), **{k: meta[k] for k in keys if k in meta}}
