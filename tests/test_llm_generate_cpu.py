"""The CPU runtime on a tiny real Llama exported here: ExecuTorch XNNPACK programs (fp32 and
8da4w), their logits against Hugging Face across prefill chunks and decode steps, greedy
agreement, the fast lowering path writing the same bytes, and `modelexport generate` with its
bad-input errors."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import assert_clean_error
from llm_tiny import BOS, EOS, hf_greedy, tiny_llama, tiny_tokenizer
from modelexport.core.errors import InputError


def _export(folder, quant: str, fast: bool = True, n_layers: int = 2, max_seq_len: int = 96, prefill_chunk: int = 0):
    from modelexport.llm.cpu.export import CpuExportOptions, export_pte

    model = tiny_llama(n_layers)
    folder.mkdir(parents=True, exist_ok=True)
    meta = export_pte(model, folder, CpuExportOptions(quant=quant, max_seq_len=max_seq_len,
                                                      embedding_bits=4 if quant != "fp32" else None,
                                                      fast_lowering=fast, prefill_chunk=prefill_chunk),
                      bos_id=BOS, eos_ids=[EOS])
    tiny_tokenizer().save(folder)
    return model, folder / "model.pte", meta


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("tiny_fp32"), "fp32")


@pytest.fixture(scope="module")
def q4(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("tiny_8da4w"), "8da4w")


@pytest.fixture(scope="module")
def et_attention(fp32, tmp_path_factory):
    """The fp32 program of the same model with ExecuTorch's attention (three projections and
    `llama::custom_sdpa`, none of our ops)."""
    from modelexport.llm.cpu.export import CpuExportOptions, export_pte

    model = fp32[0]
    folder = tmp_path_factory.mktemp("tiny_fp32_et_attention")
    export_pte(model, folder, CpuExportOptions(quant="fp32", max_seq_len=96, embedding_bits=None, attention="executorch"),
               bos_id=BOS, eos_ids=[EOS])
    tiny_tokenizer().save(folder)
    return folder / "model.pte"


def test_fp32_program_matches_hf_logits_across_chunks(fp32):
    from modelexport.llm.cpu.session import ExecuTorchSession

    model, pte, meta = fp32
    s = ExecuTorchSession(pte)
    assert s.max_seq_len == 96 and s.vocab_size == 260 and s.eos_ids == [EOS] and s.max_chunk == 95
    ids = [BOS, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    got = [s.feed(ids[:5]), s.feed(ids[5:9]), s.feed([ids[9]]), s.feed(ids[10:])]
    for g, want in zip(got, (ref[4], ref[8], ref[9], ref[11])):
        assert torch.allclose(g, want, atol=1e-4), float((g - want).abs().max())
    # rewinding re-reads the same cache positions: same logits again
    s.rewind(9)
    assert torch.allclose(s.feed([ids[9]]), ref[9], atol=1e-4)
    s.reset()
    assert s.position == 0 and torch.allclose(s.feed(ids), ref[-1], atol=1e-4)


def test_static_one_token_program_matches_hf_and_keeps_logits(tmp_path):
    """`prefill_chunk=1`: a static [1, 1] program (no dynamic shapes); the prompt is fed token by
    token. Also: logits handed out by `feed` are copies (the program reuses its output buffer,
    read without ATen's clone), so earlier ones stay as they were."""
    import modelexport.llm as llm
    from modelexport.llm.cpu.session import ExecuTorchSession

    model, pte, _ = _export(tmp_path / "static", "fp32", prefill_chunk=1)
    s = ExecuTorchSession(pte)
    assert s.max_chunk == 1 and s.prefill_chunk == 1 and not s.meta["enable_dynamic_shape"]
    ids = [BOS, 72, 101, 108, 108, 111]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    first = s.feed(ids[:3])
    kept = first.clone()
    last = s.feed(ids[3:])
    assert s.position == len(ids) and torch.equal(first, kept)
    assert torch.allclose(first, ref[2], atol=1e-4) and torch.allclose(last, ref[-1], atol=1e-4)
    m = llm.load(pte)
    prompt = m.tokenizer.encode("The quick brown fox")
    assert m.generate(prompt, max_new_tokens=12, stop_on_eos=False).token_ids == hf_greedy(model, prompt, 12)


def _operators(pte) -> set[str]:
    from executorch.exir._serialize._program import deserialize_pte_binary
    plan = deserialize_pte_binary(pte.read_bytes()).program.execution_plan[0]
    return {f"{op.name}.{op.overload}" for op in plan.operators}


def test_attention_kernels_agree(fp32, et_attention):
    """The default program fuses q|k|v and attends with our kernel (`modelexport::sdpa`);
    `attention="executorch"` keeps ExecuTorch's three projections and `llama::custom_sdpa`.
    Both give Hugging Face's logits, through prefill chunks and decode steps."""
    from modelexport.llm.cpu.session import ExecuTorchSession

    model, native_pte, _ = fp32
    ops_native, ops_et = _operators(native_pte), _operators(et_attention)
    assert "modelexport::sdpa.out" in ops_native and "llama::custom_sdpa.out" not in ops_native
    assert "llama::custom_sdpa.out" in ops_et and "modelexport::sdpa.out" not in ops_et
    ids = [BOS, 84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114, 111, 119, 110]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    for pte in (native_pte, et_attention):
        s = ExecuTorchSession(pte)
        got = [s.feed(ids[:7]), s.feed(ids[7:12]), s.feed([ids[12]]), s.feed([ids[13]]), s.feed(ids[14:])]
        for g, i in zip(got, (6, 11, 12, 13, 15)):
            assert torch.allclose(g, ref[i], atol=1e-4), (pte, i, float((g - ref[i]).abs().max()))


def test_fp32_greedy_equals_transformers(fp32):
    import modelexport.llm as llm

    model, pte, _ = fp32
    m = llm.load(pte)
    assert m.backend == "cpu" and m.info["tokenizer"]["vocab_size"] == 258
    prompt_ids = m.tokenizer.encode("The quick brown fox")
    want = hf_greedy(model, prompt_ids, 24)
    res = m.generate("The quick brown fox", max_new_tokens=24, stop_on_eos=False)
    assert res.token_ids == want
    assert res.stats.backend == "cpu" and res.stats.decode_tokens_per_s > 0


def test_8da4w_program_runs_and_mostly_agrees(q4, fp32):
    import modelexport.llm as llm

    model, pte, meta = q4
    assert meta["bytes"] < fp32[2]["bytes"]
    m = llm.load(pte)
    ids = m.tokenizer.encode("The quick brown fox")
    want = hf_greedy(model, ids, 16)
    got = m.generate(ids, max_new_tokens=16, stop_on_eos=False).token_ids
    agree = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    print(f"8da4w tiny greedy agreement: {agree}/16 tokens")
    assert agree >= 1
    stream = m.stream("abc", max_new_tokens=8, temperature=0.7, seed=3)
    assert "".join(stream) == stream.result.text


def test_fast_lowering_writes_the_same_program(q4, tmp_path):
    """The module's 8da4w program went through the fast lowering (its second layer reuses the
    first's XNNPACK preprocessing); the standard path on the same model writes the same bytes."""
    _, fast, _ = q4
    _, slow, _ = _export(tmp_path / "slow", "8da4w", fast=False)
    assert fast.read_bytes() == slow.read_bytes()


# -------------------------------------------------------------------------------- the CLI
def test_cli_generate_streams_and_reports_json(fp32, cli, cli_here):
    _, pte, _ = fp32
    proc = cli("generate", str(pte), "--prompt", "Hello", "--max-new-tokens", "8", check=True)
    assert "prefill" in proc.stderr and "decode" in proc.stderr
    assert "chat template" in proc.stderr
    # the --json forms from the entry function in this process (the console entry is checked above)
    proc = cli_here("generate", str(pte), "--prompt", "Hello", "-n", "8", "--json", "--raw")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["stats"]["generated_tokens"] <= 8 and out["stats"]["prompt_tokens"] == 6
    assert out["chat_template"] is False
    assert {"time_to_first_token_s", "prefill_tokens_per_s", "decode_tokens_per_s"} <= set(out["stats"])
    # by default a model with a chat template gets the prompt wrapped in it, as llama.cpp and Ollama do
    templated = cli_here("generate", str(pte), "--prompt", "Hello", "-n", "8", "--json")
    assert templated.returncode == 0, templated.stderr
    templated = json.loads(templated.stdout)
    assert templated["chat_template"] is True and templated["stats"]["prompt_tokens"] > 6


def test_cli_chat_reads_turns_from_stdin(fp32):
    import os
    import subprocess
    import sys

    _, pte, _ = fp32
    proc = subprocess.run([sys.executable, "-m", "modelexport", "generate", str(pte), "--chat", "--json", "-n", "4"],
                          input="hello\nhow are you\n", capture_output=True, text=True, env=os.environ, timeout=600)
    assert proc.returncode == 0, proc.stderr
    turns = json.loads(proc.stdout)["turns"]
    assert [t["user"] for t in turns] == ["hello", "how are you"]
    assert turns[1]["stats"]["prefill_tokens"] < turns[1]["stats"]["prompt_tokens"]


def test_cli_bad_inputs(fp32, cli_here, tmp_path):
    import importlib.util
    from pathlib import Path

    _, pte, _ = fp32
    assert_clean_error(cli_here("generate", str(pte), "--prompt", "   "), "empty")
    assert_clean_error(cli_here("generate", str(pte), "--prompt", "hi", "--raw", "--chat"), "cannot go together")
    # a .pte is built already: the flag would be ignored, so it is refused
    assert_clean_error(cli_here("generate", str(pte), "--prompt", "hi", "--requantize-gguf"), "applies to a GGUF file")
    assert_clean_error(cli_here("generate", str(pte)), "prompt")
    assert_clean_error(cli_here("generate", str(pte), "--prompt", "x" * 200), "context")
    assert_clean_error(cli_here("generate", str(pte), "--prompt", "hi", "--top-p", "0"), "top-p")
    sp = Path(list(importlib.util.find_spec("mistral_common").submodule_search_locations)[0]) / "data" / "tokenizer.model.v1"
    assert_clean_error(cli_here("generate", str(pte), "--prompt", "hi", "--tokenizer", str(sp)), "do not belong together")
    assert_clean_error(cli_here("generate", str(tmp_path / "missing.gguf"), "--prompt", "hi"), "does not exist")
    assert_clean_error(cli_here("generate", str(tmp_path / "missing"), "--image", str(tmp_path / "x.jpg"),
                                "--prompt", "hi"), "does not exist")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model")
    assert_clean_error(cli_here("generate", str(junk), "--prompt", "hi"), "not a GGUF")
    assert_clean_error(cli_here("generate", str(pte), "--prompt", "hi", "--backend", "htp-sim"), "compiled LLM bundles")
    assert_clean_error(cli_here("generate", str(pte), "--prompt", "hi", "--backend", "gpu"), "unknown LLM backend")


def test_cli_bundles_that_cannot_generate(fp32, cli_here, tmp_path):
    from modelexport.contract.bundle import BundleWriter
    from modelexport.contract.manifest import Manifest, SourceModel

    _, pte, _ = fp32
    with BundleWriter(tmp_path / "cnn", manifest=Manifest(kind="model")) as w:
        w.path("model.onnx").write_bytes(b"x")
    assert_clean_error(cli_here("generate", str(tmp_path / "cnn"), "--prompt", "hi"), "not an LLM")
    with BundleWriter(tmp_path / "llm", manifest=Manifest(kind="llm")) as w:
        w.add_file(pte.parent / "tokenizer.json", "tokenizer.json", role="tokenizer")
    assert_clean_error(cli_here("generate", str(tmp_path / "llm"), "--prompt", "hi", "--backend", "htp-sim"), "no HTP graphs")
    # an LLM bundle holds NPU graphs: on the CPU it generates from the model it was compiled from
    assert_clean_error(cli_here("generate", str(tmp_path / "llm"), "--prompt", "hi"), "carries no CPU program")
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text("{}")
    with BundleWriter(tmp_path / "llm2", manifest=Manifest(kind="llm", source=SourceModel(path=str(source), sha256="0" * 64))):
        pass
    changed = cli_here("generate", str(tmp_path / "llm2"), "--prompt", "hi")
    assert_clean_error(changed, "changed since it was compiled")
    assert changed.returncode == 4


def test_python_api_errors(fp32):
    import modelexport.llm as llm

    _, pte, _ = fp32
    with pytest.raises(InputError):
        llm.load(pte.parent / "nope.pte")
    m = llm.load(pte)
    with pytest.raises(InputError, match="empty"):
        m.generate("")
    with pytest.raises(InputError, match="max-new-tokens"):
        m.generate("hi", max_new_tokens=0)


def test_a_built_program_runs_without_executorchs_export_stack(fp32):
    """Generating from a built program needs ExecuTorch's runtime only. Its export stack
    (executorch.exir, which pulls dynamo and inductor) cost ~9 CPU-s of every `generate` call
    when it came in through executorch's portable_lib wrapper."""
    import subprocess
    import sys

    _, pte, _ = fp32
    code = ("import sys; import modelexport.llm as llm; llm.load(sys.argv[1]).generate('hi', max_new_tokens=2); "
            "print(sorted({n for n in sys.modules if n.startswith(('executorch.exir', 'torch._dynamo', 'torch._inductor'))}))")
    proc = subprocess.run([sys.executable, "-c", code, str(pte)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_eval_cpu_stage_scores_the_program_as_transformers_does(fp32, cli_here, tmp_path):
    """`eval --stages cpu`: the CPU program's perplexity, one decode step per token, equals the
    Hugging Face model's on the same windows (fp32 program); a .pte has no float stage."""
    import math

    from modelexport.runtime.evaluate import evaluate
    from modelexport.llm.run.text import dialog_start, text_windows, tokenize
    from modelexport.llm.run.tokenizers import load_tokenizer_json

    model, pte, _ = fp32
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat. " * 12)
    res = evaluate(pte, text, window=32, max_tokens=70)
    assert list(res["stages"]) == ["cpu"] and res["stages"]["cpu"]["windows"] == 3
    tok = load_tokenizer_json(pte.parent / "tokenizer.json")
    ids = tokenize(tok, text.read_text(), 70)
    nll, n = 0.0, 0
    for w in text_windows(ids, 32, dialog_start(tok)):      # each window begins as a dialog does
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([w])).logits[0, :-1].double(), dim=-1)
        nll -= float(logp[torch.arange(len(w) - 1), torch.tensor(w[1:])].sum())
        n += len(w) - 1
    assert res["stages"]["cpu"]["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-3)
    assert_clean_error(cli_here("eval", str(pte), "--perplexity", str(text), "--stages", "float"), "no float model")


def test_weight_quantizer_beats_min_max_per_group():
    """The clip search never does worse than min/max scales, uses the whole int4 grid, and gives
    zero error on weights that sit exactly on a symmetric grid."""
    from modelexport.llm.cpu.export import quantize_weight

    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 2.0, 128)
    q, scale = quantize_weight(w, 4, 32)
    assert q.dtype == torch.int8 and int(q.min()) == -8 and int(q.max()) <= 7 and scale.shape == (64, 4)
    ours = ((q.reshape(64, 4, 32) * scale.unsqueeze(-1)).reshape(64, 128) - w).pow(2).reshape(64, 4, 32).sum(-1)
    mm_scale = w.reshape(64, 4, 32).abs().amax(-1, keepdim=True) / 7.5
    mm = (torch.clamp(torch.round(w.reshape(64, 4, 32) / mm_scale), -8, 7) * mm_scale - w.reshape(64, 4, 32)).pow(2).sum(-1)
    assert bool((ours <= mm * 1.01).all()) and float(ours.sum()) < 0.9 * float(mm.sum())
    exact = torch.randint(-8, 8, (8, 64), generator=torch.Generator().manual_seed(1)).float() * 0.25
    q, scale = quantize_weight(exact, 4, 32)
    assert torch.equal((q.reshape(8, 2, 32) * scale.unsqueeze(-1)).reshape(8, 64), exact)


def test_missing_cxx_is_a_clean_error_only_for_programs_that_need_it(fp32, et_attention, cli, tmp_path):
    """No C++ compiler and no kernel built yet: our program stops before its first call with the
    fix; a program without our ops (ExecuTorch's attention) still generates."""
    from modelexport.llm.cpu.session import calls_native_kernels

    _, pte, _ = fp32
    env = {"CXX": str(tmp_path / "no-such-g++"), "MODELEXPORT_CACHE_DIR": str(tmp_path / "empty-cache")}
    assert calls_native_kernels(pte)
    assert_clean_error(cli("generate", str(pte), "-p", "hi", "--max-new-tokens", "2", env=env), "g++")
    assert not calls_native_kernels(et_attention)
    proc = cli("generate", str(et_attention), "-p", "hi", "--max-new-tokens", "2", env=env)
    assert proc.returncode == 0, proc.stderr
