"""Qwen2.5-VL folders (issue 23): a tiny random Qwen2.5-VL cut down from Qwen2.5-VL-3B's config (a 2-block
windowed ViT, block 1 full attention; patch 14, merge 2 and window 112 kept: a 224 x 224 image is 4 windows,
64 image tokens; the Qwen2 + M-RoPE text model of the Qwen2-VL tests). In float: the vision part (windows as
constants) against transformers' get_image_features, the whole pipeline against
Qwen2_5_VLForConditionalGeneration. Compiled (one tiny compile, ~1 min): every node on the HTP, and
`generate --image` on the CPU (QDQ) and the simulator against the float model. Heavy (`make test-heavy`): a tower
of the real 3B width at 448 px, all on the HTP."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from vlm_tiny import (IMAGE_TOKEN, QWEN2_VL_IDS, QWEN25_VL_SIZE, QWEN25_VL_TOKENS, QWEN25_VL_WINDOWS,  # noqa: E402
                      assert_every_node_on_the_htp, hf_qwen_first_logits, hf_qwen_pixels, image_runner,
                      write_tiny_vlm_folder)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
START, END = QWEN2_VL_IDS["vision_start_token_id"], QWEN2_VL_IDS["vision_end_token_id"]
GRID = (1, QWEN25_VL_SIZE // 14, QWEN25_VL_SIZE // 14)
SEQ = 128                     # the default image size takes at most half: 224 x 224 = 64 tokens


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25vl")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        write_tiny_vlm_folder(root, "qwen2_5_vl")
        yield root


@pytest.fixture(scope="module")
def loaded(work):
    from modelexport.frontends.vlm_folder import load_vlm
    return load_vlm(work / "tiny_qwen2_5_vl", max_seq_len=SEQ)


def _prompt(text=(72, 105, 33, 10, 87, 104)) -> list[int]:
    from modelexport.llm.run.vision_inputs import image_prompt_ids
    return image_prompt_ids([256, *text], IMAGE_TOKEN, QWEN25_VL_TOKENS, (START, END))


def test_the_row_reads_the_tiny_folder(loaded):
    _, family, facts = loaded
    assert (family.model_type, facts.position_rule, facts.text_model_type) == ("qwen2_5_vl", "mrope_grid", "qwen2")
    assert (facts.image_size, facts.tokens_per_image, facts.grid_thw, facts.spatial_merge_size) == \
        (QWEN25_VL_SIZE, QWEN25_VL_TOKENS, GRID, 2)
    assert facts.image_wrap_ids == (START, END)


def test_vision_part_is_the_hf_image_features(loaded, tmp_path):
    """Windows (4 of 64 patches) in block 0, all rows in block 1: equal to transformers to 1e-5, in torch and
    through the exported ONNX graph; with every block full attention transformers gives other rows (the
    windows matter: the check can fail)."""
    import onnxruntime as ort

    from modelexport.llm.model.vision_part import VisionPart, export_vision_part
    model, family, facts = loaded
    part = VisionPart(model, family, facts)
    assert (part.inner.windows, part.inner.full_blocks) == (QWEN25_VL_WINDOWS, {1})
    x = torch.randn(1, 3, QWEN25_VL_SIZE, QWEN25_VL_SIZE, generator=torch.Generator().manual_seed(0))
    tower = model.model.visual
    with torch.no_grad():
        ref = model.model.get_image_features(hf_qwen_pixels(x), torch.tensor([GRID])).pooler_output[0]
        got = part(x)[0]
        full, tower.fullatt_block_indexes = tower.fullatt_block_indexes, [0, 1]
        try:
            all_full = model.model.get_image_features(hf_qwen_pixels(x), torch.tensor([GRID])).pooler_output[0]
        finally:
            tower.fullatt_block_indexes = full
    assert got.shape == (QWEN25_VL_TOKENS, 64)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert (all_full - ref).abs().max() > 1e-3
    out = ort.InferenceSession(str(export_vision_part(part, tmp_path / "vision.onnx")),
                               providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x.numpy()})[0]
    np.testing.assert_allclose(out[0], ref.numpy(), atol=1e-5)


def test_float_pipeline_first_logits_are_the_full_model(loaded):
    """Our float pipeline on a real photo (the runtime's pixels, the vision part, its rows at the image tokens,
    M-RoPE positions, the static decoder through the runner in ar16 chunks) against
    Qwen2_5_VLForConditionalGeneration on the same pixels and ids: first-step logits to 1e-4."""
    from modelexport.frontends.vlm_folder import text_decoder
    from modelexport.llm.model.mrope import rope_index
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.vision_inputs import load_pixels
    from modelexport.llm.model.vision_part import VisionPart
    from modelexport.zoo.assets import sample_images
    model, family, facts = loaded
    x, _ = load_pixels(sample_images()["coffee"], facts.image_size, facts.mean, facts.std, facts.rescale_factor)
    ids = _prompt()
    assert ids[1:3 + QWEN25_VL_TOKENS] == [START, *[IMAGE_TOKEN] * QWEN25_VL_TOKENS, END]
    ref = hf_qwen_first_logits(model, ids, x, GRID)
    with torch.no_grad():
        rows = VisionPart(model, family, facts)(torch.from_numpy(x)).numpy()
        without_image = model(input_ids=torch.tensor([ids])).logits[0, -1].numpy()
    dec = build_static_decoder(text_decoder(model, family), StaticDecoderConfig(16, SEQ), inputs="embeddings")
    dec.rope_positions = rope_index(ids, IMAGE_TOKEN, GRID, 2)
    where = [i for i, tok in enumerate(ids) if tok == IMAGE_TOKEN]
    got = image_runner(dec, dict(zip(where, rows[0])), variants=(1, 16)).prefill(ids).numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert np.abs(without_image - ref).max() > 1e-2     # the image and its positions matter: the check can fail


# ---- compiled: one tiny compile (16a8w, ar1 + ar16, C = 128, SM8650)

@pytest.fixture(scope="module")
def bundle(work):
    import modelexport
    return modelexport.compile(str(work / "tiny_qwen2_5_vl"), output=work / "qwen25vl", target="SM8650",
                               precision="16a8w", max_seq_len=SEQ, variants="ar1,ar16",
                               calibration=str(work / "calib.txt"), calibration_samples=2)


def test_every_node_on_the_htp_and_the_vision_entry(bundle):
    m = bundle.manifest
    v = m.llm.vision
    assert (v.family, v.position_rule, v.grid_thw, v.spatial_merge_size) == ("qwen2_5_vl", "mrope_grid", list(GRID), 2)
    assert (v.image_size, v.tokens_per_image, v.image_wrap_ids) == (QWEN25_VL_SIZE, QWEN25_VL_TOKENS, [START, END])
    assert v.check["SM8650"].sqnr_db > 30            # the simulator vs the float vision part, on a real photo
    for g in m.graphs:
        if g.name.startswith(("prompt_", "token_")):
            assert "rope_position_ids" in {t.name for t in g.inputs}, g.name
    print(f"vision part vs float on the simulator: {v.check['SM8650'].sqnr_db} dB; HTP nodes:",
          {graph: per_target["SM8650"]["htp_nodes"] for graph, per_target in m.placement.items()})
    assert_every_node_on_the_htp(m)
    assert "rope_position_ids" in m.llm.genie["SM8650"].dialog_note   # Genie's M-RoPE limit, as for Qwen2-VL


def _float_logits(folder: Path, ids: list[int], image) -> np.ndarray:
    from transformers import Qwen2_5_VLForConditionalGeneration

    from modelexport.frontends.vlm_families import read_vision_facts
    from modelexport.llm.run.vision_inputs import load_pixels
    _, f = read_vision_facts(folder, max_seq_len=SEQ)
    x, _ = load_pixels(image, f.image_size, f.mean, f.std, f.rescale_factor)
    return hf_qwen_first_logits(Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval(), ids, x, GRID)


def test_generate_with_an_image_gives_the_float_model_logits(bundle, work):
    """First-step logits (the image between <|vision_start|> and <|vision_end|>, M-RoPE positions from its
    grid) vs transformers' full model on the same pixels and ids, on the CPU (QDQ) and the simulator; the
    image's own effect on them (float with coffee minus float with chelsea) is kept too."""
    from modelexport.backends.llm_qnn.vision_session import generate_with_image
    from modelexport.core.numerics import compare
    from modelexport.zoo.assets import sample_images
    photos = sample_images()
    folder = work / "tiny_qwen2_5_vl"
    for backend in ("cpu", "htp-sim"):
        r = generate_with_image(bundle.path, photos["coffee"], "What is it?", backend=backend, max_new_tokens=2, raw=True)
        ids = r["prompt_ids"]
        assert ids[1:3 + QWEN25_VL_TOKENS] == [START, *[IMAGE_TOKEN] * QWEN25_VL_TOKENS, END]
        ref = _float_logits(folder, ids, photos["coffee"])
        sqnr = compare(ref, r["first_logits"])["sqnr_db"]
        effect = compare(ref - (other := _float_logits(folder, ids, photos["chelsea"])), r["first_logits"] - other)["sqnr_db"]
        print(f"{backend}: first-step logits {sqnr:.2f} dB vs the float Qwen2.5-VL; the image's effect {effect:.2f} dB")
        assert sqnr > 30 and ref.argmax() == r["first_logits"].argmax(), (backend, sqnr)
        assert effect > 6, (backend, effect)


def test_generate_cli_with_an_image(bundle, cli_here):
    """`generate BUNDLE --image X --prompt ...` on both backends (chat template: the tiny tokenizer has none, so
    the prompt is plain): exit 0, the resize note, the image's block after the first token, two new tokens."""
    import json

    from modelexport.zoo.assets import sample_images
    for backend in ("cpu", "htp-sim"):
        proc = cli_here("generate", str(bundle.path), "--image", str(sample_images()["chelsea"]), "--prompt", "What is it?",
                        "--backend", backend, "-n", "2", "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["notes"] == [f"image of 451x300 resized to {QWEN25_VL_SIZE}x{QWEN25_VL_SIZE} (the vision part's size)"]
        assert out["prompt_ids"][1:3 + QWEN25_VL_TOKENS] == [START, *[IMAGE_TOKEN] * QWEN25_VL_TOKENS, END]
        assert len(out["token_ids"]) == 2, (backend, out)


@pytest.mark.heavy
def test_a_tower_of_the_real_width_is_all_on_the_htp(tmp_path):
    """Qwen2.5-VL-3B's tower sizes (width 1280, 16 heads of 80, gated MLP 3420) with 2 blocks (block 1 full), random
    weights, at 448 px (16 windows, 256 image tokens), with the tiny text model: every vision node on the HTP and
    the simulator near the float vision part (~4 min)."""
    import copy
    import json

    import modelexport
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from llm_tiny import CALIBRATION_TEXT, tiny_tokenizer
    from vlm_tiny import PREPROCESSORS, QWEN25_VL_3B_CONFIG, tiny_qwen25_vl_config
    cfg = dict(tiny_qwen25_vl_config(), max_position_embeddings=1024)      # room for C = 512
    cfg["vision_config"] = dict(copy.deepcopy(QWEN25_VL_3B_CONFIG["vision_config"]), depth=2, fullatt_block_indexes=[1],
                                out_hidden_size=cfg["hidden_size"])
    torch.manual_seed(0)
    folder = tmp_path / "wide"
    Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**cfg)).save_pretrained(folder)
    tiny_tokenizer().save(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({**PREPROCESSORS["qwen2_vl"], "max_pixels": 448 * 448}))
    (tmp_path / "calib.txt").write_text(CALIBRATION_TEXT)
    b = modelexport.compile(str(folder), output=tmp_path / "out", target="SM8650", precision="16a8w", max_seq_len=512,
                            variants="ar1,ar32", calibration=str(tmp_path / "calib.txt"), calibration_samples=2)
    v = b.manifest.llm.vision
    assert (v.image_size, v.tokens_per_image) == (448, 256)
    assert_every_node_on_the_htp(b.manifest)
    print(f"real-width tower, 448 px: vision {b.manifest.placement['vision']['SM8650']['htp_nodes']} nodes on the HTP, "
          f"{v.check['SM8650'].sqnr_db} dB on the simulator vs float")
    assert v.check["SM8650"].sqnr_db > 25
