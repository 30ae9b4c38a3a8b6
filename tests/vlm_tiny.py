"""Tiny random VLMs built in-process, with the tiny Llama of llm_tiny as their text model, saved as HF
folders with the tiny tokenizer and a preprocessor config: an Idefics3 (SmolVLM's architecture: a
2-layer vision tower on 32x32 images, patches of 8: 16 patches, pixel shuffle 2: 4 image tokens), a
LLaVA (a 3-layer CLIP tower on the same images, features of layer -2 without CLS: 16 image tokens) and
a Qwen2-VL (a 2-layer ViT on 56x56 images, patches of 14 merged 2 x 2: 4 image tokens; its text model
has the tiny Llama's sizes with Qwen2's biases and M-RoPE) and a Qwen2.5-VL (the same text model, a 2-block
windowed ViT on 224x224 images: 4 windows, 64 image tokens)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llm_tiny import CALIBRATION_TEXT, TINY_CONFIG, tiny_tokenizer  # noqa: E402

IMAGE_TOKEN = 258          # inside the tiny vocabulary (260), above the byte and <s> </s> tokens
IMAGE_SIZE, TOKENS_PER_IMAGE = 32, 4
MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.3, 0.35]
TINY_VISION = dict(model_type="idefics3_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=8)


def tiny_vlm(seed: int = 0, vision: dict | None = None, text: dict | None = None):
    import copy

    from transformers import Idefics3Config, Idefics3ForConditionalGeneration
    torch.manual_seed(seed)
    text = dict(copy.deepcopy(TINY_CONFIG), model_type="llama", **(text or {}))
    cfg = Idefics3Config(vision_config=dict(vision or TINY_VISION), text_config=text, scale_factor=2,
                         image_token_id=IMAGE_TOKEN, tie_word_embeddings=True)
    model = Idefics3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():   # sharper logits than the default init (as llm_tiny does), and a projector of real scale
        model.model.text_model.embed_tokens.weight.mul_(8.0)
        model.model.connector.modality_projection.proj.weight.mul_(4.0)
    return model


LLAVA_TOKENS_PER_IMAGE = 16
TINY_CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                 num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=8)


def tiny_llava(seed: int = 0):
    import copy

    from transformers import LlavaConfig, LlavaForConditionalGeneration
    torch.manual_seed(seed)
    text = dict(copy.deepcopy(TINY_CONFIG), model_type="llama")
    cfg = LlavaConfig(vision_config=dict(TINY_CLIP), text_config=text, image_token_index=IMAGE_TOKEN,
                      vision_feature_layer=-2, vision_feature_select_strategy="default", tie_word_embeddings=True)
    model = LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        model.model.language_model.embed_tokens.weight.mul_(8.0)
    return model


# Qwen2-VL cut down from Qwen2-VL-2B's config: patches of 14 over 2 frames, 2 x 2 merge, 2-D RoPE in the tower,
# M-RoPE sections in the ratio of [16, 24, 24] (head_dim 16 here: [2, 3, 3]); a 56 x 56 image (the preprocessor's
# max_pixels) is a 4 x 4 patch grid, 4 image tokens between <|vision_start|> and <|vision_end|>.
QWEN2_VL_SIZE, QWEN2_VL_TOKENS = 56, 4
QWEN2_VL_IDS = dict(image_token_id=IMAGE_TOKEN, vision_start_token_id=259, vision_end_token_id=260, video_token_id=261)
QWEN2_VL_VOCAB = 264        # the tiny tokenizer's 258 ids and the four above
TINY_QWEN2_VL_VISION = dict(model_type="qwen2_vl_vision", depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, hidden_act="quick_gelu")
MROPE_SECTION = [2, 3, 3]


def tiny_qwen2_vl_text() -> dict:
    import copy
    text = {k: v for k, v in copy.deepcopy(TINY_CONFIG).items() if k != "tie_word_embeddings"}
    text.update(model_type="qwen2_vl_text", vocab_size=QWEN2_VL_VOCAB,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(MROPE_SECTION)})
    return text


def tiny_qwen2_vl(seed: int = 0):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    torch.manual_seed(seed)
    cfg = Qwen2VLConfig(vision_config=dict(TINY_QWEN2_VL_VISION), text_config=tiny_qwen2_vl_text(),
                        tie_word_embeddings=True, **QWEN2_VL_IDS)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        model.model.language_model.embed_tokens.weight.mul_(8.0)
    return model


# Qwen/Qwen2.5-VL-3B-Instruct's config.json as the hub has it (flat: text fields at the top level, the tower
# without a model_type, rope_scaling {"type": "mrope"}), and its preprocessor's pixel bounds.
QWEN25_VL_3B_CONFIG = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
    "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 128000, "max_window_layers": 70,
    "model_type": "qwen2_5_vl", "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                      "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
                      "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                      "tokens_per_second": 2, "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 151936}
QWEN25_VL_3B_PIXELS = {"min_pixels": 3136, "max_pixels": 12845056}
# Cut down: the tiny Llama's text sizes (head_dim 16: M-RoPE sections [2, 3, 3] in the ratio of [16, 24, 24]) and
# the tiny vocabulary; a 2-block tower of width 32 whose block 1 is the full-attention one (the real: every 8th,
# the last too); patch 14, merge 2 and window 112 kept, so a 224 x 224 image (the preprocessor's max_pixels) is
# 16 x 16 patches in 2 x 2 windows of 8 x 8 patches: 64 image tokens.
QWEN25_VL_SIZE, QWEN25_VL_TOKENS, QWEN25_VL_WINDOWS = 224, 64, 4


def tiny_qwen25_vl_config() -> dict:
    """Qwen2.5-VL-3B's config.json (flat, as on the hub) cut down to the tiny sizes."""
    import copy
    cfg = copy.deepcopy(QWEN25_VL_3B_CONFIG)
    text = {k: v for k, v in TINY_CONFIG.items() if k not in ("tie_word_embeddings", "rope_parameters")}
    cfg.update(text, vocab_size=QWEN2_VL_VOCAB, max_position_embeddings=256, rope_theta=10000.0,
               rope_scaling={"type": "mrope", "mrope_section": list(MROPE_SECTION)}, torch_dtype="float32",
               **QWEN2_VL_IDS)
    cfg.pop("vision_token_id")
    cfg["vision_config"].update(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, fullatt_block_indexes=[1],
                                out_hidden_size=TINY_CONFIG["hidden_size"])
    return cfg


def tiny_qwen25_vl(seed: int = 0):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**tiny_qwen25_vl_config())).eval()
    with torch.no_grad():   # attention that is not near uniform (else windows and full attention barely differ),
        model.model.language_model.embed_tokens.weight.mul_(8.0)      # rows of the text embeddings' scale
        for blk in model.model.visual.blocks:
            blk.attn.qkv.weight.mul_(8.0)
        model.model.visual.merger.mlp[2].weight.mul_(4.0)
    return model


BUILDERS = {"idefics3": tiny_vlm, "llava": tiny_llava, "qwen2_vl": tiny_qwen2_vl, "qwen2_5_vl": tiny_qwen25_vl}
TOKENS = {"idefics3": TOKENS_PER_IMAGE, "llava": LLAVA_TOKENS_PER_IMAGE, "qwen2_vl": QWEN2_VL_TOKENS,
          "qwen2_5_vl": QWEN25_VL_TOKENS}
PREPROCESSORS = {"qwen2_vl": {"image_processor_type": "Qwen2VLImageProcessor", "image_mean": MEAN, "image_std": STD,
                              "rescale_factor": 1 / 255, "min_pixels": 28 * 28, "max_pixels": QWEN2_VL_SIZE ** 2,
                              "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}}
PREPROCESSORS["qwen2_5_vl"] = {**PREPROCESSORS["qwen2_vl"], "max_pixels": QWEN25_VL_SIZE ** 2}


def write_tiny_vlm_folder(root, family: str = "idefics3", **kw) -> Path:
    """`root/tiny_vlm` (`root/tiny_<family>` for another family: model, tokenizer,
    preprocessor_config.json) and `root/calib.txt`."""
    root = Path(root)
    folder = root / ("tiny_vlm" if family == "idefics3" else f"tiny_{family}")
    BUILDERS[family](**kw).save_pretrained(folder)
    tiny_tokenizer().save(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSORS.get(family) or
        {"image_processor_type": "Idefics3ImageProcessor", "image_mean": MEAN, "image_std": STD,
         "rescale_factor": 1 / 255, "do_image_splitting": False}))
    (root / "calib.txt").write_text(CALIBRATION_TEXT)
    return folder


# SmolVLM's image splitting (llm/model/image_tiling.py): a tokenizer with the processor's tokens, tiles of the
# tower's 32 pixels, images resized to a longest edge of 64 first: up to 2x2 tiles + the global image.
TILING_TOKENS = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>",
                 *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
TILING_VOCAB = 256 + 2 + len(TILING_TOKENS)          # bytes, <s> </s>, then these: <image> is IMAGE_TOKEN (258)
TILING_PREPROCESSOR = {"image_processor_type": "Idefics3ImageProcessor", "image_mean": MEAN, "image_std": STD,
                       "rescale_factor": 1 / 255, "do_image_splitting": True, "resample": 1,
                       "size": {"longest_edge": 2 * IMAGE_SIZE}, "max_image_size": {"longest_edge": IMAGE_SIZE}}


def tiling_tokenizer():
    """The tiny byte tokenizer with SmolVLM's image tokens as special tokens, BOS added by the file's own
    post-processor (so transformers' processor and our runtime add it alike)."""
    from tokenizers import AddedToken, processors

    from llm_tiny import BOS
    tok = tiny_tokenizer()
    tok.backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TILING_TOKENS])
    tok.backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    assert tok.backend.token_to_id("<image>") == IMAGE_TOKEN
    return tok


def write_tiny_tiling_folder(root) -> Path:
    """`root/tiny_smolvlm`: the tiny Idefics3 with a vocabulary holding the processor's tokens and a
    preprocessor config that splits images; `root/calib.txt`."""
    root = Path(root)
    folder = root / "tiny_smolvlm"
    tiny_vlm(text=dict(vocab_size=TILING_VOCAB)).save_pretrained(folder)
    tiling_tokenizer().save(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(TILING_PREPROCESSOR))
    (root / "calib.txt").write_text(CALIBRATION_TEXT)
    return folder


# What the Qwen2-VL and Qwen2.5-VL float tests share: transformers' own patches of an image, and the runtime's
# decoding loop in eager float with image rows placed.
def hf_qwen_pixels(x: torch.Tensor) -> torch.Tensor:
    """transformers' own flattened patches of normalized pixels [1, 3, S, S] (its image processor's patchify;
    Qwen2.5-VL's processor is Qwen2-VL's)."""
    import numpy as np
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    patches, _, _ = Qwen2VLImageProcessorPil().patchify(x[0].numpy(), patch_size=14, merge_size=2, temporal_patch_size=2)
    return torch.from_numpy(np.ascontiguousarray(patches))


def image_runner(dec, rows_at: dict, variants=(1, 4)):
    """The runtime's loop in eager float: ids looked up by the decoder's own table, the rows put at their
    absolute positions (place_rows_at_positions, as the bundle's ChainedForward does), the decoder's
    M-RoPE positions from `dec.rope_positions`; arN chunks and ar1 steps."""
    from modelexport.llm.run.static_runner import StaticRunner
    from modelexport.llm.run.vision_inputs import place_rows_at_positions

    def graph(ids, pos, mask, *caches):
        with torch.inference_mode():
            first = place_rows_at_positions({"inputs_embeds": dec.lookup(ids).numpy()}, pos, rows_at, None)
            return dec(*dec.graph_inputs((torch.from_numpy(first["inputs_embeds"]), pos, mask, *caches)))
    return StaticRunner(dict.fromkeys(variants, graph), dec.spec, dec.cfg.max_seq_len)


def hf_qwen_first_logits(model, ids: list[int], x, grid) -> np.ndarray:
    """A transformers Qwen2-VL / Qwen2.5-VL model's logits after `ids` holding one image's tokens, the image
    given as normalized pixels x [1, 3, S, S] (its own patches, image_grid_thw, mm_token_type_ids)."""
    t = torch.tensor([ids])
    with torch.no_grad():
        return model(input_ids=t, pixel_values=hf_qwen_pixels(torch.as_tensor(x)), image_grid_thw=torch.tensor([list(grid)]),
                     mm_token_type_ids=(t == IMAGE_TOKEN).int()).logits[0, -1].numpy()


def assert_every_node_on_the_htp(manifest, target: str = "SM8650") -> None:
    """As the QNN EP reported it: the vision part wholly on the HTP, and in every graph only the float IO's
    Quantize / Dequantize on the CPU."""
    assert manifest.placement["vision"][target]["cpu_nodes"] == [], manifest.placement["vision"][target]["cpu_nodes"]
    for graph, per_target in manifest.placement.items():
        cpu = per_target[target]["cpu_nodes"]
        assert per_target[target]["htp_nodes"] > 0, graph
        assert all("QuantizeLinear" in n or "DequantizeLinear" in n for n in cpu), (graph, cpu)
