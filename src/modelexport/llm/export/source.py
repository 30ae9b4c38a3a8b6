"""Checks on an LLM source (GGUF file or HF folder) that need no weights: done before any work,
so a bad input costs nothing and leaves nothing behind."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ...core.cache import Cache
from ...core.errors import InputError
from ...core.file_hash import file_sha256
from ...frontends.gguf_file import check_gguf_header, check_gguf_tensors, check_rope_scaling, read_gguf_info
from ...frontends.hf_folder import check_hf_files, read_hf_config
from ...frontends.llm_families import (LLMFamily, check_model_context, check_static_context, family_of,
                                       family_of_gguf)
from ...frontends.source_hash import source_sha256


@dataclass
class SourceFacts:
    path: Path
    format: str               # gguf | hf
    architecture: str
    context_length: int | None
    sha256: str
    shape: dict = field(default_factory=dict)   # config.json / GGUF metadata: what the plan and estimate need
    weights_dtype: str = "float32"             # how the source stores its weights (bf16 stays bf16 in memory)
    family: LLMFamily | None = None            # its row in the family table (check_source reads it before any weight)


# HF config fields the plan reads (memory.py), and their GGUF metadata names (GgufInfo)
SHAPE_FIELDS = {"hidden_size": "hidden_size", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                "num_key_value_heads": "n_kv_heads", "head_dim": "head_dim", "intermediate_size": "intermediate_size",
                "vocab_size": "vocab_size"}


def _hf_shape(cfg: dict) -> dict:
    cfg = {**cfg.get("text_config", {}), **cfg} if "text_config" in cfg and "hidden_size" not in cfg else cfg
    shape = {k: cfg.get(k) for k in SHAPE_FIELDS}
    shape["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    return {k: v for k, v in shape.items() if v is not None}


def _gguf_facts(p: Path, sha: str):
    """(architecture, context length, shape, family row, RoPE scaling parameters) of a GGUF that
    passed the checks, remembered by its sha256: parsing the header (the whole vocabulary) takes ~5 s, a cached compile ~10 s in all."""
    def check(tmp: Path) -> dict:
        info = read_gguf_info(p)           # truncated / damaged files fail here (nothing is stored)
        check_gguf_header(info)
        check_gguf_tensors(info)
        if info.tokenizer_model is None:
            raise InputError(f"{p} carries no tokenizer (tokenizer.ggml.model missing)",
                             "use a GGUF converted with its tokenizer, or an HF folder with tokenizer files")
        shape = {k: getattr(info, g) for k, g in SHAPE_FIELDS.items() if getattr(info, g) is not None}
        shape["tie_word_embeddings"] = bool(info.tied_embeddings)
        return {"architecture": info.architecture, "context_length": info.context_length, "shape": shape,
                "rope_scaling_type": info.rope_scaling_type, "rope_scaling": info.rope_scaling}

    entry, _ = Cache().get_or_create("gguf-facts-6", sha, check)   # 5: the RoPE scaling's parameters too; 6: per-architecture layer tensors
    meta = Cache.meta(entry)
    family = family_of_gguf(meta["architecture"], meta.get("rope_scaling_type"), str(p))   # the table may have changed since
    return meta["architecture"], meta["context_length"], meta["shape"], family, meta.get("rope_scaling")


def check_source(path: str | Path, max_seq_len: int, flag: str = "--max-seq-len") -> SourceFacts:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p} does not exist", "give a .gguf file or a Hugging Face model folder")
    if p.is_file():
        sha = file_sha256(p)
        arch, ctx, shape, family, rope_scaling = _gguf_facts(p, sha)
        check_rope_scaling(str(p), None, rope_scaling, family, max_seq_len)   # longrope past its original context
        facts = SourceFacts(p, "gguf", arch, ctx, sha, shape, family=family)
    else:
        hf_cfg = read_hf_config(p)       # config.json there, valid, in the family table: before any weight is read
        cfg = json.loads((p / "config.json").read_text())
        family = family_of(hf_cfg.model_type, str(p))
        check_static_context(family, hf_cfg, max_seq_len)
        check_hf_files(p)                # every shard there and whole, a tokenizer: before hashing the weights
        dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
        facts = SourceFacts(p, "hf", hf_cfg.model_type, cfg.get("max_position_embeddings"), source_sha256(p),
                            _hf_shape(cfg), dtype, family)
    check_model_context(max_seq_len, facts.context_length, flag)
    return facts


