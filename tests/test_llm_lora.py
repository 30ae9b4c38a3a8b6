"""LoRA adapters (PEFT folders) on a tiny random Llama: `compile --lora` builds the base once with each
adapted linear's A and B as graph inputs; an adapter is applied at run time on the HTP simulator. Its
logits match PEFT's own model on the float weights within the precision's distance, a second adapter
needs no recompile, and the base is unchanged with none; adapters for another base are refused before
compiling, naming the module."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_clean_error  # noqa: E402
from llm_tiny import CALIBRATION_TEXT, tiny_tokenizer, write_tiny_llm_folder  # noqa: E402
from modelexport.core.errors import InputError, UnsupportedError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _refused(fn, cls=InputError):
    """The call raises our error of `cls` (a message and a fix, no traceback for the CLI to print)."""
    with pytest.raises(cls) as e:
        fn()
    assert e.value.fix
    return e.value

SEQ = 64
PROMPT = "Markets rose on Tuesday as investors weighed"


def _adapter(base_dir: Path, out: Path, r: int, targets: list[str], seed: int, std: float = 0.2) -> Path:
    """A PEFT LoRA adapter of the tiny base with random (non-zero) B, written by peft itself."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, lora_dropout=0.0))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, std)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm_lora")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        # untied: its greedy text varies, so Genie's tokens against ours say something
        write_tiny_llm_folder(root, seed=1, tie_word_embeddings=False)
        _adapter(root / "tiny_hf", root / "style", 4, ["q_proj", "v_proj", "down_proj"], 1)
        _adapter(root / "tiny_hf", root / "terse", 2, ["q_proj", "o_proj"], 2)
        # not compiled in: the same modules as `style`, a smaller rank
        _adapter(root / "tiny_hf", root / "later", 3, ["q_proj", "down_proj"], 3)
        yield root


@pytest.fixture(scope="module")
def bundle(work):
    import modelexport
    # --no-cache: the quantizing workers' entries are read by the parent after the workers end
    return modelexport.compile(str(work / "tiny_hf"), output=work / "bundle", target="SM8650", precision="16a8w",
                               variants="ar1,ar4", max_seq_len=SEQ, calibration=str(work / "calib.txt"),
                               calibration_samples=4, lora=[str(work / "style"), str(work / "terse")], use_cache=False)


@pytest.fixture(scope="module")
def split_bundle(work):
    """The same base split into two parts (one layer each): each part's graphs take their own layers' LoRA inputs."""
    import modelexport
    return modelexport.compile(str(work / "tiny_hf"), output=work / "split", target="SM8650", precision="16a8w",
                               variants="ar1,ar4", max_seq_len=SEQ, calibration=str(work / "calib.txt"),
                               calibration_samples=4, lora=[str(work / "style")], context_limit_mb=0.15)


def _float_logits(work: Path, adapter: str | None, scale: float = 1.0, folder: str = "tiny_hf") -> np.ndarray:
    """PEFT's model on the float weights (the adapter scaled by `scale`), logits of the prompt's tokens."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(work / folder).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, work / adapter).eval()
        if scale != 1.0:
            for m in model.modules():
                if hasattr(m, "scaling") and isinstance(m.scaling, dict):
                    m.scaling = {k: v * scale for k, v in m.scaling.items()}
    ids = tiny_tokenizer().encode(PROMPT)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _sim_logits(bundle, adapter: str | None, scale: float = 1.0) -> np.ndarray:
    from modelexport.backends.llm_qnn.session import apply_lora, open_forwards
    from modelexport.llm.run.static_runner import StaticRunner
    graphs, spec, seq = open_forwards(bundle, "htp-sim")
    apply_lora(bundle, graphs, adapter, scale)
    return StaticRunner(graphs, spec, seq).feed(tiny_tokenizer().encode(PROMPT)).numpy()


def test_bundle_records_the_lora_inputs_and_carries_the_adapters(bundle):
    lora = bundle.manifest.llm.lora
    assert lora.rank == 4 and lora.layers == [0, 1] and lora.inputs == 2 * 2 * 4    # q, v, o, down in 2 layers
    assert lora.modules == ["mlp.down_proj", "self_attn.o_proj", "self_attn.q_proj", "self_attn.v_proj"]
    assert [(a.name, a.rank) for a in lora.adapters] == [("style", 4), ("terse", 2)]
    for a in lora.adapters:
        assert json.loads(bundle.file(f"{a.folder}/adapter_config.json").read_text())["r"] == a.rank
    # the branch stays float in the QDQ graphs: no Q/DQ on any LoRA input
    import onnx
    g = next(g for g in bundle.manifest.graphs if g.n_tokens == 1)
    model = onnx.load(str(bundle.file(g.quantized_model)), load_external_data=False)
    names = [i.name for i in model.graph.input if i.name.startswith("lora_")]
    assert len(names) == 16
    assert not [n.name for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in names]


def test_adapters_match_peft_on_the_simulator_and_switch_without_recompiling(bundle, work):
    from modelexport.core.numerics import sqnr_db
    base = _float_logits(work, None)
    got = {}
    for adapter in (None, "style", "terse", str(work / "later"), None):     # one bundle, no recompile
        ref = _float_logits(work, Path(adapter).name if adapter else None)
        sim = _sim_logits(bundle, adapter)
        got[adapter] = sim
        assert sqnr_db(ref, sim) > 18, adapter                               # 16a8w's mark
        if adapter:   # the adapter moved the logits well beyond the quantization's error
            assert sqnr_db(ref, base) < sqnr_db(ref, sim) - 6, adapter
    np.testing.assert_array_equal(got[None], _sim_logits(bundle, "style", scale=0.0))   # strength 0: the base


def test_a_split_decoder_takes_each_parts_lora_inputs(split_bundle, work):
    from modelexport.core.numerics import sqnr_db
    assert split_bundle.manifest.llm.n_parts == 2
    firsts = {g.part_index: g for g in split_bundle.manifest.graphs if g.n_tokens == 1}
    import onnx
    for index, layer in ((1, 0), (2, 1)):
        names = [i.name for i in onnx.load(str(split_bundle.file(firsts[index].quantized_model)),
                                           load_external_data=False).graph.input if i.name.startswith("lora_")]
        assert names and all(n.split("_")[2] == str(layer) for n in names), names
    assert sqnr_db(_float_logits(work, "style"), _sim_logits(split_bundle, "style")) > 18


def test_genie_applies_the_adapters_and_gives_our_loops_tokens(bundle, work):
    """Genie's own dialog (libGenie, file-based LoRA) on the host twins: the tokens of our loop, with
    each adapter, with one given at run time, and with none."""
    import modelexport.llm as llm
    lora = bundle.manifest.llm.lora
    assert lora.genie_base == "lora/base/genie" and all(a.genie_folder for a in lora.adapters)
    check = bundle.manifest.llm.genie["SM8650"]
    assert check.dialog_created and "adapter 'style' applied" in check.dialog_checked_on
    cfg = json.loads(bundle.file("genie_config.json").read_text())["dialog"]["engine"]["model"]["binary"]["lora"]
    assert [a["name"] for a in cfg["adapters"]] == ["style", "terse", "base"] and cfg["lora-version"] == 1
    tokens = {}
    for adapter in (None, "style", "terse", str(work / "later")):
        got = {}
        for backend in ("htp-sim", "genie"):
            model = llm.load(bundle.path, backend=backend, lora=adapter)
            got[backend] = model.generate("The quick brown fox", max_new_tokens=12).token_ids
        assert got["genie"] == got["htp-sim"], (adapter, got)
        tokens[adapter] = got["genie"]
    assert len({tuple(t) for t in tokens.values()}) >= 3     # the adapters change what is generated


def test_cos_sin_graphs_take_adapters_on_our_loop_and_genie(work):
    """--positions cos-sin with --lora: RoPE's rows and the adapters' A and B are both graph inputs. The
    simulator against PEFT's own model, and Genie (computing the rows itself) gives our loop's tokens."""
    import modelexport
    import modelexport.llm as llm
    from modelexport.core.numerics import sqnr_db
    b = modelexport.compile(str(work / "tiny_hf"), output=work / "cos_sin", target="SM8650", precision="16a8w",
                            variants="ar1,ar4", max_seq_len=SEQ, calibration=str(work / "calib.txt"),
                            calibration_samples=4, lora=[str(work / "style")], positions="cos-sin")
    assert b.manifest.llm.positions == "cos-sin" and b.manifest.llm.genie["SM8650"].dialog_created
    assert sqnr_db(_float_logits(work, "style"), _sim_logits(b, "style")) > 18
    for adapter in (None, "style"):
        got = {backend: llm.load(b.path, backend=backend, lora=adapter).generate(
            "The quick brown fox", max_new_tokens=8).token_ids for backend in ("htp-sim", "genie")}
        assert got["genie"] == got["htp-sim"], (adapter, got)


def test_lora_scale_follows_peft_scaling(bundle, work):
    from modelexport.core.numerics import sqnr_db
    half = _sim_logits(bundle, "style", 0.5)
    assert sqnr_db(_float_logits(work, "style", 0.5), half) > 18


def test_generate_cli_applies_an_adapter(bundle, cli_here):
    out = {}
    for args in ([], ["--lora", "style"]):
        r = cli_here("generate", str(bundle.path), "--backend", "htp-sim", "--prompt", PROMPT, "--raw", "-n", "4",
                     "--json", *args)
        assert r.returncode == 0, r.stderr
        out[tuple(args)] = json.loads(r.stdout)
    assert all(len(v["token_ids"]) == 4 for v in out.values())
    assert_clean_error(cli_here("generate", str(bundle.path), "--backend", "htp-sim", "--prompt", PROMPT,
                                "--lora", "nope"), "no adapter of that name", "style")


def test_bad_adapters_are_refused_before_compiling(work, tmp_path):
    import modelexport
    from safetensors.torch import load_file, save_file
    other = tmp_path / "other_base"
    other.mkdir()
    (other / "adapter_config.json").write_text((work / "style" / "adapter_config.json").read_text())
    w = load_file(str(work / "style" / "adapter_model.safetensors"))
    w = {k: (torch.zeros(v.shape[0], 48) if "mlp.down_proj.lora_A" in k else v) for k, v in w.items()}
    save_file(w, str(other / "adapter_model.safetensors"))
    kw = dict(output=tmp_path / "b", target="SM8650", precision="16a8w", variants="ar1,ar4", max_seq_len=SEQ,
              calibration=str(work / "calib.txt"))
    e = _refused(lambda: modelexport.compile(str(work / "tiny_hf"), lora=[str(other)], **kw), InputError)
    assert "another base" in str(e) and "model.layers.0.mlp.down_proj" in str(e)
    assert not (tmp_path / "b").exists()
    e = _refused(lambda: modelexport.compile(str(work / "tiny_hf"), lora=[str(tmp_path)], **kw), InputError)
    assert "adapter_config.json" in str(e)
    dora = tmp_path / "dora"
    dora.mkdir()
    cfg = json.loads((work / "style" / "adapter_config.json").read_text()) | {"use_dora": True}
    (dora / "adapter_config.json").write_text(json.dumps(cfg))
    (dora / "adapter_model.safetensors").write_bytes((work / "style" / "adapter_model.safetensors").read_bytes())
    e = _refused(lambda: modelexport.compile(str(work / "tiny_hf"), lora=[str(dora)], **kw), UnsupportedError)
    assert "DoRA" in str(e)
    e = _refused(lambda: modelexport.compile(str(work / "tiny_hf"), lora=[str(work / "style")], executorch_program=True,
                                             **kw), UnsupportedError)
    assert "qnn_llama_runner" in str(e)


def test_run_time_adapters_that_do_not_fit_are_refused(bundle, work, tmp_path):
    from modelexport.backends.llm_qnn.session import apply_lora, open_forwards
    graphs, _, _ = open_forwards(bundle, "htp-sim")
    big = _adapter(work / "tiny_hf", tmp_path / "big", 8, ["q_proj"], 4)
    e = _refused(lambda: apply_lora(bundle, graphs, str(big)), InputError)
    assert "rank 8" in str(e) and "rank 4" in str(e) and "--lora" in e.fix
    mlp = _adapter(work / "tiny_hf", tmp_path / "gate", 2, ["gate_proj"], 5)
    e = _refused(lambda: apply_lora(bundle, graphs, str(mlp)), InputError)
    assert "mlp.gate_proj" in str(e) and "no LoRA input" in str(e)
    e = _refused(lambda: apply_lora(bundle, graphs, "nope"), InputError)
    assert "style" in e.fix and "terse" in e.fix
    import modelexport.llm as llm
    e = _refused(lambda: llm.load(bundle.path, backend="cpu", lora="style"), InputError)
    assert "htp-sim" in e.fix


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text"])
def test_other_families_take_adapters(model_type, tmp_path):
    """Qwen3 (q/k norms after the projections) and Gemma 3 (sandwich norms, sliding-window layers, the
    residual stream scaled): an adapter on the simulator against PEFT's own model."""
    import modelexport
    from llm_tiny_families import save_tiny_family_folder
    from modelexport.core.numerics import sqnr_db
    save_tiny_family_folder(model_type, tmp_path / "hf", seed=1)
    (tmp_path / "calib.txt").write_text(CALIBRATION_TEXT)
    _adapter(tmp_path / "hf", tmp_path / "ad", 4, ["q_proj", "v_proj", "down_proj"], 1)
    b = modelexport.compile(str(tmp_path / "hf"), output=tmp_path / "b", target="SM8650", precision="16a8w",
                            variants="ar1,ar4", max_seq_len=SEQ, calibration=str(tmp_path / "calib.txt"),
                            calibration_samples=4, lora=[str(tmp_path / "ad")])
    ref, base = _float_logits(tmp_path, "ad", folder="hf"), _float_logits(tmp_path, None, folder="hf")
    sim = _sim_logits(b, "ad")
    assert sqnr_db(ref, sim) > 18 and sqnr_db(ref, base) < sqnr_db(ref, sim) - 6


def test_a_family_with_fused_projections_is_refused_before_compiling(work, tmp_path):
    import modelexport
    from llm_tiny_families import save_tiny_family_folder
    save_tiny_family_folder("phi3", tmp_path / "phi3")
    e = _refused(lambda: modelexport.compile(str(tmp_path / "phi3"), output=tmp_path / "b", precision="16a8w",
                                             variants="ar1,ar4", max_seq_len=SEQ, calibration=str(work / "calib.txt"),
                                             lora=[str(work / "style")]), UnsupportedError)
    assert "fuses its projections" in str(e) and "merge_and_unload" in e.fix and not (tmp_path / "b").exists()
