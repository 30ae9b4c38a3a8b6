"""SmolVLM's image splitting (issue 23): a tiny random Idefics3 whose tokenizer holds the processor's
tokens and whose preprocessor config splits images (tests/vlm_tiny.py: tiles of 32, longest edge 64,
so a photo becomes 2x2 tiles + the global image). Against transformers' own Idefics3Processor (PIL
backend) and Idefics3ForConditionalGeneration: the tiles' pixels and the expanded prompt ids, the float
path's logits, then the compiled bundle's first-step logits on the CPU (QDQ graphs) and on the
simulator, with one and with two images; too many tiles for the context refused before any vision run.
One tiny compile (~60 CPU-s)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from vlm_tiny import IMAGE_SIZE, IMAGE_TOKEN, TOKENS_PER_IMAGE, write_tiny_tiling_folder  # noqa: E402

SEQ = 128
PROMPT = "What is it?"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm_tiling")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        write_tiny_tiling_folder(root)
        yield root


@pytest.fixture(scope="module")
def processor(work):
    """transformers' Idefics3Processor over the folder's own image processor and tokenizer."""
    from transformers import AutoImageProcessor, AutoTokenizer, Idefics3Processor
    from transformers.processing_utils import ProcessorMixin
    folder = work / "tiny_smolvlm"
    with pytest.MonkeyPatch.context() as mp:
        # its class check imports every tokenizer backend, mistral_common's too, which needs a package this
        # venv lacks (pydantic_extra_types); the check only compares class names, the processing is untouched
        mp.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
        return Idefics3Processor(image_processor=AutoImageProcessor.from_pretrained(folder),
                                 tokenizer=AutoTokenizer.from_pretrained(folder), image_seq_len=TOKENS_PER_IMAGE)


@pytest.fixture(scope="module")
def photos():
    from PIL import Image

    from modelexport.zoo.assets import sample_images
    return {k: Image.open(p).convert("RGB") for k, p in sample_images().items()}


def _hf_inputs(processor, images, text=None):
    return processor(images=images, text=text or "<image>" * len(images) + PROMPT, return_tensors="pt")


def _hf_logits(folder: Path, inputs) -> np.ndarray:
    from transformers import Idefics3ForConditionalGeneration
    model = Idefics3ForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**{k: inputs[k] for k in ("input_ids", "pixel_values", "pixel_attention_mask")}).logits[0, -1].numpy()


def test_tiles_and_prompt_are_the_processors(work, processor, photos):
    """Each photo (600x400, 451x300) becomes 2x2 tiles + the global image with the processor's pixels,
    and the prompt expands to the processor's ids exactly, for one image and for two."""
    from modelexport.frontends.vlm_families import read_vision_facts
    from modelexport.frontends.vlm_folder import read_image_tiling
    from modelexport.llm.model.image_tiling import TileGrid, expand_prompt, normalize, split_image, tile_grid
    from modelexport.llm.run.tokenizers import load_tokenizer
    folder = work / "tiny_smolvlm"
    family, facts = read_vision_facts(folder)
    t = read_image_tiling(folder, family, facts)
    assert t == dict(splitting=True, tile_size=IMAGE_SIZE, longest_edge=2 * IMAGE_SIZE, max_tiles=5, resample=1,
                     image_seq_len=TOKENS_PER_IMAGE)
    tok = load_tokenizer(folder / "tokenizer.json")
    for images in ([photos["coffee"]], [photos["coffee"], photos["chelsea"]]):
        ref = _hf_inputs(processor, images)
        grids, pixels = [], []
        for im in images:
            tiles, grid = split_image(im, t["longest_edge"], t["tile_size"], t["resample"])
            assert grid == tile_grid(im.width, im.height, t["longest_edge"], t["tile_size"]) == TileGrid(2, 2)
            grids.append(grid)
            pixels += [normalize(x, facts.mean, facts.std, facts.rescale_factor)[0] for x in tiles]
        np.testing.assert_allclose(np.stack(pixels), ref["pixel_values"][0].numpy(), rtol=0, atol=1e-6)
        ids = tok.encode(expand_prompt("<image>" * len(images) + PROMPT, grids, TOKENS_PER_IMAGE))
        assert ids == ref["input_ids"][0].tolist()
        assert ids.count(IMAGE_TOKEN) == 5 * TOKENS_PER_IMAGE * len(images)


def test_float_path_gives_the_hf_logits(work, processor, photos):
    """The split that the bundle runs, in float: the vision part once per tile (batch 1), its rows placed in
    order at the image tokens of the text decoder's embeddings, gives the whole VLM's logits on the
    processor's inputs (two images, 10 tiles), at every position (the image positions' logits follow
    their own rows: a tile out of order shows there; at the last position a random 2-layer model
    carries little of the image, ~53 dB between the two photos swapped)."""
    from modelexport.frontends.vlm_folder import load_vlm, text_decoder
    from modelexport.llm.run.vision_inputs import place_image_rows
    from modelexport.llm.model.vision_part import VisionPart
    model, family, facts = load_vlm(work / "tiny_smolvlm")
    ref_inputs = _hf_inputs(processor, [photos["coffee"], photos["chelsea"]])
    ids = ref_inputs["input_ids"][0].tolist()
    part, lm = VisionPart(model, family, facts), text_decoder(model, family)
    with torch.no_grad():
        rows = torch.cat([part(x[None])[0] for x in ref_inputs["pixel_values"][0]])
        embeds = lm.get_input_embeddings()(torch.tensor([ids])).numpy()
        placed = place_image_rows(embeds, ids, IMAGE_TOKEN, rows.numpy())
        got = lm(inputs_embeds=torch.from_numpy(placed)).logits[0].numpy()
        ref = model(**{k: ref_inputs[k] for k in ("input_ids", "pixel_values", "pixel_attention_mask")}).logits[0]
    np.testing.assert_allclose(got, ref.numpy(), rtol=0, atol=1e-4)


def test_calibration_sees_what_the_runtime_shows(work, processor, photos):
    """The vision part is calibrated on each calibration photo's tiles and global view (the processor's pixels),
    the decoder's image windows on the photo's block of prompt ids (the processor's) with those views' rows at
    its image tokens; thinned to the sample budget, every global view stays."""
    from modelexport.llm.export.calibrate import ImageRows
    from modelexport.backends.llm_qnn.vlm_calibration import (calibration_images, image_blocks, vision_samples,
                                                              write_image_rows, write_vision_calibration)
    from modelexport.frontends.vlm_families import read_vision_facts
    from modelexport.frontends.vlm_folder import load_vlm, read_image_tiling
    from modelexport.llm.run.tokenizers import load_tokenizer
    from modelexport.llm.model.vision_part import VisionPart, export_vision_part
    from PIL import ImageOps
    folder = work / "tiny_smolvlm"
    family, facts = read_vision_facts(folder)
    tiling = read_image_tiling(folder, family, facts)
    images = calibration_images(facts, tiling)
    assert [im.name for im in images] == ["chelsea", "chelsea mirrored", "coffee", "coffee mirrored"]
    assert all((im.rows, im.cols, len(im.views)) == (2, 2, 5) for im in images)
    for im in images:
        photo = photos[im.name.split()[0]]
        ref = _hf_inputs(processor, [ImageOps.mirror(photo) if "mirrored" in im.name else photo])
        np.testing.assert_allclose(im.views, ref["pixel_values"][0].numpy(), rtol=0, atol=1e-6)
    path, what = write_vision_calibration(images, work / "vision_calibration.npz")
    assert np.load(path)["pixel_values"].shape == (20, 1, 3, IMAGE_SIZE, IMAGE_SIZE) and what.startswith("20 views")
    thin = vision_samples(images, limit=6)       # the 4 global views and 2 tiles
    assert len(thin) == 6 and sum(any(np.array_equal(t[0], im.views[-1]) for im in images) for t in thin) == 4

    blocks = image_blocks(images, facts, tiling, load_tokenizer(folder / "tokenizer.json"), SEQ)
    ref_ids = _hf_inputs(processor, [photos["coffee"]])["input_ids"][0].tolist()
    block, views = blocks[2]
    at = ref_ids.index(block[0])
    assert ref_ids[at:at + len(block)] == block and block.count(IMAGE_TOKEN) == 5 * TOKENS_PER_IMAGE
    assert list(views) == [0, 1, 2, 3, 4]
    short = image_blocks(images, facts, tiling, load_tokenizer(folder / "tokenizer.json"), 2 * len(block) - 2)
    assert short[0][0].count(IMAGE_TOKEN) == TOKENS_PER_IMAGE and list(short[0][1]) == [4]   # the global view alone

    model, family, facts = load_vlm(folder)
    onnx = export_vision_part(VisionPart(model, family, facts), work / "calib_vision" / "vision.onnx")
    rows = ImageRows.load(write_image_rows(onnx, images, blocks, facts, work / "image_rows.npz"))
    text = list(range(3, 3 + 3 * SEQ))
    stream = rows.stream(text, SEQ)
    assert stream[:SEQ] == text[:SEQ] and stream[SEQ:2 * SEQ] == [text[SEQ], *blocks[0][0], *text[SEQ + 1:2 * SEQ - len(blocks[0][0])]]
    with torch.no_grad():
        want = torch.cat([VisionPart(model, family, facts)(torch.from_numpy(v[None]))[0] for v in images[0].views])
    np.testing.assert_allclose(rows.rows[0], want.numpy(), rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def bundle(work):
    import modelexport
    return modelexport.compile(str(work / "tiny_smolvlm"), output=work / "vlm", target="SM8650", precision="16a8w",
                               max_seq_len=SEQ, variants="ar1,ar16", calibration=str(work / "calib.txt"),
                               calibration_samples=2)


def test_the_bundle_records_its_tiling(bundle):
    t = bundle.manifest.llm.vision.tiling
    assert (t.splitting, t.tile_size, t.longest_edge, t.max_tiles, t.image_seq_len) == (True, 32, 64, 5, TOKENS_PER_IMAGE)
    v = bundle.manifest.llm.vision      # calibrated on the tiles and global views the runtime makes
    assert v.calibration.startswith("20 views (tiles of 2x2 + the global views"), v.calibration
    assert "the prompt's image block as the runtime writes it" in v.decoder_image_calibration


@pytest.mark.parametrize("names", [("coffee",), ("coffee", "chelsea")])
def test_generate_with_tiles_gives_the_hf_logits(bundle, work, processor, photos, names):
    """`generate --image` on the bundle: the prompt ids are the processor's, the first step's logits
    against transformers' float VLM fed the processor's inputs, on the CPU (QDQ graphs) and the simulator
    (measured 42.0 / 44.5 dB one photo, 42.3 / 44.8 dB two). The rows, tile by tile in prompt order, are
    transformers' image features of the processor's pixels (float ONNX part; the simulator's by SQNR)."""
    from transformers import Idefics3ForConditionalGeneration

    from modelexport.backends.llm_qnn.vision_session import generate_with_image, tiled_rows
    from modelexport.core.numerics import compare
    images = [photos[n] for n in names]
    ref_inputs = _hf_inputs(processor, images)
    ref = _hf_logits(work / "tiny_smolvlm", ref_inputs)
    model = Idefics3ForConditionalGeneration.from_pretrained(work / "tiny_smolvlm").eval()
    with torch.no_grad():
        hf_rows = model.model.get_image_features(ref_inputs["pixel_values"], ref_inputs["pixel_attention_mask"])
    hf_rows = torch.cat([t.reshape(-1, t.shape[-1]) for t in hf_rows.pooler_output]).numpy()   # per image
    np.testing.assert_allclose(tiled_rows(bundle, images, True, "float"), hf_rows, rtol=0, atol=1e-4)
    assert compare(hf_rows, tiled_rows(bundle, images, True, "htp-sim"))["sqnr_db"] > 30
    for backend in ("cpu", "htp-sim"):
        r = generate_with_image(bundle.path, images, PROMPT, backend=backend, max_new_tokens=2, raw=True)
        assert r["prompt_ids"] == ref_inputs["input_ids"][0].tolist(), backend
        assert any("split into 2x2 tiles of 32" in n for n in r["notes"])
        sqnr = compare(ref, r["first_logits"])["sqnr_db"]
        print(f"{names} {backend}: {sqnr:.2f} dB")
        assert sqnr > 35 and ref.argmax() == r["first_logits"].argmax(), (backend, sqnr)


def test_too_many_tiles_are_refused_before_running(bundle, work, photos, processor):
    """Four photos are 4 x 5 tiles: more prompt tokens than the 128 the bundle holds; refused with the
    numbers and the ways out; without splitting (one tile each) they fit and give the processor's ids."""
    from modelexport.backends.llm_qnn.vision_session import generate_with_image
    from modelexport.core.errors import InputError
    images = [photos["coffee"], photos["chelsea"]] * 2
    with pytest.raises(InputError) as e:
        generate_with_image(bundle.path, images, PROMPT, backend="htp-sim", max_new_tokens=1, raw=True)
    words = str(e.value) + e.value.fix
    assert all(w in words for w in ("4 image(s) in 20 tiles", "context holds 128", "--max-seq-len",
                                    "smaller image", "--no-image-splitting")), words
    r = generate_with_image(bundle.path, images, PROMPT, backend="cpu", max_new_tokens=1, raw=True, image_splitting=False)
    ref = processor(images=images, text="<image>" * 4 + PROMPT, do_image_splitting=False, return_tensors="pt")
    assert r["prompt_ids"] == ref["input_ids"][0].tolist()
    with pytest.raises(InputError, match="2 <image> markers for 1 images"):
        generate_with_image(bundle.path, [photos["coffee"]], "<image>a<image>b", backend="cpu", raw=True)


@pytest.mark.heavy
def test_generate_cli_with_two_images(bundle, cli, work, tmp_path, photos):
    """The command line: --image twice, the split noted; too many tiles a clean error naming
    --no-image-splitting, which then runs (~30 s: three runs of the command)."""
    from conftest import assert_clean_error
    paths = []
    for name in ("coffee", "chelsea"):
        photos[name].save(tmp_path / f"{name}.png")
        paths += ["--image", str(tmp_path / f"{name}.png")]
    proc = cli("generate", str(bundle.path), *paths, "--prompt", PROMPT, "--raw", "--backend", "cpu", "-n", "2")
    assert proc.returncode == 0, proc.stderr
    assert "600x400 split into 2x2 tiles of 32" in proc.stderr and "451x300 split into 2x2" in proc.stderr
    assert_clean_error(cli("generate", str(bundle.path), *paths * 2, "--prompt", PROMPT, "--raw", "--backend", "cpu"),
                       "context holds 128", "--no-image-splitting")
    proc = cli("generate", str(bundle.path), *paths * 2, "--prompt", PROMPT, "--raw", "--backend", "cpu", "-n", "1",
               "--no-image-splitting")
    assert proc.returncode == 0, proc.stderr
    assert "resized to 32x32 (one tile)" in proc.stderr


# SmolVLM's chat template walks the user turn's content parts (as in its tokenizer_config / chat_template.json)
SMOLVLM_TEMPLATE = ("<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
                    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
                    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
                    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
                    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")


def test_chat_template_keeps_the_markers():
    """Without --raw the markers go through the chat template: a string template takes the prompt as it is,
    SmolVLM's (content parts) gets text and image parts in order; one that drops them is refused."""
    from modelexport.backends.llm_qnn.vision_session import chat_text
    from modelexport.core.errors import InputError
    from vlm_tiny import tiling_tokenizer
    tok = tiling_tokenizer()
    assert chat_text(tok, "<image>What is it?") == tok.render_chat([{"role": "user", "content": "<image>What is it?"}])
    tok.chat_template = SMOLVLM_TEMPLATE
    assert chat_text(tok, "<image>What is it?") == "<|im_start|>User:<image>What is it?<end_of_utterance>\nAssistant:"
    assert chat_text(tok, "A<image>B<image>") == "<|im_start|>User: A<image>B<image><end_of_utterance>\nAssistant:"
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    with pytest.raises(InputError, match="drops the prompt's text"):
        chat_text(tok, "<image>Hi")


def test_genie_pipeline_takes_the_tiles_rows(bundle, photos):
    """`--backend genie` on the tiling bundle: Genie's pipeline takes the expanded prompt and the ten tiles'
    rows (two photos) and answers with our simulator loop's greedy tokens."""
    from modelexport.backends.llm_qnn.vision_session import generate_with_image
    images = [photos["coffee"], photos["chelsea"]]
    ours = generate_with_image(bundle.path, images, PROMPT, backend="htp-sim", max_new_tokens=3, raw=True)
    genie = generate_with_image(bundle.path, images, PROMPT, backend="genie", max_new_tokens=3, raw=True)
    assert genie["prompt_ids"] == ours["prompt_ids"] and genie["token_ids"] == ours["token_ids"]


def test_a_tile_size_other_than_the_towers_is_refused(tmp_path):
    """max_image_size must be the tower's image_size (the vision part is one tile): refused at compile,
    before any weight, naming both; a tokenizer without the processor's tokens keeps the one-image path."""
    import json

    import modelexport
    from modelexport.core.errors import InputError
    from modelexport.frontends.vlm_families import read_vision_facts
    from modelexport.frontends.vlm_folder import read_image_tiling
    from vlm_tiny import TILING_PREPROCESSOR, tiny_tokenizer
    folder = write_tiny_tiling_folder(tmp_path)
    (folder / "preprocessor_config.json").write_text(json.dumps({**TILING_PREPROCESSOR, "max_image_size": {"longest_edge": 64}}))
    with pytest.raises(InputError) as e:
        modelexport.compile(str(folder), output=tmp_path / "out", target="SM8650")
    assert "max_image_size.longest_edge is 64" in str(e.value) and "image_size is 32" in str(e.value)
    assert not (tmp_path / "out").exists()
    tiny_tokenizer().save(folder)    # no <image> token: the bundle takes one image, raw image tokens
    assert read_image_tiling(folder, *read_vision_facts(folder)) is None
