"""`compile LLM --positions cos-sin`: the graphs take RoPE's cos and sin (`position_ids_cos` / `_sin`
[1, 1, N, rotary_dim/2], AI Hub's and GenieX's inputs) instead of position_ids. On a tiny Llama: the
decoder computes what the position_ids one does, bit for bit; the bundle's own loop feeds the rows of its
`rope_table.npz` and holds the float logits as the position_ids bundle does; Genie, told "rope", computes
the cos and sin itself and gives our loop's greedy tokens; what one cos/sin pair cannot feed is refused."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_clean_error  # noqa: E402
from llm_tiny import tiny_llama, tiny_llm_work, tiny_tokenizer  # noqa: E402
from llm_tiny_families import save_tiny_family_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SEQ = 64
TEXT = "Markets rose on Tuesday as investors weighed the outlook. " * 3


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    with tiny_llm_work(tmp_path_factory, "llm_positions") as root:
        yield root


def _compile(work, positions: str, **kw):
    import modelexport
    return modelexport.compile(str(work / "tiny_hf"), output=work / f"bundle_{positions}", target="SM8650",
                               precision="16a8w", variants="ar1,ar4", max_seq_len=SEQ, positions=positions,
                               calibration=str(work / "calib.txt"), calibration_samples=4, rounding="nearest", **kw)


@pytest.fixture(scope="module")
def bundle(work):
    return _compile(work, "cos-sin", geniex=True)


def test_the_cos_sin_decoder_computes_what_the_position_ids_one_does():
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    model, cfg = tiny_llama(seed=1), StaticDecoderConfig(4, 32)
    ids_dec, cs_dec = build_static_decoder(model, cfg), build_static_decoder(model, cfg, positions="cos-sin")
    call = (torch.tensor([[5, 9, 13, 2]], dtype=torch.int32), *ids_dec.example_inputs(past_len=7)[1:])
    graph = cs_dec.graph_inputs(call)
    assert cs_dec.input_names()[:4] == ["input_ids", "position_ids_cos", "position_ids_sin", "attention_mask"]
    assert graph[1].shape == (1, 1, 4, ids_dec.spec.head_dim // 2)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(ids_dec(*call), cs_dec(*graph)))


def test_the_graphs_take_cos_and_sin_and_the_bundle_their_table(bundle):
    m = bundle.manifest
    assert m.llm.positions == "cos-sin"
    for g in m.graphs:
        shapes = {i.name: i.shape for i in g.inputs}
        assert "position_ids" not in shapes
        assert shapes["position_ids_cos"] == shapes["position_ids_sin"] == [1, 1, g.n_tokens, m.llm.spec.head_dim // 2]
    with np.load(bundle.file("rope_table.npz")) as t:
        assert t["cos"].shape == (SEQ, m.llm.spec.head_dim // 2) and np.allclose(t["cos"][0], 1.0)
    cfg = json.loads(bundle.file("genie_config.json").read_text())
    pe = cfg["dialog"]["engine"]["model"]["positional-encoding"]
    assert pe["type"] == "rope" and pe["rope-dim"] == m.llm.spec.head_dim // 2
    assert m.llm.genie["SM8650"].dialog_created


def test_our_loop_holds_the_float_logits_as_the_position_ids_bundle_does(work, bundle):
    from transformers import AutoModelForCausalLM

    from modelexport.backends.llm_qnn.session import open_forwards
    from modelexport.core.numerics import sqnr_db
    from modelexport.llm.run.static_runner import StaticRunner
    ids = tiny_tokenizer().encode(TEXT)[:40]
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(str(work / "tiny_hf")).eval()(torch.tensor([ids])).logits[0].numpy()
    got = {}
    for b in (bundle, _compile(work, "ids")):
        runner = StaticRunner(*open_forwards(b, "htp-sim"))
        got[b.manifest.llm.positions] = np.concatenate([runner.run_chunk([t], 1).numpy() for t in ids])
    cos_sin, ids_db = sqnr_db(ref, got["cos-sin"]), sqnr_db(ref, got["ids"])
    assert cos_sin > 12 and abs(cos_sin - ids_db) < 3, (cos_sin, ids_db)   # 16a8w on this tiny model: 15-26 dB


def _genie_dump(bundle, prompt, n_new: int, folder: Path) -> list[int]:
    """Genie's greedy tokens, its debug dump (the tensors it feeds each call, its cos/sin tables) in `folder`."""
    from modelexport.backends.llm_qnn import genie_dialog
    plain = genie_dialog.bundle_config

    def with_dump(*args):
        cfg = plain(*args)
        cfg["dialog"]["debug"] = {"path": str(folder), "dump-tensors": True, "dump-start": 0, "dump-end": 2}
        return cfg
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(genie_dialog, "bundle_config", with_dump)
        return genie_dialog.genie_turns(bundle, "SM8650", [(prompt, n_new)], genie_dialog.sampler_block())[0]


def test_genie_computes_our_cos_and_sin_and_gives_our_loops_tokens(bundle, tmp_path):
    """Genie's own cos/sin tables (its debug dump) are ours to one step of the inputs' 16-bit grid: it truncates
    where the QDQ graph rounds. Our loop fed the rows as Genie quantizes them gives Genie's tokens."""
    import modelexport.llm as llm
    from modelexport.backends.llm_qnn import session
    prompt = tiny_tokenizer().encode("The quick brown fox")
    genie = _genie_dump(bundle, prompt, 24, tmp_path)
    enc = next(i.encoding for i in bundle.manifest.graphs[0].inputs if i.name == "position_ids_cos")
    scale, zero = enc.scale, enc.zero_point
    with np.load(bundle.file("rope_table.npz")) as t:
        table = {k: t[k] for k in ("cos", "sin")}
    dumped = {}
    for k, rows in table.items():
        got = np.fromfile(next(tmp_path.rglob(f"position_ids_{k}.u16.dat")), np.uint16).reshape(rows.shape)
        ours = np.clip(np.round(rows / scale) + zero, 0, 65535)
        assert np.abs(got.astype(np.int64) - ours).max() <= 1, k
        dumped[k] = ((got.astype(np.float64) - zero) * scale).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(session, "rope_table", lambda b: (dumped["cos"], dumped["sin"]))
        ours = llm.load(bundle.path, backend="htp-sim").generate(prompt, max_new_tokens=24).token_ids
    assert genie[:len(ours)] == ours, (genie, ours)


def test_the_geniex_folder_holds_the_graphs_under_the_names_geniex_matches(bundle):
    """GenieX's folder: the binary's graphs renamed `(<type>_)?ar<N>_cl<C>_<i>_of_<n>` (read back through
    libQnnSystem), metadata.json listing each graph's tensors with the caches as [kv_heads, 1, ...], the
    config and the tokenizer files beside them. GenieX's loader itself is not run here (see docs/design/genie.md)."""
    import re

    from modelexport.contract.deployment import deployment
    from modelexport.toolchain.qnn_context import read_context_binary
    m, folder = bundle.manifest, bundle.path / "SM8650" / "geniex"
    rec = m.llm.geniex["SM8650"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*rec.binaries, "metadata.json", "genie_config.json", "tokenizer.json", "tokenizer_config.json"])
    names = {g.name for b in rec.binaries for g in read_context_binary((folder / b).read_bytes()).graphs}
    assert names == set(rec.graphs) == {"prompt_ar4_cl64_1_of_1", "token_ar1_cl64_1_of_1"}
    assert all(re.fullmatch(r"(?:([a-zA-Z]+)_)?ar(\d+)_cl(\d+)_(\d+)_of_(\d+)", n) for n in names)
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["model_id"].startswith("llama_v3_")
    io = meta["model_files"]["token_ar1_cl64_1_of_1"]
    kv, hd = m.llm.spec.n_kv_heads, m.llm.spec.head_dim
    assert io["inputs"]["past_key_0_in"]["shape"] == [kv, 1, hd, SEQ - 1]
    assert io["inputs"]["position_ids_cos"]["shape"] == [1, 1, 1, hd // 2]
    cfg = json.loads((folder / "genie_config.json").read_text())
    assert cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"] == rec.binaries
    assert cfg["dialog"]["engine"]["model"]["positional-encoding"]["type"] == "rope"
    assert isinstance(json.loads((folder / "tokenizer_config.json").read_text())["chat_template"], str)
    assert any(r.runtime == "GenieX" for r in deployment(m).runtimes)


@pytest.mark.parametrize("case, flags, needle", [
    ("unknown", ["--positions", "angles"], "is not a way of taking positions"),
    ("runner", ["--positions", "cos-sin", "--executorch-program"], "qnn_llama_runner feeds position ids"),
    ("gemma3", ["--positions", "cos-sin"], "read different RoPE tables"),
    ("gemma3-gguf", ["--positions", "cos-sin"], "read different RoPE tables"),
    ("geniex-ids", ["--geniex"], "add --positions cos-sin"),
    ("geniex-3-sizes", ["--positions", "cos-sin", "--geniex", "--variants", "ar1,ar4,ar8"], "exactly two graph sizes"),
])
def test_what_one_cos_sin_pair_cannot_feed_is_refused_before_loading(work, cli_here, request, case, flags, needle):
    folder = work / "tiny_hf"
    if case == "gemma3-gguf":
        folder = request.getfixturevalue("gemma3_gguf")     # the real Gemma 3 270M file: refused from its header
    if case == "gemma3":
        folder = work / "gemma3_text"
        if not folder.exists():
            save_tiny_family_folder("gemma3_text", folder, seed=1)
    out = work / f"refused_{case}"
    proc = cli_here("compile", str(folder), "-o", str(out), "--calibration", str(work / "calib.txt"),
                    "--max-seq-len", str(SEQ), *flags)
    assert_clean_error(proc, needle)
    assert not out.exists() and "loading the model" not in proc.stdout + proc.stderr
