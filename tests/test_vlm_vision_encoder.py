"""A vision-language bundle from the user's own vision-encoder ONNX and a text LLM (`compile TEXT_LLM
--vision-encoder enc.onnx --image-token TOKEN`), with real weights on both sides: the real ImageNet
MobileNetV2 trunk (its 7 x 7 x 1280 features as 49 rows) and a linear projector (random, seeded: no
trained projector is offline) to the hidden size of the real SmolLM2-135M, cut to its first 2 layers.

Measured when written (SM8650, decoder 16a8w, vision part fp16): vision part on the simulator vs float
42.9 dB; first-step logits with a real photo vs the float pipeline (ONNX Runtime's float encoder →
transformers with inputs_embeds) 46.4 / 45.9 dB; the change the photo makes to them (coffee - cat)
reproduced at 14.5 dB. At the 16a8w vision default the MobileNetV2 trunk is 20 dB from float (its 8-bit
weights; 16a16w 65 dB in the QDQ graph but 25 dB on the simulator), and with 4-bit decoder weights the
photo's effect drowns in the decoder's own error (1 dB): hence the precisions here."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from conftest import assert_clean_error

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

IMAGE_TOKEN = "<file_sep>"   # a SmolLM2 special token prompts never hold (id 5)
HIDDEN = 576


def export_encoder(module: nn.Module, path, size: int = 224, dynamic: bool = False, names=("image", "rows")):
    import warnings
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.zeros(1, 3, size, size),), str(path), input_names=[names[0]],
                          output_names=list(names[1:]), opset_version=17, dynamo=False,
                          dynamic_axes={names[0]: {2: "h", 3: "w"}} if dynamic else None)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, smollm2_gguf):
    import modelexport
    from llm_tiny import save_real_layers

    root = tmp_path_factory.mktemp("byo_encoder")
    folder = save_real_layers(smollm2_gguf, root / "smol2", 2)
    from modelexport.zoo.mobilenet_v2 import MobileNetRows
    enc = export_encoder(MobileNetRows(HIDDEN), root / "mobilenet_rows.onnx")
    with pytest.MonkeyPatch.context() as mp:   # module fixtures run before the per-test cache isolation
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        bundle = modelexport.compile(str(folder), output=root / "bundle", target="SM8650", precision="16a8w",
                                     variants="ar1,ar32", max_seq_len=128, vision_encoder=str(enc),
                                     image_token=IMAGE_TOKEN, vision_precision="fp16")
    return folder, enc, bundle


def test_the_real_encoder_is_the_vision_part_every_node_on_the_htp(built):
    _, enc, bundle = built
    v = bundle.manifest.llm.vision
    assert (v.family, v.tokens_per_image, v.image_size, v.image_token_id) == ("onnx_encoder", 49, 224, 5)
    assert v.encoder.path == str(enc.resolve()) and len(v.encoder.sha256) == 64
    assert v.mean == pytest.approx([0.485, 0.456, 0.406]) and v.precision == "fp16"
    p = bundle.manifest.placement["vision"]["SM8650"]
    assert p["cpu_nodes"] == [] and p["htp_nodes"] >= 52, p        # MobileNetV2's 52 convolutions at least
    assert v.check["SM8650"].sqnr_db > 38, v.check                 # 42.9 dB when written


def _float_first_logits(folder, enc, image, prompt_ids: list[int]) -> np.ndarray:
    """The float pipeline: the user's encoder on ONNX Runtime's CPU EP, its rows at the image tokens of the
    real (cut) SmolLM2 in transformers → the logits after the prompt."""
    import onnxruntime as ort
    import transformers

    from modelexport.llm.run.vision_inputs import load_pixels
    x, _ = load_pixels(image, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 1 / 255)
    rows = ort.InferenceSession(str(enc), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0][0]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        embeds = model.model.embed_tokens(torch.tensor([prompt_ids])).clone()
        where = [i for i, t in enumerate(prompt_ids) if t == 5]
        assert len(where) == 49
        embeds[0, where] = torch.from_numpy(rows)
        return model(inputs_embeds=embeds).logits[0, -1].numpy()


def test_simulator_logits_follow_the_float_pipeline_and_the_photo(built):
    from modelexport.backends.llm_qnn.vision_session import generate_with_image
    from modelexport.core.numerics import compare
    from modelexport.zoo.assets import sample_images

    folder, enc, bundle = built
    got, ref = {}, {}
    for name in ("coffee", "chelsea"):
        photo = sample_images()[name]
        r = generate_with_image(bundle.path, photo, "What is in the image?", backend="htp-sim", max_new_tokens=1)
        got[name] = r["first_logits"].reshape(-1)
        ref[name] = _float_first_logits(folder, enc, photo, r["prompt_ids"])
        assert compare(ref[name], got[name])["sqnr_db"] > 40, name      # 46.4 / 45.9 dB when written
    effect = ref["coffee"] - ref["chelsea"]
    assert np.abs(effect).max() > 0.5                                  # the photo matters to the float model
    assert compare(effect, got["coffee"] - got["chelsea"])["sqnr_db"] > 10   # 14.5 dB when written


def test_generate_cli_reads_the_image(built, cli_here):
    from modelexport.zoo.assets import sample_images
    _, _, bundle = built
    proc = cli_here("generate", str(bundle.path), "--image", str(sample_images()["coffee"]), "-p", "Describe it.",
                    "--max-new-tokens", "2", "--backend", "cpu", check=True)
    assert "resized to 224x224" in proc.stderr + proc.stdout


def test_verify_compares_the_vision_part_with_its_float_graph(built, cli_here):
    import json

    from modelexport.zoo.assets import sample_images
    _, _, bundle = built
    proc = cli_here("verify", str(bundle.path), "--json", check=True)
    g, = json.loads(proc.stdout)["graphs"]
    assert (g["part"], g["target"], g["samples"], g["inputs"]) == ("vision", "SM8650", 4, "stored photos")
    assert g["outputs"][0]["sqnr_db"] > 38 and g["passed"]              # 43.5 dB when written
    proc = cli_here("verify", str(bundle.path), "-i", str(sample_images()["chelsea"]), "--json", check=True)
    assert json.loads(proc.stdout)["graphs"][0]["inputs"] == "given images"
    assert_clean_error(cli_here("verify", str(bundle.path), "--part", "prompt_ar32_cl128_1_of_1"),
                       "compares its vision part only", "--per-layer")


def test_inspect_reports_the_pipeline_and_genie_refuses_only_what_it_cannot_take(built, cli_here):
    """inspect read the pipeline file with Genie's dialog parser ("Missing dialog field"); Genie's pipeline
    refuses prompts above context - 32 + 1 = 97 tokens here (measured), now said before it runs."""
    from modelexport.zoo.assets import sample_images
    _, _, bundle = built
    photo = str(sample_images()["coffee"])
    proc = cli_here("inspect", str(bundle.path), check=True)
    assert "pipeline built by libGenie at compile time" in proc.stdout and "Missing dialog field" not in proc.stdout
    assert_clean_error(cli_here("generate", str(bundle.path), "--image", photo, "-p", "word " * 20, "--backend",
                                "genie"), "at most 97", "--backend htp-sim")
    assert_clean_error(cli_here("generate", str(bundle.path), "--image", photo, "-p", "word " * 200, "--backend", "cpu"),
                       "with the image's 49", "--max-seq-len")


@pytest.mark.heavy
def test_genie_is_asked_for_no_more_tokens_than_the_context_holds(built, cli_here):
    """Genie counts the context's end as an error ("Context Size was exceeded"): --max-new-tokens past it
    failed the whole run; the request is now capped at the room left (49 image tokens + 36 of text leave 43;
    ~90 s of Genie decoding on the simulator)."""
    from modelexport.zoo.assets import sample_images
    _, _, bundle = built
    cli_here("generate", str(bundle.path), "--image", str(sample_images()["coffee"]), "-p", "word " * 5,
             "--backend", "genie", "--max-new-tokens", "200", check=True)


# --- bad input: refused before any weight is read, one message each -------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama folder (hidden 64) and tiny encoders that break one rule each."""
    from llm_tiny import write_tiny_llm_folder

    root = write_tiny_llm_folder(tmp_path_factory.mktemp("byo_bad"))

    class Rows(nn.Module):   # [1, 3, S, S] → [1, (S/8)^2, width]
        def __init__(self, width: int, two: bool = False):
            super().__init__()
            self.conv, self.two = nn.Conv2d(3, width, 8, 8), two

        def forward(self, x):
            y = self.conv(x).flatten(2).transpose(1, 2)
            return (y, y + 1) if self.two else y

    encoders = {"good": export_encoder(Rows(64), root / "good.onnx", 32),
                "wide": export_encoder(Rows(96), root / "wide.onnx", 32),
                "dynamic": export_encoder(Rows(64), root / "dynamic.onnx", 32, dynamic=True),
                "two": export_encoder(Rows(64, two=True), root / "two.onnx", 32, names=("image", "a", "b"))}
    (root / "not.onnx").write_text("not a model")
    encoders["not"] = root / "not.onnx"
    return root, encoders


@pytest.mark.parametrize("case, extra, needles", [
    ("good", [], ["--image-token", "add --image-token"]),
    ("wide", ["--image-token", "</s>"], ["96", "hidden size 64", "projector"]),
    ("dynamic", ["--image-token", "</s>"], ["dynamic image size", "--image-size"]),
    ("two", ["--image-token", "</s>"], ["2 output(s)", "one output"]),
    ("not", ["--image-token", "</s>"], ["not an ONNX model"]),
    ("good", ["--image-token", "hello"], ["5 tokens", "special or reserved token"]),
    ("good", ["--image-token", "999"], ["beyond the tokenizer"]),
    ("good", ["--image-token", "</s>", "--image-mean", "0.5,0.5"], ["three numbers"]),
    ("good", ["--image-token", "</s>", "--image-size", "64"], ["fixed at 32x32"]),
])
def test_bad_encoder_inputs_get_one_clear_message(tiny, cli_here, case, extra, needles):
    root, encoders = tiny
    out = root / f"out_{case}"
    proc = cli_here("compile", str(root / "tiny_hf"), "--vision-encoder", str(encoders[case]), *extra, "--max-seq-len", "128", "-o", str(out))
    assert_clean_error(proc, *needles)
    assert not out.exists()


def test_image_flags_without_an_encoder_point_to_it(tiny, cli_here):
    root, _ = tiny
    proc = cli_here("compile", str(root / "tiny_hf"), "--image-token", "</s>", "--max-seq-len", "128",
                    "-o", str(root / "out_flags"))
    assert_clean_error(proc, "no vision part", "--vision-encoder")
