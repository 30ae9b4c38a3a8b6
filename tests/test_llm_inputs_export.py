"""`compile LLM --inputs embeddings|both` and `--variants ...,full` on a tiny random Llama built here
(issue 23, item 1): every part on the HTP (decoder graphs and the embedder part), the manifest says
what each part takes, the chained embedder → decoder on the simulator gives the float token path's
logits within the quantization's tolerance, the full-context graph gives the arN path's logits,
generate / eval answer a text prompt; Genie runs the embeddings bundle (its table, its embedding
query) and gives our loop's tokens; bad inputs. The `both` compile, `eval`, the 8-bit embedder under
Genie and the Genie check on a bundle with the full graph are heavy (`make test-heavy`): together ~160 s more."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_clean_error  # noqa: E402
from llm_tiny import tiny_tokenizer, write_tiny_llm_folder  # noqa: E402

SEQ = 32
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm_inputs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        yield write_tiny_llm_folder(root)


def _compile(work, name, **kw):
    import modelexport
    return modelexport.compile(str(work / "tiny_hf"), output=work / name, target="SM8650", precision="16a8w",
                               max_seq_len=SEQ, calibration=str(work / "calib.txt"), calibration_samples=2, **kw)


@pytest.fixture(scope="module")
def embeddings_bundle(work):
    return _compile(work, "emb", variants="ar1,ar4,full", inputs="embeddings")


def _float_logits(work, ids: list[int]) -> np.ndarray:
    from transformers import AutoModelForCausalLM
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(work / "tiny_hf")(torch.tensor([ids])).logits[0].numpy()


def _htp_only(bundle):
    """As the QNN EP reported it: only the float IO's Quantize/Dequantize on the CPU."""
    for graph, per_target in bundle.manifest.placement.items():
        cpu = per_target["SM8650"]["cpu_nodes"]
        assert per_target["SM8650"]["htp_nodes"] > 0, graph
        assert all("QuantizeLinear" in n or "DequantizeLinear" in n for n in cpu), (graph, cpu)


def test_every_part_on_the_htp_and_in_the_manifest(embeddings_bundle):
    m = embeddings_bundle.manifest
    llm = m.llm
    assert llm.inputs == "embeddings" and llm.full_context and llm.variants == [SEQ, 4, 1]
    names = sorted(g.name for g in m.graphs)
    assert names == [f"full_ar{SEQ}_cl{SEQ}_1_of_1", f"prompt_ar4_cl{SEQ}_1_of_1", f"token_ar1_cl{SEQ}_1_of_1"]
    for g in m.graphs:                    # the decoder takes embeddings; the full graph has no cache
        ins = [t.name for t in g.inputs]
        assert ins[0] == "inputs_embeds" and "input_ids" not in ins
        assert any(t.startswith("past_") for t in ins) == (g.n_tokens != SEQ)
    e = llm.embedder
    assert e.precision == "fp16" and sorted(g.n_tokens for g in e.graphs) == [1, 4, SEQ]
    assert len({g.file for g in e.graphs}) == 1 and all(g.shared for g in e.graphs)   # one binary, the table once
    for g in e.graphs:
        assert [t.name for t in g.inputs] == ["input_ids"] and [t.name for t in g.outputs] == ["inputs_embeds"]
        assert g.host_twin is not None and embeddings_bundle.file(g.file).is_file()
    assert e.check["SM8650"].sqnr_db > 60          # fp16 table vs the float lookup, on the simulator
    assert set(m.placement) >= {g.name for g in e.graphs}
    _htp_only(embeddings_bundle)
    assert llm.genie["SM8650"].dialog_created     # Genie's GenieDialog_create on the host twins, with its table


def test_genie_runs_the_embeddings_bundle(embeddings_bundle, work):
    """Genie's dialog takes the decoder's inputs_embeds: its config's embedding block names the bundle's
    table (float32 rows: the fp16 embedder's values for every id), the prompt goes in through
    GenieDialog_embeddingTokenQuery and every generated token is looked up by Genie in that table;
    greedy, Genie's tokens are our loop's (the embedder part's twin, then the decoder) token for token."""
    import modelexport.llm as llm
    m = embeddings_bundle.manifest
    cfg = json.loads(embeddings_bundle.file("genie_config.json").read_text())
    emb = cfg["dialog"]["embedding"]
    assert emb == {"version": 1, "type": "lut", "lut-path": "embedder/genie_lut.bin", "size": m.llm.spec.hidden_size,
                   "datatype": "float32"}
    lut = np.fromfile(embeddings_bundle.file(emb["lut-path"]), np.float32).reshape(-1, m.llm.spec.hidden_size)
    from transformers import AutoModelForCausalLM
    table = AutoModelForCausalLM.from_pretrained(work / "tiny_hf").get_input_embeddings().weight.detach()
    assert np.array_equal(lut, table.to(torch.float16).float().numpy())
    ours, genie = llm.load(embeddings_bundle.path, backend="htp-sim"), llm.load(embeddings_bundle.path, backend="genie")
    answers = []
    for prompt in ("Markets rose", "on Tuesday as"):    # two prompts the tiny model answers differently
        mine = ours.generate(prompt, max_new_tokens=4, temperature=0.0)
        theirs = genie.generate(prompt, max_new_tokens=4)
        assert theirs.stats.backend == "genie" and len(theirs.token_ids) == 4
        assert theirs.token_ids == mine.token_ids, prompt
        answers.append(theirs.token_ids)
    assert answers[0] != answers[1]


@pytest.mark.heavy
def test_genie_runs_an_8bit_embedder_bundle(work):
    """`--embedder-precision 8bit`: Genie's table is the 8-bit QDQ graph's outputs (on the CPU) row for
    row, and Genie's greedy tokens are our loop's (the 8-bit embedder twin on the simulator)."""
    import onnxruntime as ort

    import modelexport.llm as llm
    b = _compile(work, "emb8", variants="ar1,ar4", inputs="embeddings", embedder_precision="8bit")
    m = b.manifest
    assert m.llm.embedder.precision == "8bit" and m.llm.genie["SM8650"].dialog_created
    lut = np.fromfile(b.file(m.llm.embedder.genie_lut), np.float32).reshape(-1, m.llm.spec.hidden_size)
    ids = np.array([[3, 77, 200, lut.shape[0] - 1]], np.int32)
    qdq = ort.InferenceSession(str(b.file("embedder/embed_ar4_cl32.onnx")), providers=["CPUExecutionProvider"])
    assert np.array_equal(lut[ids[0]], qdq.run(None, {"input_ids": ids})[0][0])
    ours = llm.load(b.path, backend="htp-sim").generate("on Tuesday as", max_new_tokens=4, temperature=0.0)
    assert llm.load(b.path, backend="genie").generate("on Tuesday as", max_new_tokens=4).token_ids == ours.token_ids


def test_each_device_file_under_the_runtime_that_loads_it(embeddings_bundle):
    """Genie loads the arN decoder binary, its config, the tokenizer and its table, not the embedder
    part's binary nor the full-context one; ONNX Runtime loads all of them through the EPContext models."""
    from modelexport.contract.deployment import deployment
    m = embeddings_bundle.manifest
    rows = {r.runtime: r for r in deployment(m).runtimes}
    embedder_bin = m.llm.embedder.graphs[0].file
    full_bin = m.llm.weight_sharing["SM8650/1/full"].file
    decode_bin = m.llm.weight_sharing["SM8650/1"].file
    genie = rows["Genie"]
    assert decode_bin in genie.files and "embedder/genie_lut.bin" in genie.files and "genie_config.json" in genie.files
    assert embedder_bin not in genie.files and full_bin not in genie.files
    size = lambda f: embeddings_bundle.file(f).stat().st_size
    assert genie.model_bytes == size(decode_bin) + size("embedder/genie_lut.bin")   # the table is model data on the phone
    ort = rows["ONNX Runtime (QNN EP)"]
    assert {embedder_bin, full_bin, decode_bin} <= set(ort.files) and "embedder/genie_lut.bin" not in ort.files


def test_embedder_then_decoder_gives_the_token_path_logits(embeddings_bundle, work):
    """The chain on the simulator and on the CPU (fake-quant) against the float model's token path; the
    full-context graph against the arN path on the same tokens."""
    from modelexport.backends.llm_qnn.session import open_forwards
    from modelexport.core.numerics import compare
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, make_attention_mask, make_position_ids
    from modelexport.llm.run.static_runner import StaticRunner
    ids = tiny_tokenizer().encode("Markets rose on Tuesday as investors weighed the outlook")[:SEQ]
    ref = _float_logits(work, ids)
    for stage in ("fake-quant", "htp-sim"):
        graphs, spec, seq = open_forwards(embeddings_bundle, stage)
        assert sorted(graphs) == [1, 4]                           # the full graph is not a generation step
        runner = StaticRunner(graphs, spec, seq)
        got = torch.cat([runner.feed(ids[:-2])] + [runner.decode_step(t)[None] for t in ids[-2:]]).numpy()
        assert compare(ref, got)["sqnr_db"] > 25, stage
        assert (ref.argmax(-1) == got.argmax(-1)).mean() >= 0.9
        full, _, _ = open_forwards(embeddings_bundle, stage, variants=[SEQ])
        cfg = StaticDecoderConfig.full_context(SEQ)
        window = (ids * SEQ)[:SEQ]
        (logits,) = full[SEQ](torch.tensor([window], dtype=torch.int32), make_position_ids(cfg, 0), make_attention_mask(cfg, 0))
        ar = StaticRunner(graphs, spec, seq).feed(window[:SEQ - 1]).numpy()
        assert compare(ar, logits[0, :SEQ - 1].numpy())["sqnr_db"] > 25, stage
        assert compare(_float_logits(work, window), logits[0].numpy())["sqnr_db"] > 25, stage


def test_text_prompt_generates_through_the_embedder(embeddings_bundle):
    import modelexport.llm as llm
    res = llm.load(embeddings_bundle.path, backend="htp-sim").generate("Markets rose", max_new_tokens=3, temperature=0.0)
    assert len(res.token_ids) >= 1


@pytest.mark.heavy
def test_eval_runs_the_chain(embeddings_bundle, cli, work):
    proc = cli("eval", str(embeddings_bundle.path), "--perplexity", str(work / "calib.txt"), "--window", "16",
               "--tokens", "32", "--sim-window", "8", "--sim-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert set(res["stages"]) == {"float", "fake-quant", "htp-sim"}
    assert res["sqnr"]["fake-quant vs htp-sim"]["sqnr_db"] > 25


@pytest.mark.heavy
def test_both_inputs_on_the_htp(work):
    """`both`: ids looked up and inputs_embeds added, an id >= vocab_size looks nothing up; its join
    ops run on the HTP; text (zero embeddings) and an embeddings-only position give the same logits."""
    from modelexport.backends.llm_qnn.session import open_forwards
    from modelexport.core.numerics import compare
    from modelexport.llm.model.input_modes import get_input_mode
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, example_inputs
    b = _compile(work, "both", variants="ar4", inputs="both")
    llm = b.manifest.llm
    assert llm.inputs == "both" and llm.no_token_id == llm.spec.vocab_size and llm.embedder is None
    assert [t.name for t in b.manifest.graphs[0].inputs][:2] == ["input_ids", "inputs_embeds"]
    _htp_only(b)
    graphs, spec, _ = open_forwards(b, "htp-sim")
    part = graphs[4].parts[0]
    ids = np.array([tiny_tokenizer().encode("Markets")[:4]], np.int32)
    from transformers import AutoModelForCausalLM
    emb = AutoModelForCausalLM.from_pretrained(work / "tiny_hf").get_input_embeddings().weight.detach().numpy()
    feed = {k: v.numpy() for k, v in zip(part.input_names, example_inputs(StaticDecoderConfig(4, SEQ), spec,
                                                                           mode=get_input_mode("both")))
            if k not in ("input_ids", "inputs_embeds")}
    text = part.session.run(["logits"], {**feed, "input_ids": ids, "inputs_embeds": np.zeros((1, 4, spec.hidden_size), np.float32)})[0]
    mixed_ids = ids.copy()
    mixed_ids[0, 1] = llm.no_token_id
    extra = np.zeros((1, 4, spec.hidden_size), np.float32)
    extra[0, 1] = emb[ids[0, 1]]
    mixed = part.session.run(["logits"], {**feed, "input_ids": mixed_ids, "inputs_embeds": extra})[0]
    assert compare(text, mixed)["sqnr_db"] > 30
    # Genie writes one input layer, never both: no dialog, and --backend genie says so with the way out
    import modelexport.llm as llm_api
    from modelexport.core.errors import UnsupportedError
    assert not llm.genie["SM8650"].dialog_created and "never both" in llm.genie["SM8650"].dialog_note
    with pytest.raises(UnsupportedError) as e:
        llm_api.load(b.path, backend="genie")
    assert "Genie cannot run" in e.value.problem and "--inputs embeddings" in e.value.fix


def test_dry_run_estimate_counts_the_embedder_part(work, monkeypatch):
    """`compile --dry-run --inputs embeddings` prices the embedder's export (the table in float32 beside
    the held model, more for the 8-bit quantization) and its files on disk; token bundles have no such phase."""
    from modelexport.backends.llm_qnn.compile import plan_llm
    from modelexport.llm.job_estimate import EXPORT_FACTOR, PARENT_BASE
    monkeypatch.setenv("MODELEXPORT_MEMORY_AVAILABLE_MB", "64000")
    plan = lambda **kw: plan_llm(work / "tiny_hf", precision="16a8w", variants="ar1,ar4", max_seq_len=SEQ, **kw)["estimate"]
    tokens, fp16, q8 = plan(), plan(inputs="embeddings"), plan(inputs="embeddings", embedder_precision="8bit")
    assert "embedder" not in tokens["phases"]
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(work / "tiny_hf")
    table = cfg.vocab_size * cfg.hidden_size * 4
    held = fp16["phases"]["load"] - PARENT_BASE - 2 * fp16["n_params"]
    assert abs(fp16["phases"]["embedder"] - (PARENT_BASE + held + EXPORT_FACTOR * table)) <= 2
    assert q8["phases"]["embedder"] > fp16["phases"]["embedder"]
    assert fp16["disk_bytes"] > tokens["disk_bytes"] + 2 * table    # the graphs' tables, Genie's table, the binaries


# ------------------------------------------------------------------------------------------
# bad input: one clear message, nothing written

def test_unknown_inputs_value_names_the_choices(cli_here, work, tmp_path):
    out = tmp_path / "out"
    proc = cli_here("compile", str(work / "tiny_hf"), "--inputs", "pixels", "--variants", "ar1", "--max-seq-len", str(SEQ),
                    "-o", str(out))
    assert_clean_error(proc, "--inputs 'pixels'", "tokens, embeddings, both")
    assert not out.exists()
    proc = cli_here("compile", str(work / "tiny_hf"), "--embedder-precision", "8bit", "--variants", "ar1",
                    "--max-seq-len", str(SEQ), "-o", str(out))
    assert_clean_error(proc, "--embedder-precision", "--inputs embeddings")
    proc = cli_here("compile", str(work / "tiny_hf"), "--variants", "full", "--max-seq-len", str(SEQ), "-o", str(out))
    assert_clean_error(proc, "full-context", "--variants ar1,full")
    assert not out.exists()


def test_embeddings_bundle_without_its_embedder_part(embeddings_bundle, tmp_path):
    """A bundle whose decoder takes embeddings but whose manifest lists no embedder part (made by an
    older build, or edited): generate says text cannot be looked up and how to get the part."""
    import modelexport.llm as llm
    from modelexport.core.errors import InputError
    b = tmp_path / "b"
    shutil.copytree(embeddings_bundle.path, b)
    manifest = json.loads((b / "manifest.json").read_text())
    del manifest["llm"]["embedder"]
    (b / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError) as e:
        llm.load(b, backend="htp-sim")
    assert "no embedder part" in e.value.problem and "--inputs embeddings" in e.value.fix


@pytest.mark.heavy
def test_full_graph_in_a_token_bundle_under_genie(work):
    """Genie refuses a binary holding a graph without the past_ cache group ("Invalid cache-group prefix
    detected: past_", measured), so the full-context graph gets its own binary beside the arN one (the
    weights twice on the device); Genie's config names the arN binary only, its dialog is created on
    the bundle, and its loop gives our loop's tokens."""
    import modelexport.llm as llm
    b = _compile(work, "tok_full", variants="ar1,ar4,full")
    m = b.manifest
    assert m.llm.inputs == "tokens" and m.llm.full_context and m.llm.embedder is None
    assert sorted(m.llm.weight_sharing) == ["SM8650/1", "SM8650/1/full"]
    assert len(m.llm.weight_sharing["SM8650/1"].graphs) == 2 and m.llm.weight_sharing["SM8650/1"].weights_stored_once
    full_bin = m.llm.weight_sharing["SM8650/1/full"].file
    cfg = json.loads(b.file("genie_config.json").read_text())
    assert [f"SM8650/{x.rsplit('/', 1)[-1]}" for x in cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]] == \
        [m.llm.weight_sharing["SM8650/1"].file] and full_bin.endswith("_full_cl32_1_of_1.bin")
    _htp_only(b)
    assert m.llm.genie["SM8650"].dialog_created
    ours = llm.load(b.path, backend="htp-sim").generate("Markets rose", max_new_tokens=4)
    genie = llm.load(b.path, backend="genie").generate("Markets rose", max_new_tokens=4)
    assert genie.token_ids == ours.token_ids
