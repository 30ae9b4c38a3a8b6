"""Hugging Face vision-language folders (SmolVLM / Idefics3): loaded offline after the VLM table has
accepted their configs, and split into what the LLM path already builds: the text model becomes a
plain causal-LM folder (its family's `*ForCausalLM`, weights and tokenizer copied), the vision tower
and projector stay in the loaded model for the vision part (llm/model/vision_part.py)."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from tokenizers import Tokenizer

from ..core.errors import InputError
from .hf_folder import check_hf_files
from .loaded_llm import without_hf_progress_bars
from .vlm_families import VLMFamily, is_vlm_config, read_vision_facts

# what a VLM folder carries besides weights that the text folder keeps (the tokenizer, the chat template)
_TEXT_SIDE_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                    "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json", "generation_config.json")


def is_vlm_folder(path) -> bool:
    p = Path(path)
    if not (p.is_dir() and (p / "config.json").is_file()):
        return False
    try:
        return is_vlm_config(json.loads((p / "config.json").read_text()))
    except (OSError, ValueError):
        return False


def load_vlm(folder: Path, **sizing) -> tuple:
    """(model float32 eval, family row, vision facts): the table and the files checked before any weight."""
    import torch
    import transformers

    family, facts = read_vision_facts(folder, **sizing)     # sizing: image_size / max_seq_len
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



# Families whose processor splits images into tiles (llm/model/image_tiling.py); the tokens its prompt needs.
TILING_FAMILIES = {"idefics3": ("<image>", "<fake_token_around_image>", "<global-img>")}


def read_image_tiling(folder: Path, family: VLMFamily, facts):
    """The manifest's `ImageTiling` fields (a dict) of a folder whose processor splits images, read from its
    preprocessor_config.json with the processor's defaults (transformers' Idefics3ImageProcessor); None
    when the family does not tile or the tokenizer lacks the processor's tokens (then one image is one
    tile and the image tokens go in raw, as before)."""
    tokens = TILING_FAMILIES.get(family.model_type)
    if tokens is None or not (folder / "tokenizer.json").is_file():
        return None
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if tok.token_to_id(tokens[0]) != facts.image_token_id or any(tok.token_to_id(t) is None for t in tokens[1:]):
        return None
    pre_file = folder / "preprocessor_config.json"
    pre = json.loads(pre_file.read_text()) if pre_file.is_file() else {}
    tile = int((pre.get("max_image_size") or {}).get("longest_edge", 364))
    longest = int((pre.get("size") or {}).get("longest_edge", 4 * 364))
    splitting = bool(pre.get("do_image_splitting", True))
    if tile != facts.image_size:
        raise InputError(f"{pre_file}: max_image_size.longest_edge is {tile} but the vision tower's image_size is "
                         f"{facts.image_size}; the vision part is built for one tile of image_size",
                         "use the model's original preprocessor_config.json (its max_image_size is the tower's size)")
    if splitting and any(tok.token_to_id(f"<row_{r}_col_{c}>") is None for r in (1, 2) for c in (1, 2)):
        raise InputError(f"{folder}: do_image_splitting is on but the tokenizer has no <row_i_col_j> tokens",
                         "use the model's original tokenizer.json, or set do_image_splitting to false")
    return dict(splitting=splitting, tile_size=tile, longest_edge=longest,
                       max_tiles=math.ceil(longest / tile) ** 2 + 1 if splitting else 1,
                       resample=int(pre.get("resample", 1)), image_seq_len=facts.tokens_per_image)
