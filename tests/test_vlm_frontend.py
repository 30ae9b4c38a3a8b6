"""The VLM frontend in float (issue 23, item 2): the VLM table read from a tiny random Idefics3 folder
built here, the vision part (tower + projector) against transformers' image features, the placement
rule (the text decoder fed the placed rows gives the whole VLM's logits), image preprocessing notes,
and folders the table does not cover refused before any weight is read."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from vlm_tiny import IMAGE_SIZE, IMAGE_TOKEN, MEAN, STD, TOKENS, TOKENS_PER_IMAGE, write_tiny_vlm_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_vlm_folder(tmp_path_factory.mktemp("vlm"))


@pytest.fixture(scope="module", params=["idefics3", "llava"])
def loaded(request, tmp_path_factory):
    from modelexport.frontends.vlm_folder import load_vlm
    return load_vlm(write_tiny_vlm_folder(tmp_path_factory.mktemp(request.param), request.param))


def test_the_table_reads_the_folder(folder):
    from modelexport.frontends.vlm_families import read_vision_facts
    family, facts = read_vision_facts(folder)
    assert family.model_type == "idefics3" and facts.placement == "replace_in_order"
    assert (facts.image_size, facts.tokens_per_image, facts.image_token_id) == (IMAGE_SIZE, TOKENS_PER_IMAGE, IMAGE_TOKEN)
    assert list(facts.mean) == MEAN and list(facts.std) == STD and facts.text_model_type == "llama"


def test_the_llava_row(tmp_path):
    from modelexport.frontends.vlm_families import read_vision_facts
    family, facts = read_vision_facts(write_tiny_vlm_folder(tmp_path, "llava"))
    assert family.model_type == "llava" and (facts.tokens_per_image, facts.image_token_id) == (TOKENS["llava"], IMAGE_TOKEN)


def test_vision_part_is_the_hf_image_features(loaded, tmp_path):
    import onnxruntime as ort

    from modelexport.llm.model.vision_part import VisionPart, export_vision_part
    model, family, facts = loaded
    part = VisionPart(model, family, facts)
    x = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = _hf_image_features(model, x)
        got = part(x)[0]
    assert got.shape == (TOKENS[family.model_type], model.config.text_config.hidden_size)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    onnx_path = export_vision_part(part, tmp_path / "vision.onnx")
    out = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x.numpy()})[0]
    np.testing.assert_allclose(out[0], ref.numpy(), atol=1e-5)


def _hf_image_features(model, x):
    """transformers' own image features of one image [tokens, hidden], whichever family."""
    batched = x[None] if model.config.model_type == "idefics3" else x   # Idefics3 takes [batch, images, 3, S, S]
    return model.model.get_image_features(batched).pooler_output[0]


def test_placed_rows_give_the_vlm_logits(loaded):
    """The text decoder alone, fed its embeddings with the image rows placed at the image tokens,
    gives the whole VLM's logits: the split loses nothing."""
    from modelexport.frontends.vlm_folder import text_decoder
    from modelexport.llm.run.vision_inputs import image_prompt_ids, place_image_rows
    from modelexport.llm.model.vision_part import VisionPart
    model, family, facts = loaded
    k = TOKENS[family.model_type]
    ids = image_prompt_ids([256, 72, 105, 33, 10], IMAGE_TOKEN, k)
    assert ids[1:1 + k] == [IMAGE_TOKEN] * k
    x = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(1))
    lm = text_decoder(model, family)
    with torch.no_grad():
        px = x[None] if family.model_type == "idefics3" else x
        ref = model(input_ids=torch.tensor([ids]), pixel_values=px).logits[0].numpy()
        rows = VisionPart(model, family, facts)(x).numpy()
        embeds = lm.get_input_embeddings()(torch.tensor([ids])).numpy()
        got = lm(inputs_embeds=torch.from_numpy(place_image_rows(embeds, ids, IMAGE_TOKEN, rows))).logits[0].numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4)
    no_image = lm(input_ids=torch.tensor([ids])).logits[0].detach().numpy()
    assert np.abs(no_image - ref).max() > 1e-2        # the rows matter: the check can fail


def test_images_are_resized_and_converted_with_a_note(tmp_path):
    from PIL import Image

    from modelexport.llm.run.vision_inputs import load_pixels
    Image.new("L", (50, 20), 128).save(tmp_path / "gray.png")
    x, notes = load_pixels(tmp_path / "gray.png", IMAGE_SIZE, MEAN, STD, 1 / 255)
    assert x.shape == (1, 3, IMAGE_SIZE, IMAGE_SIZE) and len(notes) == 2
    assert "converted to RGB" in notes[0] and "50x20 resized to 32x32" in notes[1]
    np.testing.assert_allclose(x[0, :, 5, 5], (128 / 255 - np.array(MEAN)) / np.array(STD), atol=1e-5)
    Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE)).save(tmp_path / "ok.png")
    assert load_pixels(tmp_path / "ok.png", IMAGE_SIZE, MEAN, STD, 1 / 255)[1] == []


def test_a_folder_the_table_does_not_cover_is_refused_before_loading(folder, tmp_path):
    from modelexport.core.errors import InputError
    from modelexport.frontends.vlm_folder import load_vlm
    cfg = json.loads((folder / "config.json").read_text())
    for change, words in ((lambda c: c["vision_config"].update(model_type="siglip_vision_model"),
                           ["vision tower 'siglip_vision_model'", "idefics3_vision"]),
                          (lambda c: c.update(model_type="paligemma"), ["'paligemma'", "idefics3", "qwen2_vl"]),
                          (lambda c: c["text_config"].update(model_type="gpt2"), ["'gpt2'", "llama"])):
        bad = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        bad.mkdir()
        c = json.loads(json.dumps(cfg))
        change(c)
        (bad / "config.json").write_text(json.dumps(c))    # no weights at all: refused before they are looked for
        with pytest.raises(InputError) as e:
            load_vlm(bad)
        assert all(w in str(e.value) + (e.value.fix or "") for w in words), str(e.value)


def test_decoder_calibration_places_the_image_rows_as_the_runtime_does():
    """ImageRows (the text decoder's calibration of a VLM): windows 1, 3, ... of the text get an
    image block after their first token, each window still C long; a call's image tokens get that
    window's image rows in order, across calls, and a call at position 0 starts the next window."""
    from modelexport.llm.export.calibrate import ImageRows
    rows = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4) + 1   # 2 images, 3 tokens each, hidden 4
    img = ImageRows(99, [[99] * 3, [99] * 3], list(rows))   # each image's block: its 3 bare image tokens
    text = list(range(10, 40))
    ids = img.stream(text, 8)
    assert ids[:8] == list(range(10, 18)) and ids[8:16] == [18, 99, 99, 99, 19, 20, 21, 22]
    assert ids[16:24] == list(range(23, 31)) and ids[24:32] == [31, 99, 99, 99, 32, 33, 34, 35]
    for start, expect_image in ((0, None), (8, 0), (16, None), (24, 1)):   # the walk goes window by window
        window = torch.tensor([ids[start:start + 8]])
        got = []
        for i in (0, 4):
            img.start_call(torch.arange(i, i + 4)[None])
            got.append(img.place(window[:, i:i + 4], torch.zeros(1, 4, 4)))
        got = torch.cat(got, 1)[0]
        if expect_image is None:
            assert not got.any()
            continue
        np.testing.assert_array_equal(got[1:4].numpy(), rows[expect_image])
        assert not got[0].any() and not got[4:].any()
