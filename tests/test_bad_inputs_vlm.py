"""A new user's mistakes with vision-language compiles (found by a sweep of compile / generate on tiny
models): each gets one message with a fix and a non-zero exit before any heavy work, no traceback, and
nothing is written. The text LLM commands' cases are in test_bad_inputs_llm.py."""
from __future__ import annotations

import pytest

from conftest import assert_clean_error

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from llm_tiny import write_tiny_llm_folder
    from vlm_tiny import write_tiny_vlm_folder
    root = tmp_path_factory.mktemp("bad_llm")
    write_tiny_llm_folder(root)
    return root, write_tiny_vlm_folder(root / "vlm")


@pytest.mark.parametrize("value", ["0", "1", "-5"])
def test_a_context_of_zero_is_refused_not_taken_for_the_default(folders, cli_here, value):
    root, vlm = folders
    out = root / f"ctx_{value}"
    assert_clean_error(cli_here("compile", str(vlm), "--max-seq-len", value, "-o", str(out)),
                       f"--max-seq-len must be at least 2, got {value}")
    assert not out.exists()


def test_an_encoder_beside_a_vlm_folder_is_refused_by_name(folders, cli_here):
    root, vlm = folders
    proc = cli_here("compile", str(vlm), "--vision-encoder", str(root / "nothing.onnx"), "--image-token", "x",
                    "-o", str(root / "out_vlm_enc"))
    assert_clean_error(proc, "is a vision-language folder", "leave --vision-encoder out")


@pytest.mark.parametrize("flags", [["--image-size", "32"], ["--vision-precision", "fp16"]])
def test_the_pte_format_refuses_a_vision_part(folders, cli_here, flags):
    """qnn_llama_runner's program is for text LLMs: the refusal names the flag given (--format pte)."""
    root, vlm = folders
    assert_clean_error(cli_here("compile", str(vlm), "--format", "pte", "-o", str(root / "out_pte_vlm")),
                       "--format pte builds text LLMs for qnn_llama_runner", "vision-language model",
                       "leave --format pte out")
    assert not (root / "out_pte_vlm").exists()
    assert_clean_error(cli_here("compile", str(root / "tiny_hf"), "--format", "pte", *flags, "-o", str(root / "out_pte")),
                       f"{flags[0]} is for vision-language models", f"leave {flags[0]} out")
    assert not (root / "out_pte").exists()


def test_image_on_a_text_model_points_to_both_ways_of_getting_a_vision_part(folders, cli_here):
    from modelexport.zoo.assets import sample_images
    root, _ = folders
    proc = cli_here("generate", str(root / "tiny_hf"), "--image", str(sample_images()["coffee"]), "-p", "hi")
    assert_clean_error(proc, "not a bundle", "--vision-encoder")
