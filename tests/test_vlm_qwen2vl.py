"""Qwen2-VL-style folders in float (issue 23): the VLM row read from a tiny random Qwen2-VL built here
(and from the older flat config form), M-RoPE positions as transformers' get_rope_index makes them, the
static decoder with 3-axis positions against transformers' Qwen2-VL language model, text-only M-RoPE
against plain RoPE, the vision part against transformers' image features, and the whole float pipeline
(vision part, rows placed, static decoder through the runner) against Qwen2VLForConditionalGeneration."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from vlm_tiny import (IMAGE_TOKEN, MEAN, MROPE_SECTION, QWEN2_VL_IDS, QWEN2_VL_SIZE, QWEN2_VL_TOKENS, STD,  # noqa: E402
                      hf_qwen_first_logits, hf_qwen_pixels, image_runner, write_tiny_vlm_folder)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
START, END = QWEN2_VL_IDS["vision_start_token_id"], QWEN2_VL_IDS["vision_end_token_id"]
GRID = (1, QWEN2_VL_SIZE // 14, QWEN2_VL_SIZE // 14)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_vlm_folder(tmp_path_factory.mktemp("qwen2vl"), "qwen2_vl")


@pytest.fixture(scope="module")
def loaded(folder):
    from modelexport.frontends.vlm_folder import load_vlm
    return load_vlm(folder)


def _prompt(text=(72, 105, 33, 10, 87, 104)) -> list[int]:
    from modelexport.llm.run.vision_inputs import image_prompt_ids
    return image_prompt_ids([256, *text], IMAGE_TOKEN, QWEN2_VL_TOKENS, (START, END))


def test_the_row_reads_the_folder_and_its_flat_form(folder, tmp_path):
    from modelexport.frontends.vlm_families import read_vision_facts
    family, facts = read_vision_facts(folder)
    assert family.model_type == "qwen2_vl" and facts.position_rule == "mrope_grid"
    assert (facts.image_size, facts.tokens_per_image, facts.grid_thw, facts.spatial_merge_size) == \
        (QWEN2_VL_SIZE, QWEN2_VL_TOKENS, GRID, 2)
    assert facts.image_wrap_ids == (START, END) and facts.text_model_type == "qwen2"
    assert list(facts.mean) == MEAN and list(facts.std) == STD
    # the older hub form: text fields at the top level, rope_scaling {"type": "mrope"}, no tower model_type
    cfg = json.loads((folder / "config.json").read_text())
    text, vision = cfg.pop("text_config"), cfg.pop("vision_config")
    vision.pop("model_type")
    rp = text.pop("rope_parameters")
    flat = {**text, **cfg, "model_type": "qwen2_vl", "vision_config": vision,
            "rope_scaling": {"type": "mrope", "mrope_section": rp["mrope_section"]}, "rope_theta": rp["rope_theta"]}
    (tmp_path / "config.json").write_text(json.dumps(flat))
    (tmp_path / "preprocessor_config.json").write_text((folder / "preprocessor_config.json").read_text())
    assert read_vision_facts(tmp_path) == (family, facts)


def test_rope_index_is_transformers_get_rope_index(loaded):
    """Text before and after one image, and two images: positions and the later slots' offset."""
    from modelexport.llm.model.mrope import rope_index
    model, _, _ = loaded
    for ids in (_prompt(), [*_prompt(), *_prompt()[1:]]):
        t = torch.tensor([ids])
        n_images = ids.count(IMAGE_TOKEN) // QWEN2_VL_TOKENS
        ref, delta = model.model.get_rope_index(t, mm_token_type_ids=(t == IMAGE_TOKEN).int(),
                                                image_grid_thw=torch.tensor([GRID] * n_images))
        got = rope_index(ids, IMAGE_TOKEN, GRID, 2)
        np.testing.assert_array_equal(got.rows, ref[:, 0].numpy())
        assert got.delta == int(delta) and got.delta < 0          # the image's 4 tokens take 2 positions
        later = got(np.array([[len(ids), len(ids) + 1]]))
        np.testing.assert_array_equal(later[:, 0], np.array([[len(ids) + got.delta, len(ids) + got.delta + 1]] * 3))


def _hf_logits(model, embeds: torch.Tensor, rope: np.ndarray) -> np.ndarray:
    """transformers' Qwen2-VL language model + lm_head on inputs_embeds at 3-axis positions [3, 1, T]."""
    with torch.no_grad():
        h = model.model.language_model(inputs_embeds=embeds, position_ids=torch.from_numpy(rope).long()).last_hidden_state
        return model.lm_head(h)[0].numpy()


def test_static_decoder_with_mrope_positions_is_the_language_model(loaded):
    """The embeddings-in static decoder (float) fed random embeddings at the prompt's M-RoPE positions,
    in ar4 chunks and ar1 steps, gives transformers' logits at every position to 1e-4."""
    from modelexport.frontends.vlm_folder import text_decoder
    from modelexport.llm.model.mrope import RopePositions, rope_index
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    model, family, _ = loaded
    ids = _prompt()
    embeds = torch.randn(1, len(ids), 64, generator=torch.Generator().manual_seed(0))
    rope = rope_index(ids, IMAGE_TOKEN, GRID, 2)
    dec = build_static_decoder(text_decoder(model, family), StaticDecoderConfig(4, 32), inputs="embeddings")
    assert dec.mrope and dec.input_names()[:3] == ["inputs_embeds", "rope_position_ids", "attention_mask"]
    dec.rope_positions = rope
    runner = image_runner(dec, {p: embeds[0, p].numpy() for p in range(len(ids))})
    got = np.concatenate([runner.feed(ids[:8]).numpy(), *[runner.feed([t]).numpy() for t in ids[8:]]])
    assert runner.chunks == [4, 4] + [1] * (len(ids) - 8)
    ref = _hf_logits(model, embeds, rope(np.arange(len(ids))[None]))
    np.testing.assert_allclose(got, ref, atol=1e-4)
    dec.rope_positions = RopePositions.text()     # the same inputs at text positions: the check can fail
    assert np.abs(image_runner(dec, {p: embeds[0, p].numpy() for p in range(len(ids))}).feed(ids).numpy() - ref).max() > 5e-4


def test_text_only_mrope_is_plain_rope(loaded):
    """Text positions (all three axes equal) give the plain Qwen2 decoder's logits: the same weights
    built without mrope_section."""
    from transformers import AutoModelForCausalLM

    from modelexport.frontends.vlm_folder import text_decoder
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.static_runner import StaticRunner
    model, family, _ = loaded
    lm = text_decoder(model, family)
    assert lm.config.model_type == "qwen2" and lm.config.rope_parameters["mrope_section"] == MROPE_SECTION
    plain_cfg = lm.config.__class__.from_dict({**lm.config.to_dict(), "rope_parameters": {
        k: v for k, v in lm.config.rope_parameters.items() if k != "mrope_section"}})
    plain = AutoModelForCausalLM.from_config(plain_cfg).eval()
    plain.load_state_dict(lm.state_dict())
    ids = [256, 72, 105, 33, 10, 87, 104, 105, 115]
    outs = []
    for m in (lm, plain):
        dec = build_static_decoder(m, StaticDecoderConfig(4, 32))
        outs.append(StaticRunner.from_decoder(dec, (1, 4)).feed(ids).numpy())
        assert dec.mrope == (m is lm)
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)
    with torch.no_grad():
        np.testing.assert_allclose(outs[1], plain(torch.tensor([ids])).logits[0].numpy(), atol=1e-4)


def test_vision_part_is_the_hf_image_features(loaded, tmp_path):
    import onnxruntime as ort

    from modelexport.llm.model.vision_part import VisionPart, export_vision_part
    model, family, facts = loaded
    part = VisionPart(model, family, facts)
    x = torch.randn(1, 3, QWEN2_VL_SIZE, QWEN2_VL_SIZE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.model.get_image_features(hf_qwen_pixels(x), torch.tensor([GRID])).pooler_output[0]
        got = part(x)[0]
    assert got.shape == (QWEN2_VL_TOKENS, 64)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    out = ort.InferenceSession(str(export_vision_part(part, tmp_path / "vision.onnx")),
                               providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x.numpy()})[0]
    np.testing.assert_allclose(out[0], ref.numpy(), atol=1e-5)


def test_float_pipeline_first_logits_are_the_full_model(loaded):
    """Our float pipeline on a real photo (pixels as the runtime makes them, the vision part, its rows at
    the image tokens, M-RoPE positions, the static decoder through the runner) against
    Qwen2VLForConditionalGeneration on the same pixels and ids: first-step logits to 1e-4."""
    from modelexport.frontends.vlm_folder import text_decoder
    from modelexport.llm.model.mrope import rope_index
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.vision_inputs import load_pixels
    from modelexport.llm.model.vision_part import VisionPart
    from modelexport.zoo.assets import sample_images
    model, family, facts = loaded
    x, notes = load_pixels(sample_images()["coffee"], facts.image_size, facts.mean, facts.std, facts.rescale_factor)
    assert notes == [f"image of 600x400 resized to {QWEN2_VL_SIZE}x{QWEN2_VL_SIZE} (the vision part's size)"]
    ids = _prompt()
    assert ids[1:3 + QWEN2_VL_TOKENS] == [START, *[IMAGE_TOKEN] * QWEN2_VL_TOKENS, END]
    lm = text_decoder(model, family)
    ref = hf_qwen_first_logits(model, ids, x, GRID)
    with torch.no_grad():
        rows = VisionPart(model, family, facts)(torch.from_numpy(x)).numpy()
        without_image = model(input_ids=torch.tensor([ids])).logits[0, -1].numpy()
    dec = build_static_decoder(lm, StaticDecoderConfig(4, 32), inputs="embeddings")
    dec.rope_positions = rope_index(ids, IMAGE_TOKEN, GRID, 2)
    where = [i for i, tok in enumerate(ids) if tok == IMAGE_TOKEN]
    got = image_runner(dec, dict(zip(where, rows[0]))).prefill(ids).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert np.abs(without_image - ref).max() > 1e-2     # the image and its positions matter: the check can fail


def test_calibration_image_windows_take_the_grid_positions(loaded):
    """The decoder's calibration (calibration_samples with ImageRows): an image window holds the runtime's
    block (<|vision_start|>, the image tokens, <|vision_end|>) after its first token, its samples carry the
    image rows in `inputs_embeds` and the M-RoPE grid positions the runtime gives them (rope_index); text
    windows keep text positions."""
    from modelexport.llm.export.calibrate import ImageRows, calibration_samples
    from modelexport.frontends.vlm_folder import text_decoder
    from modelexport.llm.model.mrope import rope_index
    model, family, facts = loaded
    seq, rows = 32, np.random.default_rng(0).normal(size=(QWEN2_VL_TOKENS, 64)).astype(np.float32)
    block = [START, *[IMAGE_TOKEN] * QWEN2_VL_TOKENS, END]
    images = ImageRows(IMAGE_TOKEN, [block], [rows], (GRID, 2))
    text = [int(t) for t in np.random.default_rng(1).integers(3, 250, 4 * seq)]
    # ar4 + ar1 in a window of 32: 6 of each per window, so samples 6 and 7 are window 1's first calls
    got = calibration_samples(text_decoder(model, family), text, [4, 1], seq, 8, {}, images)
    window = images.windows[1]
    assert window[:len(block) + 1] == [text[seq], *block]
    grid = rope_index(window, IMAGE_TOKEN, GRID, 2)
    first = got[4][6]                        # window 1, positions 0-3: the first token, vision_start, 2 image rows
    np.testing.assert_array_equal(first["rope_position_ids"], grid(np.arange(4)[None]))
    assert not np.array_equal(first["rope_position_ids"][1], first["rope_position_ids"][2])   # rows and columns differ
    np.testing.assert_allclose(first["inputs_embeds"][0, 2:4], rows[:2], rtol=0, atol=0)
    step = got[1][6]                         # window 1's ar1 call at position 4: the third image row
    np.testing.assert_array_equal(step["rope_position_ids"], grid(np.array([[4]])))
    np.testing.assert_allclose(step["inputs_embeds"][0, 0], rows[2], rtol=0, atol=0)
    text_sample = got[4][0]["rope_position_ids"]        # window 0: text positions on every axis
    assert (text_sample == np.arange(4)).all()
