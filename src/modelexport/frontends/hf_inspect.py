"""`modelexport inspect FOLDER` on a Hugging Face model folder: the config's sizes and the family
row the builders would use (config.json only: no weights are read)."""
from __future__ import annotations

from pathlib import Path

from ..core.errors import InputError
from ..inspection import inspector


def _is_hf_folder(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file() and not (p / "manifest.json").is_file()


def family_facts(family, cfg) -> dict:
    """The row, plus what it resolves to for this config: each layer's RoPE table and window."""
    from .llm_families import rope_parameters, rope_slots, sliding_layers
    return {**family.facts(),
            "layers": [{"rope": "none" if r is None else (r or "rope"), "window": w}
                       for r, w in zip(rope_slots(family, cfg), sliding_layers(family, cfg))],
            "rope_parameters": rope_parameters(family, cfg)}


@inspector("hf-folder", _is_hf_folder)
def inspect_hf_folder(p: Path) -> dict:
    import json

    from .hf_folder import read_hf_config
    from .llm_families import BY_MODEL_TYPE
    raw = json.loads((p / "config.json").read_text())
    d = {"model_type": raw.get("model_type"), "architectures": raw.get("architectures"),
         "weights": sorted(f.name for f in p.glob("*.safetensors"))}
    try:
        cfg = read_hf_config(p)
    except InputError as e:
        fam = BY_MODEL_TYPE.get(raw.get("model_type"))
        return d | {"supported": False, "problem": e.problem, "fix": e.fix,
                    "family": fam.facts() if fam else None}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    d |= {"supported": True, "n_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
          "intermediate_size": cfg.intermediate_size, "n_heads": cfg.num_attention_heads,
          "n_kv_heads": getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
          "head_dim": head_dim, "vocab_size": cfg.vocab_size,
          "context_length": getattr(cfg, "max_position_embeddings", None),
          "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
          "family": family_facts(BY_MODEL_TYPE[cfg.model_type], cfg)}
    return d
