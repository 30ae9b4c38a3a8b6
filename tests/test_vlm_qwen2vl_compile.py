"""`compile QWEN2_VL_FOLDER` and `generate BUNDLE --image` on a tiny random Qwen2-VL built here (issue 23):
one bundle with the vision part (the fixed 56 x 56 grid, 16a8w) and the embeddings-in decoder taking
M-RoPE positions (`rope_position_ids` [3, 1, N] for `position_ids`), every node on the HTP, and the
first-step logits with a real photo against transformers' Qwen2VLForConditionalGeneration on the CPU (QDQ
graphs) and on the simulator. One tiny compile."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from vlm_tiny import (IMAGE_TOKEN, QWEN2_VL_IDS, QWEN2_VL_SIZE, QWEN2_VL_TOKENS, assert_every_node_on_the_htp,  # noqa: E402
                      hf_qwen_first_logits, write_tiny_vlm_folder)

SEQ = 32
GRID = [1, QWEN2_VL_SIZE // 14, QWEN2_VL_SIZE // 14]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen2vl_compile")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        write_tiny_vlm_folder(root, "qwen2_vl")
        yield root


@pytest.fixture(scope="module")
def bundle(work):
    import modelexport
    return modelexport.compile(str(work / "tiny_qwen2_vl"), output=work / "qwen2vl", target="SM8650",
                               precision="16a8w", max_seq_len=SEQ, variants="ar1,ar4",
                               calibration=str(work / "calib.txt"), calibration_samples=2)


def test_every_node_on_the_htp_and_the_vision_entry(bundle):
    m = bundle.manifest
    v = m.llm.vision
    assert (v.family, v.position_rule, v.grid_thw, v.spatial_merge_size) == ("qwen2_vl", "mrope_grid", GRID, 2)
    assert (v.image_size, v.tokens_per_image, v.image_token_id) == (QWEN2_VL_SIZE, QWEN2_VL_TOKENS, IMAGE_TOKEN)
    assert v.image_wrap_ids == [QWEN2_VL_IDS["vision_start_token_id"], QWEN2_VL_IDS["vision_end_token_id"]]
    assert v.check["SM8650"].sqnr_db > 30            # the simulator vs the float vision part, on a real photo
    assert "at M-RoPE grid positions" in v.decoder_image_calibration
    decoders = [g for g in m.graphs if g.name.startswith(("prompt_", "token_"))]
    assert len(decoders) >= 2
    for g in decoders:
        names = {t.name for t in g.inputs}
        assert {"inputs_embeds", "rope_position_ids"} <= names and "position_ids" not in names, g.name
    print(f"vision part vs float on the simulator: {v.check['SM8650'].sqnr_db} dB; HTP nodes:",
          {graph: per_target["SM8650"]["htp_nodes"] for graph, per_target in m.placement.items()})
    assert_every_node_on_the_htp(m)


def _float_logits(folder: Path, ids: list[int], image) -> np.ndarray:
    from transformers import Qwen2VLForConditionalGeneration

    from modelexport.frontends.vlm_families import read_vision_facts
    from modelexport.llm.run.vision_inputs import load_pixels
    _, f = read_vision_facts(folder)
    x, _ = load_pixels(image, f.image_size, f.mean, f.std, f.rescale_factor)
    return hf_qwen_first_logits(Qwen2VLForConditionalGeneration.from_pretrained(folder).eval(), ids, x, GRID)


def test_generate_with_an_image_gives_the_float_model_logits(bundle, work):
    """First-step logits (the image between <|vision_start|> and <|vision_end|>, M-RoPE positions from the
    image grid) vs transformers' full model on the same pixels and ids, on the CPU and the simulator."""
    from modelexport.backends.llm_qnn.vision_session import generate_with_image
    from modelexport.core.numerics import compare
    from modelexport.zoo.assets import sample_images
    photos = sample_images()
    photo = photos["coffee"]
    for backend in ("cpu", "htp-sim"):
        r = generate_with_image(bundle.path, photo, "What is it?", backend=backend, max_new_tokens=3, raw=True)
        ids = r["prompt_ids"]
        assert ids[1:3 + QWEN2_VL_TOKENS] == [QWEN2_VL_IDS["vision_start_token_id"], *[IMAGE_TOKEN] * QWEN2_VL_TOKENS,
                                              QWEN2_VL_IDS["vision_end_token_id"]]
        ref = _float_logits(work / "tiny_qwen2_vl", ids, photo)
        sqnr = compare(ref, r["first_logits"])["sqnr_db"]
        print(f"{backend}: first-step logits {sqnr:.2f} dB vs the float Qwen2-VL")
        assert sqnr > 30 and ref.argmax() == r["first_logits"].argmax(), (backend, sqnr)
        other = _float_logits(work / "tiny_qwen2_vl", ids, photos["chelsea"])   # the image's own effect is kept
        effect = compare(ref - other, r["first_logits"] - other)["sqnr_db"]
        print(f"{backend}: the image's effect (coffee minus chelsea, float) reproduced at {effect:.2f} dB")
        assert effect > 6, (backend, effect)


def test_genie_is_refused_for_mrope_positions(bundle, tmp_path):
    """Genie's dialog does not feed rope_position_ids (its qwen2vl-mrope option feeds position_ids_cos / _sin):
    the build records libGenie's refusal as a known limit, writes no pipeline, and --backend genie says so."""
    from PIL import Image

    from modelexport.backends.llm_qnn.vision_session import generate_with_image
    from modelexport.core.errors import InputError
    g = bundle.manifest.llm.genie["SM8650"]
    assert g.accepted and g.dialog_created is False and g.pipeline is None
    assert "rope_position_ids" in g.dialog_note and "qwen2vl-mrope" in g.dialog_note
    Image.new("RGB", (8, 8)).save(tmp_path / "ok.png")
    with pytest.raises(InputError) as e:
        generate_with_image(bundle.path, tmp_path / "ok.png", "Hi", backend="genie")
    assert "M-RoPE" in str(e.value) and "--backend htp-sim" in e.value.fix
    from modelexport.core.errors import UnsupportedError
    from modelexport.llm import LoadOptions
    from modelexport.backends.llm_qnn.genie_generate import open_genie
    with pytest.raises(UnsupportedError) as e:        # text alone through Genie: the same limit, said before running it
        open_genie(bundle.path, LoadOptions())
    assert "rope_position_ids" in str(e.value) and "--backend htp-sim" in e.value.fix


def test_a_full_context_graph_is_refused_before_loading(work, tmp_path):
    import modelexport
    from modelexport.core.errors import InputError
    with pytest.raises(InputError) as e:
        modelexport.compile(str(work / "tiny_qwen2_vl"), output=tmp_path / "out", target="SM8650", variants="ar1,ar4,full")
    assert "M-RoPE" in str(e.value) and "--variants ar1" in e.value.fix
    assert not (tmp_path / "out").exists()


def test_a_decoder_exported_in_host_chunks_joins_with_its_mrope_input(bundle, work):
    """Host chunks (one layer at a time: what a large model's parts get) are joined into graphs that
    take rope_position_ids, as the whole part does."""
    import modelexport
    chunked = modelexport.compile(str(work / "tiny_qwen2_vl"), output=work / "qwen2vl_chunked", target="SM8650",
                                  precision="16a8w", max_seq_len=SEQ, variants="ar1,ar4", calibration=str(work / "calib.txt"),
                                  calibration_samples=2, host_chunk_mb=0.001)
    assert len(chunked.manifest.options["host_chunks"]["layers"]) > 1
    for g in chunked.manifest.graphs:
        if g.name.startswith(("prompt_", "token_")):
            names = {t.name for t in g.inputs}
            assert "rope_position_ids" in names and "position_ids" not in names, g.name
