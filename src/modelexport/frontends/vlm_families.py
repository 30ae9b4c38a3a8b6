"""The vision-language families modelexport splits into a vision part and a text decoder, as one table
of data (like llm_families.py for the decoders).

A row says where a Hugging Face VLM keeps its vision tower, its projector and its text model, which
vision towers it is built with, how many image tokens one image becomes, and how the projected rows
replace the image tokens. The text model inside must itself be a row of llm_families (its config is
checked there too). Everything here is read from config.json / preprocessor_config.json, before any
weight is loaded; a folder the table does not cover is refused naming what is missing.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.errors import InputError
from .llm_families import check_model_config

# How one image becomes image tokens (the number of rows the projector gives per image):
# "pixel_shuffle": (image_size / patch_size)^2 / scale_factor^2 (Idefics3 / SmolVLM's connector);
# "clip_patches": (image_size / patch_size)^2, plus the CLS row unless vision_feature_select_strategy is
# "default" (LLaVA drops it then); "merged_grid": (image_size / patch_size)^2 / spatial_merge_size^2 (Qwen2-VL's
# PatchMerger).
TOKEN_COUNT_RULES = ("pixel_shuffle", "clip_patches", "merged_grid")
# Where the vision part's (square) image size comes from: "vision_config": its image_size (the tower's
# trained size); "processor_max_pixels": Qwen2-VL takes any size (smart_resize to multiples of patch x merge
# within min/max pixels), the graph here is static, so one size is fixed: --image-size when given (a multiple
# of patch x merge within min/max pixels), else the largest such square whose image tokens take at most half
# of --max-seq-len (the rest is for text); a real 2B folder's max_pixels square (3,584) is 16,384 tokens.
# A tower with attention windows (VLMFamily.window_field: Qwen2.5-VL) takes only whole windows: the multiple is
# then one window (112 pixels in the real models), so every window has the same size and the vision part
# reshapes to windows (transformers pads the grid to whole windows and drops the padding: smaller edge windows).
IMAGE_SIZE_RULES = ("vision_config", "processor_max_pixels")
# What positions the image tokens take: "text" (one per token, as any text), "mrope_grid" (M-RoPE: the
# merged grid's (t, row, column), the text after it from the image's largest position + 1: llm/model/mrope.py).
POSITION_RULES = ("text", "mrope_grid")
# How the projector's rows enter the text: "replace_in_order": the i-th image token of the prompt is
# replaced by the i-th row (transformers' masked_scatter in both families); the prompt already holds
# tokens_per_image image tokens per image.
PLACEMENT_RULES = ("replace_in_order",)
# A folder without preprocessor_config.json: the image processor's own defaults (transformers).
_CLIP_NORMALIZATION = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])
DEFAULT_NORMALIZATION = {"idefics3": ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]), "llava": _CLIP_NORMALIZATION,
                         "qwen2_vl": _CLIP_NORMALIZATION, "qwen2_5_vl": _CLIP_NORMALIZATION}
# transformers' Qwen2VLImageProcessor defaults (a preprocessor_config.json may set others)
QWEN2_VL_MAX_PIXELS = 28 * 28 * 1280
# transformers' Qwen2_5_VLVisionConfig.window_size default (pixels; the real 3B / 7B / 72B configs say 112 too)
QWEN2_5_VL_WINDOW = 112


@dataclass(frozen=True)
class VLMFamily:
    model_type: str                    # HF config.model_type of the whole VLM
    label: str
    hf_class: str                      # the transformers class that loads the folder
    vision_tower: str                  # attribute path of the vision tower inside the loaded model
    projector: str                     # attribute path of the projector (connector)
    text_model: str                    # attribute path of the text model (the decoder without lm_head)
    lm_head: str                       # attribute path of the output projection
    vision_model_types: tuple[str, ...]  # vision_config.model_type values the vision part is built for
    token_count: str                   # TOKEN_COUNT_RULES key
    image_token_field: str = "image_token_id"   # the config field holding the image token's id
    placement: str = "replace_in_order"         # PLACEMENT_RULES key
    single_feature_layer: bool = False          # vision_feature_layer must be one int (a list concatenates layers: not built)
    image_size_rule: str = "vision_config"      # IMAGE_SIZE_RULES key
    position_rule: str = "text"                 # POSITION_RULES key
    # the config fields of the tokens around one image's tokens (Qwen2-VL: <|vision_start|> ... <|vision_end|>)
    image_wrap_fields: tuple[str, ...] = ()
    # the decoder row the text model is built as when its own model_type is not a row ("qwen2_vl_text" is
    # qwen2 with M-RoPE: the same weights under Qwen2ForCausalLM's names)
    text_family: str | None = None
    # the vision_config field of the tower's attention window side in pixels (Qwen2.5-VL: "window_size"):
    # the image must be whole windows (IMAGE_SIZE_RULES)
    window_field: str | None = None

    def facts(self) -> dict[str, Any]:
        return asdict(self)


VLM_FAMILIES: tuple[VLMFamily, ...] = (
    # SmolVLM / SmolVLM2 are idefics3 (SigLIP-style tower, pixel-shuffle connector, Llama text model).
    VLMFamily("idefics3", "Idefics3 / SmolVLM", "Idefics3ForConditionalGeneration",
              vision_tower="model.vision_model", projector="model.connector", text_model="model.text_model",
              lm_head="lm_head", vision_model_types=("idefics3_vision",), token_count="pixel_shuffle"),
    # LLaVA 1.5 style: a CLIP tower's features of one layer (vision_feature_layer), a 2-layer MLP projector.
    VLMFamily("llava", "LLaVA", "LlavaForConditionalGeneration",
              vision_tower="model.vision_tower", projector="model.multi_modal_projector",
              text_model="model.language_model", lm_head="lm_head", vision_model_types=("clip_vision_model",),
              token_count="clip_patches", image_token_field="image_token_index", single_feature_layer=True),
    # Qwen2-VL: a ViT on 14-pixel patches (Conv3d over 2 frames; an image is one frame repeated) with 2-D
    # RoPE, a PatchMerger of 2 x 2 patches; Qwen2 text model with M-RoPE positions. Older folders are flat
    # (text fields beside vision_config) and name the tower "qwen2_vl".
    VLMFamily("qwen2_vl", "Qwen2-VL", "Qwen2VLForConditionalGeneration",
              vision_tower="model.visual", projector="model.visual.merger", text_model="model.language_model",
              lm_head="lm_head", vision_model_types=("qwen2_vl_vision", "qwen2_vl"), token_count="merged_grid",
              image_size_rule="processor_max_pixels", position_rule="mrope_grid",
              image_wrap_fields=("vision_start_token_id", "vision_end_token_id"), text_family="qwen2"),
    # Qwen2.5-VL: Qwen2-VL's layout (patches, 2 x 2 merge, M-RoPE text model) with a tower of RMSNorm and gated
    # MLPs whose blocks attend within windows of window_size pixels except fullatt_block_indexes (all patches).
    # Hub folders are flat and name the tower "qwen2_5_vl" or nothing.
    VLMFamily("qwen2_5_vl", "Qwen2.5-VL", "Qwen2_5_VLForConditionalGeneration",
              vision_tower="model.visual", projector="model.visual.merger", text_model="model.language_model",
              lm_head="lm_head", vision_model_types=("qwen2_5_vl_vision", "qwen2_5_vl"), token_count="merged_grid",
              image_size_rule="processor_max_pixels", position_rule="mrope_grid",
              image_wrap_fields=("vision_start_token_id", "vision_end_token_id"), text_family="qwen2",
              window_field="window_size"),
)
VLM_BY_MODEL_TYPE = {f.model_type: f for f in VLM_FAMILIES}


def is_vlm_config(raw: Any) -> bool:
    """A config.json dict of a multimodal model (a vision_config beside a text_config, or beside the
    text fields themselves in a row's flat form: older Qwen2-VL folders)."""
    return isinstance(raw, dict) and isinstance(raw.get("vision_config"), dict) and (
        "text_config" in raw or raw.get("model_type") in VLM_BY_MODEL_TYPE)


def text_config_of(raw: dict) -> dict:
    """The text model's config fields: text_config, or the top level of a flat config."""
    return raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw


@dataclass(frozen=True)
class VisionFacts:
    """What the vision part and the runtime need to know about one VLM, all from its configs."""
    family: str
    image_size: int
    patch_size: int
    tokens_per_image: int
    image_token_id: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale_factor: float
    placement: str
    text_model_type: str
    text_hidden_size: int
    position_rule: str = "text"                 # POSITION_RULES key
    spatial_merge_size: int = 1                 # patches merged per side into one image token (Qwen2-VL: 2)
    image_wrap_ids: tuple[int, ...] = ()        # the ids before and after one image's tokens (none, or two)

    @property
    def grid_thw(self) -> tuple[int, int, int]:
        """transformers' image_grid_thw of the one image size: (frames, patch rows, patch columns)."""
        g = self.image_size // self.patch_size
        return (1, g, g)


def vlm_family_of(raw: dict, where: str) -> VLMFamily:
    """The row of a VLM's config.json; InputError naming the part the table does not know."""
    family = VLM_BY_MODEL_TYPE.get(raw.get("model_type"))
    if family is None:
        raise InputError(f"{where}: vision-language architecture {raw.get('model_type')!r} is not supported "
                         "(no row in the VLM table)",
                         f"supported: {', '.join(VLM_BY_MODEL_TYPE)} (frontends/vlm_families.py; "
                         "SmolVLM is idefics3)")
    vision_type = (raw.get("vision_config") or {}).get("model_type", family.vision_model_types[0])
    if vision_type not in family.vision_model_types:
        raise InputError(f"{where}: the {family.label} row does not know the vision tower {vision_type!r} "
                         "(vision_config.model_type)",
                         f"its row builds the vision part for: {', '.join(family.vision_model_types)}; add the tower "
                         "to the row in frontends/vlm_families.py")
    return family


def _tokens_per_image(family: VLMFamily, raw: dict, vision: dict, image_size: int) -> int:
    per_side = image_size // int(vision["patch_size"])
    count = {"pixel_shuffle": lambda: per_side ** 2 // int(raw.get("scale_factor", 2)) ** 2,
             "clip_patches": lambda: per_side ** 2 + (raw.get("vision_feature_select_strategy", "default") != "default"),
             "merged_grid": lambda: per_side ** 2 // int(vision.get("spatial_merge_size", 2)) ** 2,
             }[family.token_count]
    return int(count())


def _size_step(family: VLMFamily, vision: dict) -> tuple[int, str]:
    """(factor, why) of a processor_max_pixels family: its sizes are multiples of factor. One image token is
    patch x merge pixels; a windowed tower (window_field) takes whole windows of window // (patch x merge)
    tokens per side, as transformers' get_vision_window_index counts them."""
    factor = int(vision["patch_size"]) * int(vision.get("spatial_merge_size", 2))
    if not family.window_field:
        return factor, "patch_size x merge_size"
    window = int(vision.get(family.window_field, QWEN2_5_VL_WINDOW))
    per_window = max(1, window // factor)
    return factor * per_window, (f"whole attention windows: {family.window_field} {window} = {per_window} x {per_window} "
                                 f"image tokens of {factor} pixels")


def _pixel_bounds(family: VLMFamily, vision: dict, pre: dict) -> tuple[int, str, int, int]:
    """(factor, why, min_pixels, max_pixels) of a processor_max_pixels family: sizes are multiples of factor."""
    factor, why = _size_step(family, vision)
    size = pre.get("size") or {}
    max_pixels = int(pre.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels") or QWEN2_VL_MAX_PIXELS)
    min_pixels = int(pre.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels") or factor * factor)
    return factor, why, min_pixels, max_pixels


def _image_size(family: VLMFamily, raw: dict, vision: dict, pre: dict, image_size: int | None,
                max_seq_len: int | None, where: str) -> int:
    """The vision part's square image side (IMAGE_SIZE_RULES), or the asked image_size once checked.
    processor_max_pixels default: the largest multiple of patch*merge within [min_pixels, max_pixels]
    whose tokens_per_image <= max_seq_len / 2 (room for text); without max_seq_len, the max_pixels square."""
    if family.image_size_rule == "vision_config":
        fixed = int(vision["image_size"])
        if image_size is not None and image_size != fixed:
            raise InputError(f"--image-size {image_size}: the {family.label} vision tower is built for {fixed} pixels "
                             "(vision_config.image_size)", f"leave --image-size out or pass --image-size {fixed}")
        return fixed
    factor, why, min_pixels, max_pixels = _pixel_bounds(family, vision, pre)
    lo = max(factor, -(-int(min_pixels ** 0.5) // factor) * factor)
    lo += factor if lo * lo < min_pixels else 0
    hi = int(max_pixels ** 0.5) // factor * factor
    if hi < lo:
        raise InputError(f"{where}: no {family.label} image size is within max_pixels {max_pixels}: the smallest "
                         f"takes {lo} x {lo} pixels (a multiple of {factor}: {why})",
                         f"set max_pixels to at least {lo * lo} in preprocessor_config.json (the model's original "
                         "file has a larger one)")
    if image_size is not None:
        if image_size % factor or not lo <= image_size <= hi:
            near = sorted({min(max(lo, image_size // factor * factor), hi),
                           min(max(lo, -(-image_size // factor) * factor), hi)})
            raise InputError(f"--image-size {image_size}: {family.label} takes a multiple of {factor} "
                             f"({why}) between {lo} and {hi} (min_pixels {min_pixels}, "
                             f"max_pixels {max_pixels})",
                             f"use --image-size {' or '.join(str(n) for n in near)}")
        return image_size
    if max_seq_len is None:
        return max(lo, hi)
    budget = max_seq_len // 2
    fits = [n for n in range(hi, lo - 1, -factor) if _tokens_per_image(family, raw, vision, n) <= budget]
    if not fits:
        raise InputError(f"{where}: even the smallest {family.label} image ({lo} x {lo} pixels, "
                         f"{_tokens_per_image(family, raw, vision, lo)} image tokens) does not fit half of "
                         f"--max-seq-len {max_seq_len} ({budget} tokens; the rest is for text)",
                         f"raise --max-seq-len to at least {2 * _tokens_per_image(family, raw, vision, lo)}")
    return fits[0]


def read_vision_facts(folder: Path, image_size: int | None = None,
                      max_seq_len: int | None = None) -> tuple[VLMFamily, VisionFacts]:
    """The row and the vision facts of an HF VLM folder, read from its JSON files only; the text
    model's config is checked against the decoder family table too. image_size: the asked square
    (--image-size), checked; max_seq_len: the context the default image size must leave room in."""
    where = str(folder)
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{folder}/config.json is not readable JSON: {e}") from None
    family = vlm_family_of(raw, where)
    vision, text = raw["vision_config"], text_config_of(raw)
    needed = ("image_size", "patch_size") if family.image_size_rule == "vision_config" else ("patch_size",)
    missing = [k for k in needed if k not in vision]
    missing += [k for k in (family.image_token_field, *family.image_wrap_fields) if k not in raw]
    if missing:
        raise InputError(f"{where}/config.json lacks {', '.join(missing)} (needed for the vision part)",
                         "compare it with the model's original config.json")
    if family.single_feature_layer and not isinstance(raw.get("vision_feature_layer", -2), int):
        raise InputError(f"{where}: vision_feature_layer {raw['vision_feature_layer']!r} concatenates several layers; "
                         f"the {family.label} vision part is built for one", "use a model whose vision_feature_layer is one layer")
    check_model_config({**text, "model_type": family.text_family} if family.text_family else text,
                       f"{where} (text_config)")
    pre = _preprocessor(folder)
    mean, std = DEFAULT_NORMALIZATION[family.model_type]
    size = _image_size(family, raw, vision, pre, image_size, max_seq_len, where)
    facts = VisionFacts(family=family.model_type, image_size=size,
                        patch_size=int(vision["patch_size"]), tokens_per_image=_tokens_per_image(family, raw, vision, size),
                        image_token_id=int(raw[family.image_token_field]),
                        mean=tuple(float(v) for v in pre.get("image_mean", mean)),
                        std=tuple(float(v) for v in pre.get("image_std", std)),
                        rescale_factor=float(pre.get("rescale_factor", 1 / 255)), placement=family.placement,
                        text_model_type=str(family.text_family or text.get("model_type")),
                        text_hidden_size=int(text["hidden_size"]), position_rule=family.position_rule,
                        spatial_merge_size=int(vision.get("spatial_merge_size", 1)) if family.token_count == "merged_grid" else 1,
                        image_wrap_ids=tuple(int(raw[f]) for f in family.image_wrap_fields))
    return family, facts


def _preprocessor(folder: Path) -> dict:
    f = folder / "preprocessor_config.json"
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{f} is not readable JSON: {e}", "copy the model's original preprocessor_config.json") from None
