"""The vision part's square for Qwen2-VL (--image-size, and the default that leaves room for text) and the
fixed towers (Idefics3 / LLaVA): config checks only, no weights read, no compile."""
import json
import shutil

import pytest

from modelexport.core.errors import InputError
from modelexport.frontends.vlm_families import read_vision_facts

from conftest import assert_clean_error
from vlm_tiny import PREPROCESSORS, QWEN25_VL_3B_CONFIG, QWEN25_VL_3B_PIXELS, write_tiny_vlm_folder

# Qwen2-VL-2B-Instruct's preprocessor_config.json numbers: 3,584-pixel square at max_pixels = 16,384 tokens.
REAL_2B_PIXELS = {"min_pixels": 3136, "max_pixels": 12845056}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm_size")
    qwen = write_tiny_vlm_folder(root, "qwen2_vl")
    real = root / "qwen_2b_pixels"                     # the JSON files only: read_vision_facts reads no weights
    real.mkdir()
    shutil.copy(qwen / "config.json", real / "config.json")
    (real / "preprocessor_config.json").write_text(json.dumps({**PREPROCESSORS["qwen2_vl"], **REAL_2B_PIXELS}))
    real_3b = root / "qwen25_3b"                       # Qwen2.5-VL-3B's own config.json (flat, hub form)
    real_3b.mkdir()
    (real_3b / "config.json").write_text(json.dumps(QWEN25_VL_3B_CONFIG))
    (real_3b / "preprocessor_config.json").write_text(json.dumps({**PREPROCESSORS["qwen2_vl"], **QWEN25_VL_3B_PIXELS}))
    return {"qwen2_vl": qwen, "real_2b": real, "idefics3": write_tiny_vlm_folder(root, "idefics3"), "real_3b": real_3b}


@pytest.mark.parametrize("max_seq_len,size,tokens", [(512, 448, 256), (2048, 896, 1024), (4096, 1260, 2025)])
def test_qwen2_vl_default_leaves_half_the_context_for_text(folders, max_seq_len, size, tokens):
    _, facts = read_vision_facts(folders["real_2b"], max_seq_len=max_seq_len)
    assert (facts.image_size, facts.tokens_per_image, facts.grid_thw) == (size, tokens, (1, size // 14, size // 14))


def test_qwen2_vl_without_a_context_takes_the_max_pixels_square(folders):
    _, facts = read_vision_facts(folders["real_2b"])
    assert (facts.image_size, facts.tokens_per_image) == (3584, 16384)


def test_qwen2_vl_smallest_image_too_large_for_the_context_is_refused(folders):
    with pytest.raises(InputError) as e:        # smallest: 56 x 56 (min_pixels 3136), 4 tokens > 6 / 2
        read_vision_facts(folders["real_2b"], max_seq_len=6)
    assert "56 x 56" in str(e.value) and "--max-seq-len 6" in str(e.value) and "at least 8" in e.value.fix


def test_qwen2_vl_image_size_accepted(folders):
    _, facts = read_vision_facts(folders["real_2b"], image_size=672, max_seq_len=512)   # asked: not capped by the context
    assert (facts.image_size, facts.tokens_per_image) == (672, 576)


@pytest.mark.parametrize("asked,hint", [(500, "476 or 504"), (28, "56"), (4000, "3584")])
def test_qwen2_vl_image_size_refused_names_the_nearest(folders, asked, hint):
    with pytest.raises(InputError) as e:
        read_vision_facts(folders["real_2b"], image_size=asked)
    assert f"--image-size {asked}" in str(e.value) and "multiple of 28" in str(e.value)
    assert e.value.fix.endswith(f"--image-size {hint}")


@pytest.mark.parametrize("max_seq_len,size,tokens", [(512, 448, 256), (2048, 896, 1024), (4096, 1232, 1936), (None, 3584, 16384)])
def test_qwen25_vl_takes_whole_windows(folders, max_seq_len, size, tokens):
    """Qwen2.5-VL-3B's config: the tower's windows are 112 pixels (4 x 4 image tokens), so its sizes are multiples
    of 112 (at 4096, 1232 where Qwen2-VL takes 1260); the flat hub config and its unnamed tower are read."""
    family, facts = read_vision_facts(folders["real_3b"], max_seq_len=max_seq_len)
    assert (family.model_type, facts.text_model_type, facts.image_wrap_ids) == ("qwen2_5_vl", "qwen2", (151652, 151653))
    assert (facts.image_size, facts.tokens_per_image, facts.grid_thw) == (size, tokens, (1, size // 14, size // 14))


@pytest.mark.parametrize("asked,hint", [(476, "448 or 560"), (56, "112"), (1260, "1232 or 1344")])
def test_qwen25_vl_image_size_not_whole_windows_is_refused(folders, asked, hint):
    assert read_vision_facts(folders["real_3b"], image_size=560)[1].tokens_per_image == 400
    with pytest.raises(InputError) as e:
        read_vision_facts(folders["real_3b"], image_size=asked)
    assert f"--image-size {asked}" in str(e.value) and "multiple of 112" in str(e.value)
    assert "window_size 112" in str(e.value) and e.value.fix.endswith(f"--image-size {hint}")


def test_max_pixels_below_one_window_is_refused(folders, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_VL_3B_CONFIG))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**PREPROCESSORS["qwen2_vl"], "max_pixels": 100 * 100}))
    with pytest.raises(InputError) as e:
        read_vision_facts(tmp_path, max_seq_len=512)
    assert "max_pixels 10000" in str(e.value) and "112 x 112" in str(e.value) and "at least 12544" in e.value.fix


def test_fixed_tower_takes_only_its_own_size(folders):
    _, facts = read_vision_facts(folders["idefics3"], max_seq_len=64)
    assert read_vision_facts(folders["idefics3"], image_size=facts.image_size)[1] == facts
    with pytest.raises(InputError) as e:
        read_vision_facts(folders["idefics3"], image_size=facts.image_size + 32)
    assert f"built for {facts.image_size} pixels" in str(e.value) and f"--image-size {facts.image_size}" in e.value.fix


def test_cli_refuses_an_image_size_before_loading(folders, tmp_path, cli):
    proc = cli("compile", str(folders["qwen2_vl"]), "-o", str(tmp_path / "out"), "--target", "SM8650",
               "--image-size", "60")
    assert_clean_error(proc, "--image-size 60", "multiple of 28", "--image-size 56")
    assert not (tmp_path / "out").exists()


def test_api_image_size_reaches_the_vlm_compile(folders, tmp_path):
    import modelexport
    with pytest.raises(InputError, match="--image-size 84"):      # tiny max_pixels 56 x 56: 84 is above it
        modelexport.compile(str(folders["qwen2_vl"]), output=tmp_path / "out", target="SM8650", image_size=84)
    assert not (tmp_path / "out").exists()


def test_image_size_on_a_text_model_is_refused(tmp_path):
    """--image-size on an LLM without a vision part: one message, before any weight is read."""
    import modelexport
    from modelexport.core.errors import InputError
    from modelexport.zoo.assets import asset_path
    with pytest.raises(InputError, match="--image-size is for vision-language models"):
        modelexport.compile(str(asset_path("smollm2_gguf")), output=tmp_path / "b", target="SM8650", image_size=448)
    assert not (tmp_path / "b").exists()


def test_inspect_shows_a_vlm_folder_and_its_image_size_per_context(folders):
    """`inspect VLM_FOLDER` (it said 'not supported' before: it looked only at the decoder table)."""
    from modelexport.frontends.hf_inspect import inspect_hf_folder
    qwen = inspect_hf_folder(folders["real_2b"])
    assert qwen["supported"] and qwen["family"]["model_type"] == "qwen2" and qwen["n_layers"] == 2
    v = qwen["vlm"]
    assert (v["family"], v["position_rule"], v["max_image_size"]) == ("qwen2_vl", "mrope_grid", 3584)
    assert v["by_max_seq_len"] == {"512": {"image_size": 448, "tokens_per_image": 256},
                                   "2048": {"image_size": 896, "tokens_per_image": 1024},
                                   "4096": {"image_size": 1260, "tokens_per_image": 2025}}
    fixed = inspect_hf_folder(folders["idefics3"])["vlm"]
    assert "by_max_seq_len" not in fixed and fixed["image_size"] == 32 and fixed["family"] == "idefics3"
    bad = folders["real_2b"].parent / "bad_tower"
    bad.mkdir(exist_ok=True)
    cfg = json.loads((folders["real_2b"] / "config.json").read_text())
    cfg["vision_config"]["model_type"] = "siglip_vision_model"
    (bad / "config.json").write_text(json.dumps(cfg))
    refused = inspect_hf_folder(bad)
    assert not refused["supported"] and "siglip_vision_model" in refused["problem"]
