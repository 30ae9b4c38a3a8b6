"""A new user's mistakes with the LLM / VLM commands (compile, generate, eval on GGUF, HF and VLM
folders): each case exits non-zero with one message naming what is wrong, no traceback, and the
checks run before any weights are loaded or anything written. The tiny models are built once for
the file; nothing here compiles a graph (tests/test_bad_inputs.py holds the bundle cases)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import invoke

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INPUT = 2


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, str]:
    from llm_tiny import write_tiny_llm_folder
    from test_llm_frontends import write_tiny_gguf
    from vlm_tiny import write_tiny_vlm_folder
    root = tmp_path_factory.mktemp("llm_bad")
    write_tiny_llm_folder(root / "llm")
    write_tiny_vlm_folder(root / "vlm")
    gguf = write_tiny_gguf(root / "tiny.gguf")
    write_tiny_gguf(root / "gpt2.gguf", arch="gpt2")           # an architecture the family table lacks
    write_tiny_gguf(root / "qwen2.gguf", arch="qwen2")         # Llama tensors labelled qwen2: no q/k/v biases
    data = gguf.read_bytes()
    (root / "truncated.gguf").write_bytes(data[: len(data) // 2])    # a download cut mid-tensor
    notok = root / "notok"
    notok.mkdir()
    for f in (root / "llm" / "tiny_hf").iterdir():
        if not f.name.startswith("tokenizer"):
            (notok / f.name).write_bytes(f.read_bytes())
    (root / "exists").mkdir()
    (root / "exists" / "keep.txt").write_text("mine")
    (root / "empty.txt").write_text("")
    return {"hf": str(root / "llm" / "tiny_hf"), "calib": str(root / "llm" / "calib.txt"), "vlm": str(root / "vlm" / "tiny_vlm"),
            "gguf": str(gguf), "truncated": str(root / "truncated.gguf"), "notok": str(notok),
            "exists": str(root / "exists"), "empty": str(root / "empty.txt"), "out": str(root / "out"), "d": str(root)}


_H = "compile {hf} -o {out} --variants ar1 --max-seq-len 64"
_DRY = "compile {hf} --dry-run --max-seq-len 64"
# (id, argv, words the message must hold, words it must not)
CASES = [
    # --variants and --max-seq-len
    ("variants-ar0", _DRY + " --variants ar0", ["'ar0' is not arN"], []),
    ("variants-junk", _DRY + " --variants foo", ["'foo' is not arN", "fix:"], []),
    ("variants-empty", _DRY + " --variants ,", ["--variants is empty"], []),
    ("variants-huge", _DRY + " --variants ar99999", ["largest variant (ar99999)", "fix:", "--max-seq-len above 99999"], []),
    ("variants-equal-context", _DRY + " --variants ar64", ["largest variant (ar64)", "fix:"], []),
    ("max-seq-len-0", "compile {hf} --dry-run --max-seq-len 0", ["--max-seq-len must be at least 2, got 0"], ["is beyond the model"]),
    ("max-seq-len-negative", "compile {hf} -o {out} --max-seq-len -5", ["--max-seq-len must be at least 2, got -5"], []),
    ("max-seq-len-beyond-model", "compile {hf} --dry-run --max-seq-len 100000", ["beyond the model's context (256", "256 or less"], []),
    ("max-seq-len-beyond-model-pte", "compile {hf} --format pte -o {out} --max-seq-len 100000", ["beyond the model's context (256"], []),
    ("max-seq-len-beyond-model-generate", "generate {hf} -p hi --max-seq-len 100000", ["beyond the model's context (256"], []),
    ("max-seq-len-beyond-model-eval", "eval {hf} --max-seq-len 100000", ["beyond the model's context (256", "256 or less"], []),
    ("max-seq-len-beyond-model-eval-cpu", "eval {gguf} --stages cpu --max-seq-len 100000", ["beyond the model's context"], []),
    # flags that belong to another mode or model
    ("inputs-foo", _DRY + " --inputs foo", ["--inputs 'foo' is not an input mode", "tokens, embeddings, both"], []),
    ("embedder-precision-without-embeddings", _H + " --embedder-precision fp16", ["--inputs embeddings"], []),
    ("embedder-precision-dry-run", _DRY + " --embedder-precision fp16", ["--inputs embeddings"], []),
    ("embedder-precision-junk", _DRY + " --inputs embeddings --embedder-precision 3bit", ["'3bit' is not offered", "fp16, 8bit"], []),
    ("image-size-on-text-llm", _H + " --image-size 64", ["--image-size is for vision-language models"], []),
    ("image-size-on-text-llm-dry-run", _DRY + " --image-size 64", ["--image-size is for vision-language models"], []),
    ("vision-precision-on-text-llm-dry-run", _DRY + " --vision-precision 8a8w", ["--vision-precision is for vision-language"], []),
    ("vlm-inputs-tokens", "compile {vlm} -o {out} --variants ar1 --max-seq-len 64 --inputs tokens",
     ["--inputs tokens", "embeddings"], []),
    ("vlm-image-size-wrong", "compile {vlm} -o {out} --variants ar1 --max-seq-len 64 --image-size 33",
     ["--image-size 33", "--image-size 32"], []),
    ("vlm-dry-run", "compile {vlm} --dry-run --max-seq-len 64", ["--dry-run plans text LLMs", "vision-language"],
     ["not supported"]),
    # the other LLM knobs, refused by --dry-run as by compile
    ("precision-fp16", _DRY + " --precision fp16", ["fp16 is not offered for LLMs"], []),
    ("rounding-junk", _DRY + " --rounding up", ["--rounding 'up' is not known", "gptq"], []),
    ("calibration-missing", _DRY + " -c {d}/none.txt", ["none.txt does not exist"], []),
    ("calibration-samples-0", _H + " --calibration-samples 0", ["--calibration-samples must be at least 1"], []),
    ("context-limit-negative", _DRY + " --context-limit-mb -1", ["--context-limit-mb must be at least"], []),
    ("max-ppl-ratio-below-1", _H + " --max-ppl-ratio 0.5", ["--max-ppl-ratio", "above 1"], []),
    # sources and outputs
    ("gguf-truncated", "compile {truncated} -o {out} --variants ar1 --max-seq-len 64", ["truncated or corrupt"], []),
    ("gguf-unknown-architecture", "compile {d}/gpt2.gguf -o {out} --max-seq-len 64", ["architecture 'gpt2' is not supported", "llama"], []),
    ("gguf-unknown-architecture-generate", "generate {d}/gpt2.gguf -p hi", ["architecture 'gpt2' is not supported"], []),
    ("gguf-tensors-unlike-architecture", "compile {d}/qwen2.gguf -o {out} --variants ar1 --max-seq-len 64",
     ["lack attn_q.bias, attn_k.bias, attn_v.bias", "qwen2"], []),
    ("gguf-tensors-unlike-architecture-generate", "generate {d}/qwen2.gguf -p hi --no-cache", ["lack attn_q.bias"], []),
    ("hf-no-tokenizer", "compile {notok} -o {out} --variants ar1 --max-seq-len 64", ["has no tokenizer", "save_pretrained"], []),
    ("output-exists", _H.replace("{out}", "{exists}"), ["already exists", "--force"], []),
    ("output-is-a-file", _H.replace("{out}", "{gguf}"), ["already exists"], []),
    ("output-unwritable", _H.replace("{out}", "/proc/self/modelexport-out"), ["cannot write"], []),
    # generate / eval on the sources
    ("generate-empty-prompt", ("generate", "{hf}", "-p", ""), ["the prompt is empty"], []),
    ("generate-max-new-tokens-0", "generate {hf} -p hi -n 0", ["--max-new-tokens must be at least 1"], []),
    ("generate-backend-unknown", "generate {hf} -p hi --backend tpu", ["unknown LLM backend 'tpu'", "cpu"], []),
    ("generate-not-a-model-folder", "generate {d} -p hi", ["neither a bundle", "Hugging Face"], []),
    ("generate-image-on-gguf", "generate {gguf} -p hi --image {empty}", ["--image"], []),
    # a prompt longer than the context of a small model (below 2048), --max-seq-len never given:
    # the message is about the prompt, not a default the user did not choose
    ("generate-prompt-beyond-context", ("generate", "{gguf}", "-n", "2", "--raw", "-p", "word " * 400), ["the model's context holds", "shorten the prompt"],
     ["--max-seq-len 2048"]),
    ("eval-stages-junk", "eval {hf} --stages warp", ["unknown stage(s) warp", "float, fake-quant"], []),
    ("eval-text-missing", "eval {hf} --perplexity {d}/none.txt", ["none.txt does not exist"], []),
    ("eval-text-empty", "eval {hf} --perplexity {empty}", ["too short"], []),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_llm_bad_input(case, world, capfd):
    cid, argv, needles, absent = case
    world = {**world, "out": str(Path(world["d"]) / "out" / cid)}    # its own: one case's leftovers cannot fail another
    args = [a.format(**world) for a in (argv.split() if isinstance(argv, str) else argv)]
    capfd.readouterr()
    rc, crash = invoke(args)
    out = "".join(capfd.readouterr())
    assert rc != "crash", crash
    assert rc == INPUT, (rc, out)
    assert "Traceback" not in out, out
    flat = " ".join(out.split())
    for word in needles:
        assert word in flat, (word, out)
    for word in absent:
        assert word not in flat, (word, out)
    assert not Path(world["out"]).exists(), "nothing may be written for a refused input"
    assert (Path(world["exists"]) / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("flag, other", [("--format pte", "--executorch-program"), ("--executorch-program", "--format pte")])
def test_the_runners_program_refuses_embeddings_naming_the_flag_given(world, capfd, flag, other):
    """qnn_llama_runner feeds token ids: --inputs embeddings is refused (exit 6, nothing written) by
    either spelling of the ExecuTorch program, the message naming the one given."""
    out = Path(world["d"]) / "out" / f"embeddings{flag.replace(' ', '_')}"
    capfd.readouterr()
    rc, crash = invoke(["compile", world["hf"], *flag.split(), "-o", str(out), "--inputs", "embeddings"])
    text = " ".join("".join(capfd.readouterr()).split())
    assert rc == 6, (rc, crash, text)
    assert f"{flag}: qnn_llama_runner feeds token ids, not --inputs embeddings" in text and f"leave {flag} out" in text
    assert other not in text and not out.exists()


# ---- --image files: what the vision part is fed (llm/run/vision_inputs.open_rgb, the one reader) ----------

def _image(tmp_path: Path, kind: str) -> Path:
    import numpy as np
    from PIL import Image
    ramp = np.arange(40 * 40).reshape(40, 40)
    made = {"not-an-image": lambda p: p.write_text("hello"),
            "float-pixels": lambda p: Image.fromarray(np.ones((8, 8), np.float32)).save(p)}
    path = tmp_path / {"not-an-image": "x.png", "float-pixels": "x.tif"}.get(kind, "x.png")
    if kind in made:
        made[kind](path)
    elif kind == "16-bit":
        Image.fromarray((ramp * 40).astype(np.uint16)).save(path)      # 0 .. 63960
    elif kind == "grayscale":
        Image.fromarray((ramp % 256).astype(np.uint8), "L").save(path)
    return path


@pytest.mark.parametrize("kind,needle", [("not-an-image", "is not an image PIL can read"),
                                         ("float-pixels", "floating-point pixels")])
def test_image_refused(tmp_path, kind, needle):
    from modelexport.core.errors import InputError
    from modelexport.llm.run.vision_inputs import open_rgb
    with pytest.raises(InputError, match=needle) as e:
        open_rgb(_image(tmp_path, kind))
    assert "--image" in e.value.fix


def test_16bit_image_keeps_its_brightness(tmp_path):
    """A 16-bit PNG is scaled to 8 bits, not clipped at 255 (PIL's own convert makes it nearly white)."""
    import numpy as np
    from PIL import Image
    from modelexport.llm.run.vision_inputs import open_rgb
    path = _image(tmp_path, "16-bit")
    rgb, notes = open_rgb(path)
    want = np.asarray(Image.open(path), dtype=np.float64) / 257
    got = np.asarray(rgb, dtype=np.float64)
    assert rgb.mode == "RGB" and any("16-bit" in n for n in notes)
    assert np.abs(got[..., 0] - want).max() <= 0.5 and abs(got.mean() - want.mean()) < 0.5


def test_grayscale_image_converted_with_a_note(tmp_path):
    import numpy as np
    from modelexport.llm.run.vision_inputs import open_rgb
    rgb, notes = open_rgb(_image(tmp_path, "grayscale"))
    x = np.asarray(rgb)
    assert rgb.mode == "RGB" and notes == ["image mode L converted to RGB"]
    assert (x[..., 0] == x[..., 1]).all() and x.max() == 255
