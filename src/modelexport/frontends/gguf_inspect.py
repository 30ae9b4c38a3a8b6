"""`modelexport inspect model.gguf`: architecture, sizes, tensors with quant types, tokenizer,
chat template, context length (header only: no weights are read)."""
from __future__ import annotations

from pathlib import Path

from ..core.errors import InputError
from ..inspection import inspector
from .gguf_file import read_gguf_info
from .llm_families import SUPPORTED_GGUF_ARCHITECTURES, family_of_gguf


def _is_gguf(p: Path) -> bool:
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


@inspector("gguf", _is_gguf)
def inspect_gguf(p: Path) -> dict:
    info = read_gguf_info(p)
    d = info.to_dict()
    d["supported_architectures"] = list(SUPPORTED_GGUF_ARCHITECTURES)
    try:   # the family row the builders will use (from the header: no weights are read)
        d["family"] = family_of_gguf(info.architecture, info.rope_scaling_type, str(p)).facts()
        problem = info.rope_scaling_problem
        if problem:
            d["supported"] = False
    except InputError as e:
        d["family"], d["supported"], problem = None, False, e.problem
    d["note"] = ("compile it: modelexport compile MODEL.gguf --target SM8650 --variants ar1,ar32 --max-seq-len 512 -o OUT"
                 if problem is None else problem)
    return d
