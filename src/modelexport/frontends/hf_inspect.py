"""`modelexport inspect FOLDER` on a Hugging Face model folder: the config's sizes and the family
row the builders would use (config.json only: no weights are read). A vision-language folder also
shows its VLM row and the vision part's facts (image size, image tokens, placement)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..core.errors import InputError
from ..inspection import inspector
from .hf_folder import read_hf_config
from .llm_families import BY_MODEL_TYPE, rope_parameters, rope_slots, sliding_layers
from .vlm_families import is_vlm_config, read_vision_facts, text_config_of


def _is_hf_folder(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file() and not (p / "manifest.json").is_file()


def family_facts(family, cfg) -> dict:
    """The row, plus what it resolves to for this config: each layer's RoPE table and window."""
    return {**family.facts(),
            "layers": [{"rope": "none" if r is None else (r or "rope"), "window": w}
                       for r, w in zip(rope_slots(family, cfg), sliding_layers(family, cfg))],
            "rope_parameters": rope_parameters(family, cfg)}


# contexts at which a VLM whose image size follows the context (Qwen2-VL) is shown: its image then takes at
# most half of --max-seq-len
SHOWN_CONTEXTS = (512, 2048, 4096)


def _text_facts(cfg, family) -> dict:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {"n_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "n_heads": cfg.num_attention_heads,
            "n_kv_heads": getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
            "head_dim": head_dim, "vocab_size": cfg.vocab_size,
            "context_length": getattr(cfg, "max_position_embeddings", None),
            "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
            "family": family_facts(family, cfg)}


def _vlm_folder(p: Path, raw: dict) -> dict:
    """The VLM row, the vision facts (per context when the image size follows it) and the text model."""
    from transformers import AutoConfig
    try:
        family, facts = read_vision_facts(p)
        sizes = {}
        if family.image_size_rule != "vision_config":
            for n in SHOWN_CONTEXTS:
                try:
                    f = read_vision_facts(p, max_seq_len=n)[1]
                    sizes[str(n)] = {"image_size": f.image_size, "tokens_per_image": f.tokens_per_image}
                except InputError as e:
                    sizes[str(n)] = {"problem": e.problem}
        text = text_config_of(raw)
        text_type = family.text_family or text.get("model_type")
        fields = {k: v for k, v in text.items() if k not in ("model_type", "architectures", "dtype", "vision_config")}
        cfg = AutoConfig.for_model(text_type, **fields)
    except InputError as e:
        return {"supported": False, "problem": e.problem, "fix": e.fix, "family": None}
    vision = asdict(facts) | {"label": family.label, "image_size_rule": family.image_size_rule}
    if sizes:   # the size is chosen per context at compile (or --image-size): the folder's largest is only a bound
        vision["max_image_size"] = vision.pop("image_size")
        vision["max_tokens_per_image"] = vision.pop("tokens_per_image")
        vision["by_max_seq_len"] = sizes
    return {"supported": True, "vlm": vision, **_text_facts(cfg, BY_MODEL_TYPE[text_type])}


@inspector("hf-folder", _is_hf_folder)
def inspect_hf_folder(p: Path) -> dict:
    raw = json.loads((p / "config.json").read_text())
    d = {"model_type": raw.get("model_type"), "architectures": raw.get("architectures"),
         "weights": sorted(f.name for f in p.glob("*.safetensors"))}
    if is_vlm_config(raw):
        return d | _vlm_folder(p, raw)
    try:
        cfg = read_hf_config(p)
    except InputError as e:
        fam = BY_MODEL_TYPE.get(raw.get("model_type"))
        return d | {"supported": False, "problem": e.problem, "fix": e.fix,
                    "family": fam.facts() if fam else None}
    return d | {"supported": True, **_text_facts(cfg, BY_MODEL_TYPE[cfg.model_type])}
