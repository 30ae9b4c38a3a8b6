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
# "default" (LLaVA drops it then).
TOKEN_COUNT_RULES = ("pixel_shuffle", "clip_patches")
# How the projector's rows enter the text: "replace_in_order": the i-th image token of the prompt is
# replaced by the i-th row (transformers' masked_scatter in both families); the prompt already holds
# tokens_per_image image tokens per image.
PLACEMENT_RULES = ("replace_in_order",)
# A folder without preprocessor_config.json: the image processor's own defaults (transformers).
DEFAULT_NORMALIZATION = {"idefics3": ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
                         "llava": ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])}


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
)
VLM_BY_MODEL_TYPE = {f.model_type: f for f in VLM_FAMILIES}


def is_vlm_config(raw: Any) -> bool:
    """A config.json dict of a multimodal model (a vision_config beside a text_config)."""
    return isinstance(raw, dict) and isinstance(raw.get("vision_config"), dict) and "text_config" in raw


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


def vlm_family_of(raw: dict, where: str) -> VLMFamily:
    """The row of a VLM's config.json; InputError naming the part the table does not know."""
    family = VLM_BY_MODEL_TYPE.get(raw.get("model_type"))
    if family is None:
        raise InputError(f"{where}: vision-language architecture {raw.get('model_type')!r} is not supported "
                         "(no row in the VLM table)",
                         f"supported: {', '.join(VLM_BY_MODEL_TYPE)} (frontends/vlm_families.py; "
                         "SmolVLM is idefics3)")
    vision_type = (raw.get("vision_config") or {}).get("model_type")
    if vision_type not in family.vision_model_types:
        raise InputError(f"{where}: the {family.label} row does not know the vision tower {vision_type!r} "
                         "(vision_config.model_type)",
                         f"its row builds the vision part for: {', '.join(family.vision_model_types)}; add the tower "
                         "to the row in frontends/vlm_families.py")
    return family


def _tokens_per_image(family: VLMFamily, raw: dict, vision: dict) -> int:
    per_side = int(vision["image_size"]) // int(vision["patch_size"])
    count = {"pixel_shuffle": lambda: per_side ** 2 // int(raw.get("scale_factor", 2)) ** 2,
             "clip_patches": lambda: per_side ** 2 + (raw.get("vision_feature_select_strategy", "default") != "default"),
             }[family.token_count]
    return int(count())


def read_vision_facts(folder: Path) -> tuple[VLMFamily, VisionFacts]:
    """The row and the vision facts of an HF VLM folder, read from its JSON files only; the text
    model's config is checked against the decoder family table too."""
    where = str(folder)
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{folder}/config.json is not readable JSON: {e}") from None
    family = vlm_family_of(raw, where)
    vision, text = raw["vision_config"], raw.get("text_config") or {}
    missing = [k for k in ("image_size", "patch_size") if k not in vision]
    if family.image_token_field not in raw:
        missing.append(family.image_token_field)
    if missing:
        raise InputError(f"{where}/config.json lacks {', '.join(missing)} (needed for the vision part)",
                         "compare it with the model's original config.json")
    if family.single_feature_layer and not isinstance(raw.get("vision_feature_layer", -2), int):
        raise InputError(f"{where}: vision_feature_layer {raw['vision_feature_layer']!r} concatenates several layers; "
                         f"the {family.label} vision part is built for one", "use a model whose vision_feature_layer is one layer")
    check_model_config(text, f"{where} (text_config)")
    pre = _preprocessor(folder)
    mean, std = DEFAULT_NORMALIZATION[family.model_type]
    facts = VisionFacts(family=family.model_type, image_size=int(vision["image_size"]),
                        patch_size=int(vision["patch_size"]), tokens_per_image=_tokens_per_image(family, raw, vision),
                        image_token_id=int(raw[family.image_token_field]),
                        mean=tuple(float(v) for v in pre.get("image_mean", mean)),
                        std=tuple(float(v) for v in pre.get("image_std", std)),
                        rescale_factor=float(pre.get("rescale_factor", 1 / 255)), placement=family.placement,
                        text_model_type=str(text.get("model_type")), text_hidden_size=int(text["hidden_size"]))
    return family, facts


def _preprocessor(folder: Path) -> dict:
    f = folder / "preprocessor_config.json"
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{f} is not readable JSON: {e}", "copy the model's original preprocessor_config.json") from None
