"""GGUFs with a scaled RoPE as llama.cpp's converter writes them (issue 17 item 5): a yarn Qwen2
(rope.scaling.type, factor, original context, yarn beta) and a longrope Phi-3 (no scaling type: the
rope_factors_long / rope_factors_short tensors, the original context, the rotated dims).

transformers' GGUF loader reads none of these keys (it would build plain RoPE, full rotary); the
loader sets them (llm_families.GGUF_ROPE_SCALINGS), so the config equals the HF config the file was
written from and the static decoder built from the GGUF computes that HF model's logits."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from gguf_from_hf import write_gguf_from_hf
from llm_tiny_families import tiny_family_model

from modelexport.core.errors import InputError
from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
from modelexport.llm.run.static_runner import StaticRunner

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MAX_SEQ = 32


def _qwen2_yarn():
    """Qwen2.5's yarn section (factor 4 over the original context), plus a yarn beta the converter
    carries when a config states it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 64, "beta_fast": 16.0})
    return Qwen2ForCausalLM, cfg


def _llama3():
    """Llama 3.x's llama3 section (low_freq_factor 1), scaled to a 16-wide head: two of its eight
    frequencies fall between the short and the long wavelengths, as three of Llama-3.2-1B's 32 do."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 8.0, "original_max_position_embeddings": 256})
    return LlamaForCausalLM, cfg


def _phi3_longrope():
    """Phi-4-mini's shape (partial rotary 0.75, longrope) with factors as a config.json writes them."""
    half_rot = int(16 * 0.75) // 2
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": 128,
            "short_factor": [round(1.0 + 0.1 * i, 2) for i in range(half_rot)],
            "long_factor": [round(2.0 + 0.5 * i, 2) for i in range(half_rot)]}
    model = tiny_family_model("phi3", vocab_size=512, tie_word_embeddings=False, pad_token_id=0)
    return model, rope


def _model(name: str):
    torch.manual_seed(0)
    if name in ("qwen2", "llama"):
        cls, cfg = {"qwen2": _qwen2_yarn, "llama": _llama3}[name]()
        model = cls(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.2)
        return model
    model, rope = _phi3_longrope()
    model.config.rope_parameters = rope          # the same weights, under the factors a config.json states
    fresh = type(model)(model.config).eval()
    fresh.load_state_dict(model.state_dict())
    return fresh


@pytest.fixture(scope="module")
def scaled_gguf(tmp_path_factory):
    written: dict = {}

    def get(arch: str):
        if arch not in written:
            model = _model(arch)
            written[arch] = model, write_gguf_from_hf(model, tmp_path_factory.mktemp("rope") / f"tiny-{arch}.gguf", arch)
        return written[arch]
    return get


@pytest.mark.parametrize("arch", ["qwen2", "phi3", "llama"])
def test_scaled_rope_gguf_gives_the_hf_models_static_logits(scaled_gguf, arch):
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    model, path = scaled_gguf(arch)
    llm = load_gguf_causal_lm(path)
    want_rope = model.config.rope_parameters
    assert llm.config.rope_parameters == want_rope, (llm.config.rope_parameters, want_rope)
    if arch == "phi3":
        assert llm.config.original_max_position_embeddings == 128
    seq = torch.randint(7, 290, (20,), generator=torch.Generator().manual_seed(7)).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([seq])).logits[0]
        assert (llm.model(torch.tensor([seq])).logits[0] - ref).abs().max().item() < 1e-5
    dec = build_static_decoder(llm.model, StaticDecoderConfig(4, MAX_SEQ))
    runner = StaticRunner.from_decoder(dec, n_tokens=(1,))
    got = torch.cat([runner.feed(seq[:13])] + [runner.decode_step(t)[None] for t in seq[13:]])
    assert (got - ref).abs().max().item() < 1e-4
    # the scaling moves the logits: the same weights with plain RoPE give others
    plain = type(model)(type(model.config)(**{**model.config.to_dict(),
                                             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": want_rope.get(
                                                                     "partial_rotary_factor", 1.0)}})).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (plain(torch.tensor([seq])).logits[0] - ref).abs().max().item() > 1e-3


@pytest.mark.parametrize("arch", ["qwen2", "phi3", "llama"])
def test_inspect_shows_the_scaling(scaled_gguf, arch):
    from modelexport.cli.commands import inspect as inspect_cmd
    from modelexport.inspection import inspect_path
    model, path = scaled_gguf(arch)
    d = inspect_path(path)
    assert d["supported"] and d["rope_scaling_problem"] is None
    assert d["rope_scaling_type"] == {"qwen2": "yarn", "phi3": "longrope", "llama": "llama3"}[arch]
    want = {k: v for k, v in model.config.rope_parameters.items() if k not in ("rope_theta", "partial_rotary_factor")}
    assert d["rope_scaling"] == want
    with inspect_cmd.console.capture() as cap:
        inspect_cmd.RENDERERS["gguf"](d)
    line = next(x for x in cap.get().splitlines() if "rope scaling" in x)
    assert {"qwen2": "yarn: rope_type yarn, factor 4.0, original_max_position_embeddings 64, beta_fast 16.0",
            "phi3": "longrope: rope_type longrope, original_max_position_embeddings 128, long_factor [6 values], "
                    "short_factor [6 values]",
            "llama": "llama3: rope_type llama3, factor 4.0, low_freq_factor 1.0, high_freq_factor 8.0, "
                     "original_max_position_embeddings 256"}[arch] in line


def _rewrite(src: Path, dst: Path, **header) -> Path:
    """`src` with some header keys changed (None: dropped) and the same tensors."""
    import gguf
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        short = name.removeprefix(f"{arch}.")
        if short in header:
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vtype)
    for short, value in header.items():
        if value is not None:
            w.add_key_value(f"{arch}.{short}", value,
                            gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.FLOAT32)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_scaling_the_table_lacks_is_refused_naming_it(scaled_gguf, tmp_path):
    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    from modelexport.inspection import inspect_path
    _, path = scaled_gguf("qwen2")
    bad = _rewrite(path, tmp_path / "ntk.gguf", **{"rope.scaling.type": "ntk-by-parts"})
    with pytest.raises(InputError) as e:
        load_gguf_causal_lm(bad)
    assert "rope.scaling.type='ntk-by-parts'" in e.value.problem and "none, linear, yarn, longrope" in e.value.problem
    d = inspect_path(bad)
    assert d["supported"] is False and "ntk-by-parts" in d["note"]
    # a yarn key transformers has no parameter for, away from its neutral value
    odd = _rewrite(path, tmp_path / "ext.gguf", **{"rope.scaling.yarn_ext_factor": 0.5})
    with pytest.raises(InputError) as e:
        load_gguf_causal_lm(odd)
    assert "qwen2.rope.scaling.yarn_ext_factor=0.5" in e.value.problem
    # a required key missing
    lacking = _rewrite(path, tmp_path / "noctx.gguf", **{"rope.scaling.original_context_length": None})
    with pytest.raises(InputError) as e:
        load_gguf_causal_lm(lacking)
    assert "qwen2.rope.scaling.original_context_length is missing" in e.value.problem
    assert inspect_path(lacking)["supported"] is False


def test_a_phi3_gguf_refuses_yarn_its_row_lacks():
    from modelexport.frontends.llm_families import family_of_gguf
    assert family_of_gguf("qwen3", "yarn", "q.gguf").model_type == "qwen3"
    assert family_of_gguf("phi3", "longrope", "p.gguf").model_type == "phi3"
    with pytest.raises(InputError) as e:
        family_of_gguf("phi3", "yarn", "p.gguf")
    assert "rope.scaling.type='yarn'" in e.value.problem and "the Phi-3 row has default, linear, longrope" in e.value.problem


def test_a_longrope_gguf_past_its_original_context_is_refused_before_weights(scaled_gguf, tmp_path, monkeypatch):
    """The static RoPE table holds the short factors: a --max-seq-len past the original context
    (128 here, 4096 for Phi-3.5) is refused from the header, for the NPU compile and the CPU export."""
    from modelexport.llm.export.source import check_source
    from modelexport.llm.cpu.export import _check_source_family
    monkeypatch.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    _, path = scaled_gguf("phi3")
    assert check_source(path, 128).architecture == "phi3"
    for check in (check_source, _check_source_family):
        with pytest.raises(InputError) as e:
            check(Path(path), 256)
        assert "original context (128)" in e.value.problem and "--max-seq-len 128" in e.value.fix


@pytest.mark.heavy
@pytest.mark.skipif(not os.environ.get("MODELEXPORT_HEAVY_TESTS"), reason="minutes-long: make test-heavy")
@pytest.mark.parametrize("arch", ["qwen2", "phi3"])
def test_scaled_rope_gguf_compiles_with_every_node_on_the_htp(cli_here, scaled_gguf, tmp_path, arch, monkeypatch):
    monkeypatch.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    _, path = scaled_gguf(arch)
    out = tmp_path / "out"
    proc = cli_here("compile", str(path), "--target", "SM8650", "--variants", "ar1", "--max-seq-len", str(MAX_SEQ),
                    "--precision", "16a8w", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["llm"]["architecture"] == arch
    for per_target in manifest["placement"].values():
        placed = per_target["SM8650"]
        assert placed["htp_nodes"] > 100
        outside = [n for n in placed["cpu_nodes"] if not n.endswith(("QuantizeLinear", "DequantizeLinear"))]
        assert outside == [], placed["cpu_nodes"]


@pytest.mark.heavy
@pytest.mark.skipif(not os.environ.get("MODELEXPORT_HEAVY_TESTS"), reason="heavy: a CPU program export each, 1-2 min")
@pytest.mark.parametrize("arch", ["qwen2", "phi3", "llama"])
def test_scaled_rope_gguf_cpu_program_equals_transformers(scaled_gguf, arch, tmp_path):
    from test_llm_gguf_gemma import _check_cpu_program
    _check_cpu_program(scaled_gguf(arch)[1], tmp_path)


def test_the_loader_takes_the_header_the_check_parsed(scaled_gguf, tmp_path, monkeypatch):
    """A compile checks the header, then loads: the vocabulary is parsed once, and a changed file is parsed again."""
    import shutil

    from modelexport.frontends import gguf_file
    _, path = scaled_gguf("llama")
    path = Path(shutil.copy(path, tmp_path / "copy.gguf"))
    parses = []
    real = gguf_file._parse_info
    monkeypatch.setattr(gguf_file, "_parse_info", lambda p: parses.append(p) or real(p))
    info = gguf_file.read_gguf_info(path)
    llm = gguf_file.load_gguf_causal_lm(path)
    assert len(parses) == 1 and llm.gguf_info is info
    gguf_file.load_gguf_causal_lm(path)          # the loader dropped it: a second load parses again
    assert len(parses) == 2
    gguf_file.read_gguf_info(path)
    path.write_bytes(path.read_bytes())          # same bytes, new mtime: not the parse of before
    gguf_file.load_gguf_causal_lm(path)
    assert len(parses) == 4
