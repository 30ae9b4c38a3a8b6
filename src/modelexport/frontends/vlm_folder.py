"""Hugging Face vision-language folders (SmolVLM / Idefics3): loaded offline after the VLM table has
accepted their configs, and split into what the LLM path already builds: the text model becomes a
plain causal-LM folder (its family's `*ForCausalLM`, weights and tokenizer copied), the vision tower
and projector stay in the loaded model for the vision part (llm/vision_part.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

from ..core.errors import InputError
from .hf_folder import check_hf_files
from .loaded_llm import without_hf_progress_bars
from .vlm_families import VLMFamily, read_vision_facts

# what a VLM folder carries besides weights that the text folder keeps (the tokenizer, the chat template)
_TEXT_SIDE_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                    "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json", "generation_config.json")


def is_vlm_folder(path) -> bool:
    import json
    p = Path(path)
    if not (p.is_dir() and (p / "config.json").is_file()):
        return False
    try:
        from .vlm_families import is_vlm_config
        return is_vlm_config(json.loads((p / "config.json").read_text()))
    except (OSError, ValueError):
        return False


def load_vlm(folder: Path) -> tuple:
    """(model float32 eval, family row, vision facts): the table and the files checked before any weight."""
    import torch
    import transformers

    family, facts = read_vision_facts(folder)
    check_hf_files(folder)
    cls = getattr(transformers, family.hf_class)
    try:
        with without_hf_progress_bars():
            model = cls.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
    except (ValueError, OSError, KeyError) as e:
        raise InputError(f"transformers could not load {folder} as {family.hf_class}: {type(e).__name__}: {e}") from None
    return model, family, facts


def _attr(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def text_decoder(model, family: VLMFamily):
    """The VLM's text model and lm_head as the text family's own causal LM (weights shared, not copied)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    text_cfg = model.config.text_config
    text_cfg.tie_word_embeddings = bool(getattr(model.config, "tie_word_embeddings", False))
    if family.text_family:   # the text model as its decoder row's own class (Qwen2-VL's text model: Qwen2 + M-RoPE)
        fields = {k: v for k, v in text_cfg.to_dict().items() if k not in ("model_type", "architectures", "dtype")}
        text_cfg = AutoConfig.for_model(family.text_family, **fields)
    lm = AutoModelForCausalLM.from_config(text_cfg)
    lm.model = _attr(model, family.text_model)
    lm.lm_head = _attr(model, family.lm_head)
    return lm.eval()


def write_text_folder(model, family: VLMFamily, source: Path, dest: Path) -> Path:
    """`dest`: the text decoder as a plain HF causal-LM folder with the source's tokenizer files;
    the LLM compile takes it as it takes any folder."""
    dest.mkdir(parents=True, exist_ok=True)
    lm = text_decoder(model, family)
    with without_hf_progress_bars():
        lm.save_pretrained(dest)
    for name in _TEXT_SIDE_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
    return dest

