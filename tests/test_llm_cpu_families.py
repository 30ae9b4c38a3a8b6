"""The CPU runtime for the families beside Llama (issue 17 item 6): each family the table marks
`cpu` is exported here from its tiny random model (tests/llm_tiny_families.py) to an ExecuTorch
XNNPACK program, whose logits and greedy tokens are compared with transformers' in fp32, and whose
8da4w program must stay close (logit SQNR). Gemma 2 / 3 (row_patches.py: sandwich norms, GeGLU,
embedding scale, soft-caps, per-type RoPE) attend through a window of 8 tokens in their local
layers, shorter than the 24-40 positions compared.

An export takes ~30-60 s on this host: two families' fp32 programs (Qwen3: q/k norms inside the
native fused attention; Gemma 3: the most row features) run in the default suite, the rest under
`make test-heavy`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from llm_tiny import BOS, EOS, hf_greedy, tiny_tokenizer
from llm_tiny_families import save_tiny_family_folder, tiny_family_model

from modelexport.frontends.llm_families import FAMILIES

MAX_SEQ = 64                    # below Phi-3's tiny original context (128): longrope's short table
CPU_NEW = [f.model_type for f in FAMILIES if f.cpu and f.model_type in ("qwen3", "smollm3", "phi3", "gemma2",
                                                                         "gemma3_text")]
# Gemma 3's real query_pre_attn_scalar is its head_dim (no extra scale): 24 here makes the scale
# folded into its q norm's weight (row_patches.fold_query_scale_into_q_norm) move the logits
CONFIG_CHANGES = {"gemma3_text": {"query_pre_attn_scalar": 24}}
HEAVY = pytest.mark.heavy
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# 8da4w (int8 dynamic activations per block of 32, int4 weights per group of 32, 4-bit embeddings)
# of these tiny random models (weights drawn with std 0.2, so that every feature moves the logits:
# each layer amplifies what the one before got wrong), logits vs transformers' fp32 over 24
# positions. Measured (2026-11-27): the program 13.2 / 11.6 / 12.6 dB (Qwen3 / SmolLM3 / Phi-3), and
# the same quantized weights run in PyTorch (our kernels' references) the same to 0.1 dB: the loss is
# the quantization of these weights, not the program. So the program is held to two bounds: >= 10 dB
# from transformers (1.6 dB under the lowest measured; a broken projection layout falls far below,
# e.g. gate/up swapped moves the logits by ~0.6), and >= 30 dB from its own PyTorch model, which
# checks the kernels and fusions themselves: measured 130 / 52 / 131 dB (SmolLM3's 4 layers: now and
# then an int8 activation rounded the other way, amplified like the rest). Gemma 2 / 3 (2026-11-28):
# 10.5 / 13.0 dB from transformers (the same in PyTorch), 134 / 132 dB from their PyTorch models;
# Gemma 2's bound is 1.5 dB under its own measurement.
MIN_8DA4W_SQNR_DB = 10.0
MIN_8DA4W_SQNR_DB_OF = {"gemma2": 9.0}
MIN_PROGRAM_VS_EAGER_SQNR_DB = 30.0
PREFILL = (7, 5)


def _export(model_type: str, folder: Path, quant: str, attention: str = "native"):
    from modelexport.llm.cpu.export import CpuExportOptions, export_pte

    model = tiny_family_model(model_type, **CONFIG_CHANGES.get(model_type, {}))
    folder.mkdir(parents=True, exist_ok=True)
    opts = CpuExportOptions(quant=quant, max_seq_len=MAX_SEQ, embedding_bits=4 if quant != "fp32" else None,
                            attention=attention)
    meta = export_pte(model, folder, opts, bos_id=BOS, eos_ids=[EOS])
    tiny_tokenizer().save(folder)
    (folder / "llm.json").write_text(json.dumps(meta))
    return model, folder / "model.pte", meta


def _chunks(n: int, prefill=PREFILL) -> list[int]:
    return [*prefill, *[1] * (n - sum(prefill))]


def _teacher_forced(pte: Path, ids: list[int]) -> tuple[torch.Tensor, list[int]]:
    """The program's logits along `ids`: the last token's of each prefill chunk, then one token a call."""
    from modelexport.llm.cpu.session import ExecuTorchSession

    s = ExecuTorchSession(pte)
    out, positions, i = [], [], 0
    for n in _chunks(len(ids)):
        out.append(s.feed(ids[i:i + n]))
        i += n
        positions.append(i - 1)
    return torch.stack(out), positions


def _eager_quantized(hf_model, ids: list[int]) -> torch.Tensor:
    """The same 8da4w model in PyTorch (our kernels' references), fed as `_teacher_forced` feeds it."""
    from modelexport.llm.cpu.export import CpuExportOptions, quantize_model
    from modelexport.llm.cpu.transformer import build_transformer

    model, _ = build_transformer(hf_model, MAX_SEQ, "native")
    model = quantize_model(model, CpuExportOptions(quant="8da4w", max_seq_len=MAX_SEQ, embedding_bits=4))
    out, i = [], 0
    with torch.no_grad():
        for n in _chunks(len(ids)):
            out.append(model(torch.tensor([ids[i:i + n]]), {"input_pos": torch.tensor([i])})[0])
            i += n
    return torch.stack(out)


def _check_fp32(model_type: str, tmp_path: Path, attention: str = "native"):
    from modelexport import llm

    model, pte, meta = _export(model_type, tmp_path / model_type, "fp32", attention)
    ids = torch.randint(3, 256, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    got, positions = _teacher_forced(pte, ids)
    assert (got - ref[positions]).abs().max().item() < 1e-4
    m = llm.load(pte)
    prompt = m.tokenizer.encode("The quick brown fox")
    assert m.generate(prompt, max_new_tokens=20, stop_on_eos=False).token_ids == hf_greedy(model, prompt, 20)
    return meta


def test_qwen3_fp32_program_equals_transformers(tmp_path):
    """q/k RMSNorms computed inside the fused native attention (no fallback), head_dim > hidden/heads."""
    meta = _check_fp32("qwen3", tmp_path)
    assert meta["kernels"]["attention"] == "native: fused q|k|v, q/k norms inside"
    assert meta["kernels"]["qk_norm"] is True


def test_gemma3_fp32_program_equals_transformers(tmp_path):
    """Sandwich norms, GeGLU, embeddings x sqrt(hidden), a RoPE table per layer type, the query
    scale folded into the q norm; the local layer (window 8) attends in torch ops, the global one
    in the native kernel."""
    kernels = _check_fp32("gemma3_text", tmp_path)["kernels"]
    assert kernels["rope_tables"] == 2 and kernels["activation"] == "gelu_pytorch_tanh"
    assert kernels["attention"] == "native: fused q|k|v, q/k norms inside"
    assert kernels["scores_in_torch_ops"] == ["scale 0.25, window 8", None]
    assert kernels["embedding_scale"] == 8.0


@HEAVY
@pytest.mark.parametrize("model_type,attention", [("smollm3", "native"), ("phi3", "native"), ("gemma2", "native"),
                                                  ("qwen3", "executorch"), ("phi3", "executorch"),
                                                  ("gemma3_text", "executorch")])
def test_fp32_program_equals_transformers(tmp_path, model_type, attention):
    meta = _check_fp32(model_type, tmp_path, attention)
    kernels = meta["kernels"]
    assert kernels["nope_layers"] == ([3] if model_type == "smollm3" else [])
    assert (kernels["rotary_dims"], kernels["head_dim"]) == ((12, 16) if model_type == "phi3" else
                                                             (kernels["head_dim"], kernels["head_dim"]))
    if model_type == "gemma2":   # soft-capped scores in both layers (a window in the local one), capped logits
        assert kernels["scores_in_torch_ops"] == ["scale 0.204124, soft-cap 5, window 8", "scale 0.204124, soft-cap 5"]
        assert kernels["final_softcap"] == 3.0


# Which of our fusions each family's 8da4w program takes: all of them for a Llama-shaped block;
# for Gemma's sandwich blocks only the input norms go into the projections (the outputs are normed
# before the residual adds), and its GeGLU MLP has no fused kernel (gate and up apart)
FUSIONS = {"gemma2": dict(fused_blocks=0, fused_mlps=0, fused_input_norms=2),
           "gemma3_text": dict(fused_blocks=0, fused_mlps=0, fused_input_norms=2)}


@HEAVY
@pytest.mark.parametrize("model_type", CPU_NEW)
def test_8da4w_program_stays_close(tmp_path, model_type):
    """Every fusion the family's blocks allow (FUSIONS): for a Llama-shaped block q|k|v with its
    norm, o + residual, gate|up + SwiGLU, down + residual."""
    from modelexport.core.numerics import sqnr_db

    model, pte, meta = _export(model_type, tmp_path / model_type, "8da4w")
    n_layers = model.config.num_hidden_layers
    expected = FUSIONS.get(model_type, dict(fused_blocks=n_layers, fused_mlps=n_layers, fused_input_norms=0))
    assert {k: meta["kernels"][k] for k in expected} == expected
    ids = torch.randint(3, 256, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    got, positions = _teacher_forced(pte, ids)
    eager = _eager_quantized(model, ids)
    sqnr = sqnr_db(ref[positions].numpy(), got.numpy())
    own = sqnr_db(eager.numpy(), got.numpy())
    print(f"{model_type} 8da4w logit SQNR: {sqnr:.1f} dB vs transformers fp32 "
          f"({sqnr_db(ref[positions].numpy(), eager.numpy()):.1f} dB in PyTorch), {own:.1f} dB vs its PyTorch model")
    assert sqnr >= MIN_8DA4W_SQNR_DB_OF.get(model_type, MIN_8DA4W_SQNR_DB) and own >= MIN_PROGRAM_VS_EAGER_SQNR_DB


def test_every_cpu_row_is_expressed_and_every_refused_row_says_why():
    """A row marked `cpu` uses only fields the CPU program has an entry for (llm/cpu/hf_layout.py);
    a refused row has a field without one, and says what it lacks."""
    from modelexport.llm.cpu.hf_layout import unexpressed_fields

    for f in FAMILIES:
        missing = unexpressed_fields(f)
        if f.cpu:
            assert missing == [], (f.model_type, missing)
        else:
            assert missing and f.cpu_missing, (f.model_type, missing)
    assert {"qwen3", "smollm3", "phi3", "gemma2", "gemma3_text"} <= {f.model_type for f in FAMILIES if f.cpu}


def test_longrope_beyond_the_original_context_is_refused_before_weights(tmp_path):
    from modelexport.core.errors import InputError
    from modelexport.llm.cpu.export import CpuExportOptions, build_cached

    folder = tmp_path / "phi3"
    save_tiny_family_folder("phi3", folder)       # original context 128
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(InputError, match=r"original context \(128\)") as e:
        build_cached(folder, CpuExportOptions(max_seq_len=256), cache_dir=tmp_path / "cache")
    assert "--max-seq-len 128" in e.value.fix


@HEAVY
def test_cli_generate_builds_the_program_from_an_hf_folder(cli, tmp_path):
    """`modelexport generate FOLDER` as a user runs it on a SmolLM3 folder (NoPE layer): the program
    is built and cached, its greedy tokens are transformers', llm.json says what the kernels took."""
    from modelexport import llm

    folder = tmp_path / "smollm3"
    model = save_tiny_family_folder("smollm3", folder)
    env = {"MODELEXPORT_CACHE_DIR": str(tmp_path / "cache")}
    proc = cli("generate", str(folder), "--quant", "fp32", "--max-seq-len", "64", "--raw", "-p", "The quick brown",
               "-n", "12", "--json", check=True, env=env)
    out = json.loads(proc.stdout)
    (meta_path,) = (tmp_path / "cache").rglob("llm.json")
    meta = json.loads(meta_path.read_text())
    assert meta["architecture"] == "smollm3" and meta["kernels"]["nope_layers"] == [3]
    prompt = llm.load(meta_path.parent / "model.pte").tokenizer.encode("The quick brown")   # what --raw feeds
    assert out["token_ids"] == hf_greedy(model, prompt, 12)[:len(out["token_ids"])] and out["token_ids"]
