"""Large LLMs on a small machine (issue 17): parts sized for the host, the export through a file
(external data), the bf16-held weight source, per-graph QDQ cache entries that a killed compile
resumes from, and the up-front memory estimate that refuses a job the machine cannot hold."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_clean_error
from llm_tiny import tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SEQ = 64
TEXT = ("Markets rose on Tuesday as investors weighed the outlook for interest rates and the health of the "
        "economy, while officials said talks would resume. The quick brown fox jumps over the lazy dog. ") * 40
LLAMA_3B = {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True}
LLAMA_1B = {**LLAMA_3B, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "head_dim": 64}


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    """A tiny Llama stored in bf16 (as most HF checkpoints are), with its tokenizer and a text."""
    import torch
    root = tmp_path_factory.mktemp("llm_resume")
    tiny_llama(n_layers=2).to(torch.bfloat16).save_pretrained(root / "tiny_bf16")
    tiny_tokenizer().save(root / "tiny_bf16")
    (root / "calib.txt").write_text(TEXT)
    return root


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_default_parts_split_a_3b_model_and_keep_a_1b_one_in_few():
    from modelexport.llm.export.memory import plan_parts
    parts3, _ = plan_parts(SimpleNamespace(**LLAMA_3B), [1, 32], 512, 4, 16, 2048)
    parts1, _ = plan_parts(SimpleNamespace(**LLAMA_1B), [1, 32], 512, 4, 16, 2048)
    assert len(parts3) > 1 and len(parts1) > 1
    assert len(parts1) <= 4 < len(parts3) <= 14
    assert parts3[0].first_layer == 0 and parts3[-1].end_layer == 28
    smaller, _ = plan_parts(SimpleNamespace(**LLAMA_3B), [1, 32], 512, 4, 16, 1024)   # the refusal's fix
    assert len(smaller) > len(parts3)


def test_exported_part_computes_the_float_part_with_weights_in_its_data_file(tmp_path):
    """The exporter is given no weights; they are written one at a time into the part's data file:
    the graph takes no weight as an input, holds none inline, and computes what the float part
    computes (ONNX Runtime on the CPU against the PyTorch part)."""
    import onnx
    import onnxruntime as ort
    import torch

    from modelexport.llm.export.onnx_export import DecoderPart, export_part
    from modelexport.llm.model.parts import split_layers
    from modelexport.llm.model.static_decoder import ONNX_RMS_NORM, StaticDecoderConfig, build_static_decoder
    model = tiny_llama(n_layers=2)
    dec = build_static_decoder(model, StaticDecoderConfig(4, SEQ), rms_norm=ONNX_RMS_NORM)
    for part in split_layers(2, 2):
        path = export_part(dec, part, tmp_path / f"p{part.index}.onnx")
        g = onnx.load(str(path), load_external_data=False).graph
        assert [i.name for i in g.input] == DecoderPart(dec, part).input_names()
        big = [i for i in g.initializer if i.raw_data or i.float_data]
        assert all(len(i.raw_data) + 4 * len(i.float_data) <= 1024 for i in big)      # weights are external
        assert (tmp_path / f"p{part.index}.onnx.data").stat().st_size >= 4 * 64 * 64
        mod = DecoderPart(dec, part).eval()
        inputs = [torch.randn(x.shape) if x.is_floating_point() else x for x in mod.example_inputs()]
        with torch.no_grad():
            want = mod(*inputs)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {n: x.numpy() for n, x in zip(mod.input_names(), inputs)})
        for w, o in zip(want, got):
            np.testing.assert_allclose(o, w.numpy(), atol=1e-4, rtol=1e-4)


def test_bf16_held_model_exports_and_calibrates_as_float32(tiny_bf16, tmp_path):
    """Held in bf16 and lifted per part, the model gives the graphs and calibration data of the same
    weights held in float32 (the values came from bf16: the lift is exact)."""
    import onnx
    import torch
    from onnx import numpy_helper

    from modelexport.llm.export.calibrate import calibration_samples
    from modelexport.llm.export.onnx_export import export_part
    from modelexport.llm.model.parts import split_layers
    from modelexport.llm.model.static_decoder import (
        ONNX_RMS_NORM,
        StaticDecoderConfig,
        build_static_decoder,
    )
    from modelexport.llm.export.weight_dtype import store_bf16
    f32 = tiny_llama(n_layers=2).to(torch.bfloat16).float()
    held = tiny_llama(n_layers=2).to(torch.bfloat16).float()
    assert store_bf16(held, "bfloat16") and held.lm_head.weight.dtype == torch.bfloat16
    assert held.model.rotary_emb.inv_freq.dtype == torch.float32      # buffers are not rounded
    ids = tiny_tokenizer().encode(TEXT)[:SEQ * 3]
    cal = {name: calibration_samples(m, ids, [1, 4], SEQ, 2) for name, m in (("f32", f32), ("held", held))}
    assert held.lm_head.weight.dtype == torch.bfloat16                # lowered again after each module
    for n in (1, 4):
        for s32, sh in zip(cal["f32"][n], cal["held"][n]):
            assert all(np.array_equal(s32[k], sh[k]) for k in s32)
    part = split_layers(2, 2)[1]
    paths = {name: export_part(build_static_decoder(m, StaticDecoderConfig(4, SEQ), rms_norm=ONNX_RMS_NORM), part,
                               tmp_path / name / "p.onnx") for name, m in (("f32", f32), ("held", held))}
    w = {k: {i.name: numpy_helper.to_array(i) for i in onnx.load(str(p)).graph.initializer} for k, p in paths.items()}
    assert w["f32"].keys() == w["held"].keys()
    assert all(w["held"][k].dtype != np.dtype("float16") and np.array_equal(w["f32"][k], w["held"][k]) for k in w["f32"])


def test_part_entry_is_whole_or_absent_and_reused(tmp_path):
    """The unit a resume counts on: a graph's entry exists only once it is quantized (a failing job
    leaves none), and the same key later is a hit that needs no float part any more."""
    from modelexport.llm.export.calibrate import part_samples
    from modelexport.llm.export.onnx_export import export_part
    from modelexport.llm.export.part_stage import PART_NAMESPACE, quantize_part
    from modelexport.core.cache import Cache
    from modelexport.llm.model.parts import split_layers
    from modelexport.llm.model.static_decoder import (
        ONNX_RMS_NORM,
        StaticDecoderConfig,
        build_static_decoder,
    )
    from modelexport.quant.llm_graphs import DEFAULT_OVERRIDES, parse_overrides
    dec = build_static_decoder(tiny_llama(n_layers=2), StaticDecoderConfig(4, SEQ), rms_norm=ONNX_RMS_NORM)
    part = split_layers(2, 2)[1]
    fpath = export_part(dec, part, tmp_path / "float" / "g.onnx")
    sample = {k: v.numpy() for k, v in zip(dec.input_names(), dec.example_inputs())}
    sample["hidden_states"] = np.zeros((1, 4, 64), np.float32)
    job = {"name": "g", "key": "k" * 64, "cache_root": str(tmp_path / "cache"), "cache_enabled": True,
           "quantize": {"float_path": str(tmp_path / "float" / "broken.onnx"), "precision": "16a4w",
                        "overrides": list(reversed(parse_overrides(list(DEFAULT_OVERRIDES), "16a4w"))),
                        "samples": part_samples([sample], part, [sample["hidden_states"]]), "source": "test",
                        "block_size": 0, "tied_ranges": {}}}
    (tmp_path / "float" / "broken.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(Exception):   # noqa: B017 (how it fails does not matter here: what it leaves behind does)
        quantize_part(job)
    cache = Cache(tmp_path / "cache")
    assert cache.get(PART_NAMESPACE, job["key"]) is None and not (tmp_path / "float" / "broken.onnx").exists()
    job["quantize"]["float_path"] = str(fpath)
    first = quantize_part(job)
    assert not first["hit"] and not fpath.exists()                  # the float part is gone once quantized
    assert (Path(first["entry"]) / "g.onnx").is_file() and (Path(first["entry"]) / "entry.json").is_file()
    assert quantize_part(job) == {"entry": first["entry"], "hit": True}


@pytest.mark.heavy
@pytest.mark.skipif(not os.environ.get("MODELEXPORT_HEAVY_TESTS"),
                    reason="heavy: run with `make test-heavy` (stage 1 of a tiny LLM twice)")
def test_qdq_stage_resumes_from_finished_graphs(tiny_bf16, tmp_path):
    """Stage 1 alone, twice: the second run reuses the graphs the first finished (one is deleted
    as if the first run had been killed before it) and makes the missing one again, the same."""
    from modelexport.backends.spec import LlmCompileOptions, PartSpec, max_seq_len_of
    from modelexport.core.cache import Cache
    from modelexport.llm.export.graphs import QdqJob, build_qdq
    from modelexport.llm.export.part_stage import PART_NAMESPACE, part_key
    from modelexport.llm.export.plan import resolve_plan

    cache = Cache(tmp_path / "cache")
    said: list[str] = []
    plan = resolve_plan(PartSpec(model=str(tiny_bf16 / "tiny_bf16"), precision="16a4w",
                                 calibration=str(tiny_bf16 / "calib.txt")),
                        LlmCompileOptions(variants="ar4", max_seq_len=SEQ, calibration_samples=2, context_limit_mb=0.06,
                                          jobs=1, rounding="nearest"), max_seq_len_of)

    def run(tmp: Path) -> dict:
        tmp.mkdir()
        return build_qdq(QdqJob(plan, tmp, cache, "test-stage", said.append))
    first = run(tmp_path / "first")
    names = [g["name"] for g in first["graphs"]]
    assert names == ["prompt_ar4_cl64_1_of_2", "prompt_ar4_cl64_2_of_2"] and first["resumed_graphs"] == []
    assert first["weights_held_as"] == "bfloat16"
    lost = cache.get(PART_NAMESPACE, part_key("test-stage", names[1]))
    import shutil
    shutil.rmtree(lost)
    said.clear()
    second = run(tmp_path / "second")
    assert second["resumed_graphs"] == [names[0]]
    assert any(m.startswith("resuming: part 1 of 2 reused") for m in said), said
    assert "exporting " + names[0] not in said and "exporting " + names[1] in said
    for n in names:
        assert _sha(tmp_path / "first" / "qdq" / f"{n}.onnx") == _sha(tmp_path / "second" / "qdq" / f"{n}.onnx")
        assert _sha(tmp_path / "first" / "qdq" / f"{n}.onnx.data") == _sha(tmp_path / "second" / "qdq" / f"{n}.onnx.data")


def test_refused_up_front_when_the_machine_has_too_little_memory(cli_here, tiny_bf16, tmp_path):
    out = tmp_path / "out"
    args = ["compile", str(tiny_bf16 / "tiny_bf16"), "--variants", "ar1,ar4", "--max-seq-len", str(SEQ)]
    env = {"MODELEXPORT_MEMORY_AVAILABLE_MB": "200", "MODELEXPORT_CACHE_DIR": str(tmp_path / "cache")}
    proc = cli_here(*args, "-o", str(out), env=env)
    # the tiny model's peak is calibration (the whole model): no part size or worker count helps
    assert_clean_error(proc, "of memory at its peak", "the machine has 0.2 GB available", "calibrating this model")
    assert "--jobs 1" not in proc.stderr and "--rounding nearest" not in proc.stderr
    assert not out.exists() and not (tmp_path / "cache" / "llm-qdq-part").exists()   # nothing loaded or started
    plan = cli_here(*args, "--dry-run", "--json", env=env, check=True)
    report = json.loads(plan.stdout)
    assert report["fits"] is False and "0.2 GB available" in report["refusal"]
    assert report["estimate"]["n_parts"] == 1 and report["estimate"]["peak_bytes"] > 200 * 2**20



def test_refusal_names_nearest_when_the_rounding_is_the_peak(tmp_path, monkeypatch):
    from modelexport.core.errors import ResourceError
    from modelexport.llm.job_estimate import GB, JobEstimate, check_machine
    monkeypatch.setenv("MODELEXPORT_MEMORY_AVAILABLE_MB", "4000")
    est = JobEstimate(n_params=1, n_parts=1, parts=[[0, 1]], largest_part_float_bytes=GB,
                      phases={"load": 3 * GB, "calibrate": 3 * GB, "round": 5 * GB, "quantize": 2 * GB}, peak_bytes=5 * GB)
    with pytest.raises(ResourceError) as e:
        check_machine(est, tmp_path, 512, 2)
    assert "round 5.0 GB" in str(e.value) and "--rounding nearest" in e.value.fix and "3.0 GB" in e.value.fix


def test_dry_run_plan_fits_a_roomy_machine(tiny_bf16, monkeypatch):
    from modelexport.backends.llm_qnn.compile import plan_llm
    monkeypatch.setenv("MODELEXPORT_MEMORY_AVAILABLE_MB", "64000")
    report = plan_llm(tiny_bf16 / "tiny_bf16", variants="ar1,ar4", max_seq_len=SEQ)
    assert report["fits"] is True and report["refusal"] is None and report["weights_held_as"] == "bfloat16"
    est = report["estimate"]
    assert est["n_params"] == sum(p.numel() for p in tiny_llama(n_layers=2).parameters())
    assert set(est["phases"]) == {"load", "calibrate", "round", "quantize", "compile"} and est["disk_bytes"] > 0
    assert est["phases"]["round"] > est["phases"]["load"]      # the default gptq's moments, one window
    nearest = plan_llm(tiny_bf16 / "tiny_bf16", variants="ar1,ar4", max_seq_len=SEQ, rounding="nearest")["estimate"]
    assert "round" not in nearest["phases"]


def test_one_worker_when_two_do_not_fit_but_one_does(tiny_bf16, monkeypatch):
    """The default worker count drops to one (and says so) where two would not fit; a --jobs the user
    gave is kept and refused. The tiny model's folder planned with Llama-3.2-1B's shape (its config
    is all the plan reads), where the workers weigh in the estimate."""
    import dataclasses

    from modelexport.backends.llm_qnn.compile import plan_llm
    from modelexport.llm.export import plan
    real = plan.check_source
    shape_1b = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                    intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True)
    monkeypatch.setattr(plan, "check_source", lambda *a, **k: dataclasses.replace(real(*a, **k), shape=shape_1b))
    args = dict(variants="ar1,ar32", max_seq_len=128)
    monkeypatch.setenv("MODELEXPORT_MEMORY_AVAILABLE_MB", "64000")
    # the 1B plan wants ~10 GB of disk: the CI machine may have less free, and disk is not what this tests
    monkeypatch.setenv("MODELEXPORT_DISK_AVAILABLE_MB", "1000000")
    two, one = plan_llm(tiny_bf16 / "tiny_bf16", **args), plan_llm(tiny_bf16 / "tiny_bf16", jobs=1, **args)
    assert two["jobs"] == 2 and two["jobs_note"] is None and one["estimate"]["n_parts"] == 4
    assert one["estimate"]["peak_bytes"] < two["estimate"]["peak_bytes"]
    between = (one["estimate"]["peak_bytes"] + two["estimate"]["peak_bytes"]) / 2 / 2**20
    monkeypatch.setenv("MODELEXPORT_MEMORY_AVAILABLE_MB", str(between))
    fitted = plan_llm(tiny_bf16 / "tiny_bf16", **args)
    assert fitted["fits"] is True, fitted["refusal"]
    assert fitted["jobs"] == 1 and "one worker instead of 2" in fitted["jobs_note"]
    given = plan_llm(tiny_bf16 / "tiny_bf16", jobs=2, **args)
    assert given["fits"] is False and given["jobs"] == 2 and "--jobs 1" in given["refusal"]


@pytest.mark.heavy
@pytest.mark.skipif(not os.environ.get("MODELEXPORT_HEAVY_TESTS"),
                    reason="heavy: run with `make test-heavy` (three tiny LLM compiles, one killed)")
def test_compile_killed_with_sigkill_resumes_and_gives_the_same_bundle(tiny_bf16, tmp_path):
    """A real compile (2 parts) killed with SIGKILL once its first graph is cached; the same command
    again reuses it, says so, and writes the bundle an uninterrupted compile writes."""
    args = [sys.executable, "-m", "modelexport", "compile", str(tiny_bf16 / "tiny_bf16"), "--variants", "ar1,ar4",
            "--max-seq-len", str(SEQ), "--precision", "16a4w", "--calibration", str(tiny_bf16 / "calib.txt"),
            "--calibration-samples", "2", "--context-limit-mb", "0.06", "--json"]
    cache = tmp_path / "cache"
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(cache)}
    proc = subprocess.Popen([*args, "-o", str(tmp_path / "resumed")], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not list(cache.glob("llm-qdq-part/*/*/entry.json")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)                          # the compile and its workers, at once
    proc.wait()
    finished = {p.parent.name for p in cache.glob("llm-qdq-part/*/*/entry.json")}
    assert proc.returncode == -signal.SIGKILL and 1 <= len(finished) < 4
    assert not (tmp_path / "resumed").exists() and not list(cache.glob("llm-qdq/*/*/entry.json"))
    again = subprocess.run([*args, "-o", str(tmp_path / "resumed")], env=env, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    m = json.loads((tmp_path / "resumed" / "manifest.json").read_text())
    assert len(m["cache"]["resumed_graphs"]) >= len(finished) >= 1
    whole = subprocess.run([*args, "-o", str(tmp_path / "whole")], capture_output=True, text=True, check=False,
                           env={**env, "MODELEXPORT_CACHE_DIR": str(tmp_path / "cache2")})
    assert whole.returncode == 0, whole.stderr
    w = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    files = {f["path"]: f["sha256"] for f in m["files"] if f["path"].startswith("qdq/")}
    assert files and files == {f["path"]: f["sha256"] for f in w["files"] if f["path"].startswith("qdq/")}
    assert [g["name"] for g in m["graphs"]] == [g["name"] for g in w["graphs"]]
