"""`compile LLM --executorch-program`: the bundle's own context binaries as the ExecuTorch program
qnn_llama_runner runs, checked through ExecuTorch's runtime on the simulator (host twins)."""
from __future__ import annotations

import numpy as np
import pytest

from llm_tiny import tiny_tokenizer, write_tiny_llm_folder

SEQ = 64


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("pte_runner")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        yield write_tiny_llm_folder(root)


def _compile(work, out, **kw):
    import modelexport
    return modelexport.compile(str(work / "tiny_hf"), output=work / out, target="SM8650", precision="16a4w",
                               variants="ar1,ar4", max_seq_len=SEQ, calibration=str(work / "calib.txt"),
                               calibration_samples=4, executorch_program=True, **kw)


@pytest.fixture(scope="module")
def bundle(work):
    return _compile(work, "bundle")


def _program(path):
    import torch  # noqa: F401
    from modelexport.backends.executorch_qnn.specs import qnn_ready
    qnn_ready()
    from executorch.runtime import Runtime
    return Runtime.get().load_program(str(path))


def test_methods_and_io_are_the_runners(bundle):
    """What qnn_llama_runner reads from the program (runner.cpp, token_generator.cpp, kv_manager.cpp)."""
    e = bundle.manifest.llm.executorch["SM8650"]
    prog = _program(bundle.file(e.host_twin))
    assert {"kv_forward", "prefill_forward", "get_n_layers"} <= set(prog.method_names)
    assert int(prog.load_method("get_n_layers").execute([])[0]) == 2
    for method, ar in (("kv_forward", 1), ("prefill_forward", 4)):
        meta = prog.metadata(method)
        ins = [meta.input_tensor_meta(i) for i in range(meta.num_inputs())]
        outs = [meta.output_tensor_meta(i) for i in range(meta.num_outputs())]
        assert [tuple(t.sizes()) for t in ins] == [(1, ar), (1, 1, ar, SEQ), (1, ar)] + [(1, 2, 16, SEQ - ar)] * 2 \
            + [(1, 2, SEQ - ar, 16)] * 2
        assert [tuple(t.sizes()) for t in outs] == [(1, ar, 260)] + [(1, 2, 16, ar)] * 2 + [(1, 2, ar, 16)] * 2
        int32, float32, uint16 = 3, 6, 27            # ExecuTorch's ScalarType codes
        assert [t.dtype() for t in ins[:3]] == [int32, float32, int32]
        assert {t.dtype() for t in ins[3:] + outs} == {uint16}


def test_the_runners_loop_gives_the_bundles_tokens(bundle):
    from modelexport.backends.llm_qnn.executorch_runner import RunnerLoop, _reference
    e = bundle.manifest.llm.executorch["SM8650"]
    assert e.check["same_tokens"] and e.check["worst_logits_sqnr_db"] > 100, e.check
    # compile's check replays the numerics check's calls (ar4 then ar1): every row's argmax is compared
    assert e.check["scope"].startswith("the compile check's calls again") and e.check["steps"] == 2
    assert len(e.check["tokens"]) == 5 and bundle.manifest.numerics["calls"] == ["ar4_cl64", "ar1_cl64"]
    ids = tiny_tokenizer().encode("Markets rose on Tuesday as investors weighed")[:20]   # another prompt
    ours = RunnerLoop(bundle.file(e.host_twin)).generate(ids, 6)
    ref = _reference(bundle, "SM8650", ids, 6)
    assert ours.tokens == ref.tokens
    assert ours.methods == ["prefill_forward"] * 5 + ["kv_forward"] * 5


def test_the_phones_program_holds_the_shared_binary_once(bundle):
    from modelexport.backends.executorch_qnn.inspect import read_pte
    e = bundle.manifest.llm.executorch["SM8650"]
    assert e.binaries_stored == 1 and e.bytes < e.host_twin_bytes
    info = read_pte(bundle.file(e.file).read_bytes())
    segments = {d["segment"] for d in info["delegates"] if d.get("qnn")}
    assert len(segments) == 1
    shared = bundle.manifest.llm.weight_sharing["SM8650/1"]
    assert abs(e.binary_bytes - shared.bytes) < 4096         # the bundle's binary, a header added


def test_a_programs_build_leaves_nothing_of_it_held(bundle, tmp_path):
    """ExecuTorch's is_same_node lru_cache and torch's FakeTensor dispatch cache held every lowered graph,
    and the context binaries in its nodes, for the life of the process (2.2 GB after a 1B model's build)."""
    from executorch.exir.backend.utils import is_same_node
    from torch._subclasses.fake_tensor import FakeTensorMode
    from modelexport.backends.executorch_qnn.from_binaries import build_program
    from modelexport.backends.llm_qnn.executorch_runner import method_plans, program_constants
    from modelexport.core.targets import get_target
    plans = method_plans(bundle, "SM8650", True, tmp_path)
    assert build_program(plans, get_target("SM8650"), tmp_path / "p.pte", program_constants(bundle.manifest)) > 0
    assert is_same_node.cache_info().currsize == 0 and FakeTensorMode.cache_info().size == 0


def test_parts_are_chained_in_one_method(work):
    b = _compile(work, "split", context_limit_mb=0.06)
    e = b.manifest.llm.executorch["SM8650"]
    assert b.manifest.llm.n_parts == 2 and e.binaries_stored == 2
    assert e.check["same_tokens"] and e.check["worst_logits_sqnr_db"] > 100


def test_rename_writes_in_place_and_refuses_what_it_cannot(bundle):
    from modelexport.core.errors import InputError
    from modelexport.toolchain.qnn_context import read_context_binary
    from modelexport.toolchain.qnn_context.rename import rename_graphs
    blob = bundle.file(bundle.manifest.llm.weight_sharing["SM8650/1"].file).read_bytes()
    names = [g.name for g in read_context_binary(blob).graphs]
    out = rename_graphs(blob, {names[0]: "kv_forward"})
    assert len(out) == len(blob) and sorted(g.name for g in read_context_binary(out).graphs) == sorted(["kv_forward", names[1]])
    assert np.count_nonzero(np.frombuffer(out, np.uint8) != np.frombuffer(blob, np.uint8)) < 4 * len(names[0]) + 16
    with pytest.raises(InputError, match="at most"):
        rename_graphs(blob, {names[0]: "x" * (len(names[0]) + 1)})
    with pytest.raises(InputError, match="no graph"):
        rename_graphs(blob, {"kv_forward": "prefill_forward"})


def test_refused_for_embeddings_input_before_any_work(work):
    from modelexport.core.errors import UnsupportedError
    with pytest.raises(UnsupportedError, match="token ids"):
        _compile(work, "emb", inputs="embeddings")
    assert not (work / "emb").exists()


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3"])
def test_families_the_runner_names(work, family):
    """Gemma 3 (sliding-window layers: the graphs apply the window from the positions, so the program
    defines no get_sliding_window and the runner feeds one mask) and Qwen3 (q/k norms)."""
    import modelexport
    from llm_tiny_families import save_tiny_family_folder
    folder = work / f"{family}_hf"
    save_tiny_family_folder(family, folder)
    b = modelexport.compile(str(folder), output=work / f"{family}_bundle", target="SM8650", precision="16a8w",
                            variants="ar1,ar4", max_seq_len=32, calibration=str(work / "calib.txt"),
                            calibration_samples=4, executorch_program=True)
    e = b.manifest.llm.executorch["SM8650"]
    assert "get_sliding_window" not in e.methods
    assert e.check["same_tokens"] and e.check["worst_logits_sqnr_db"] > 100, e.check


def test_the_deploy_view_gives_the_runners_command(bundle):
    """The tiny tokenizer has none of the end-of-turn tokens: a Llama-architecture model without them is llama2."""
    from modelexport.contract.deployment import deployment
    e = bundle.manifest.llm.executorch["SM8650"]
    assert e.decoder_model_version == "llama2" and e.eos_ids == [257]
    et = [r for r in deployment(bundle.manifest).runtimes if r.runtime.startswith("ExecuTorch")]
    assert et and e.file in et[0].files and "tokenizer/tokenizer.json" in et[0].files
    assert f"--decoder_model_version llama2 --eval_mode 1 --seq_len {SEQ}" in et[0].needs


@pytest.mark.parametrize("architecture, tokens, version", [
    ("llama", ["<|eot_id|>"], "llama3"), ("llama", ["<|im_end|>"], "smollm2_135m"), ("llama", [], "llama2"),
    ("qwen2", [], "qwen2_5"), ("gemma3_text", [], "gemma3"), ("phi3", [], "phi_4_mini")])
def test_runner_versions(architecture, tokens, version):
    from modelexport.backends.llm_qnn.executorch_runner import runner_version

    class Tok:
        def token_to_id(self, t):
            return 1 if t in tokens else None
    assert runner_version(architecture, Tok()) == version


def test_a_large_model_is_checked_with_one_decode_step(work, monkeypatch):
    from modelexport.backends.llm_qnn import executorch_runner
    monkeypatch.setattr(executorch_runner, "FULL_CHECK_MAX_PARAMS", 0)
    e = _compile(work, "large").manifest.llm.executorch["SM8650"]
    assert e.check["scope"].startswith("kv_forward on the 1 token(s) after the compile check's prefill call")
    assert e.check["steps"] == 1 and e.check["same_tokens"] and e.check["worst_logits_sqnr_db"] > 100


def test_without_the_numerics_checks_run_the_program_is_checked_against_its_own_loop(bundle):
    """No replay (the compile's check did not run): the runner's greedy loop against the bundle's."""
    from modelexport.backends.llm_qnn.executorch_runner import CHECK_NEW_TOKENS, RunnerCheck
    e = bundle.manifest.llm.executorch["SM8650"]
    check = RunnerCheck.run(bundle, bundle.file(e.host_twin), "SM8650", tiny_tokenizer(), [], None)
    assert check.scope.startswith("hybrid mode") and len(check.tokens) == CHECK_NEW_TOKENS
    assert check.tokens == check.reference_tokens and check.worst_sqnr_db > 100


def test_format_pte_is_the_bundle_with_the_runners_program(work):
    """`output_format="pte"` of an LLM is `executorch_program=True`: the context-binary bundle with the program."""
    import modelexport
    b = modelexport.compile(str(work / "tiny_hf"), output=work / "format_pte", target="SM8650", precision="16a4w",
                            variants="ar1,ar4", max_seq_len=SEQ, calibration=str(work / "calib.txt"),
                            calibration_samples=4, output_format="pte")
    assert b.manifest.format == "context-binary" and b.manifest.kind == "llm"
    e = b.manifest.llm.executorch["SM8650"]
    assert b.file(e.file).is_file() and e.file.startswith("SM8650/executorch/")
    assert e.check["same_tokens"] and e.check["worst_logits_sqnr_db"] > 100, e.check


def test_format_pte_on_the_command_line(work, cli):
    from modelexport.contract import open_bundle
    out = work / "format_pte_cli"
    cli("compile", str(work / "tiny_hf"), "--format", "pte", "-t", "SM8650", "-p", "16a4w", "--variants", "ar1,ar4",
        "--max-seq-len", str(SEQ), "-c", str(work / "calib.txt"), "--calibration-samples", "4", "-o", str(out), check=True)
    m = open_bundle(out).manifest
    assert m.format == "context-binary" and m.llm.executorch["SM8650"].check["same_tokens"]


def test_the_checks_run_beside_the_shared_binaries_compile_and_agree(work, bundle):
    """The host twins cached, the weight-shared binary not: the numerics check and the twin program are
    built and checked from the twins while the shared binary compiles, and give what the bundle built
    after the compile gave."""
    import os
    import shutil
    from pathlib import Path
    from modelexport.backends.llm_qnn.ctx_jobs import SHARED_NAMESPACE
    shutil.rmtree(Path(os.environ["MODELEXPORT_CACHE_DIR"]) / SHARED_NAMESPACE)
    b = _compile(work, "beside")
    m, before = b.manifest, bundle.manifest
    assert m.timings.model_extra["beside_compile_s"] > 0          # some of it while the compile still ran
    assert m.numerics["passed"] and m.numerics["outputs"] == before.numerics["outputs"]
    e, e0 = m.llm.executorch["SM8650"], before.llm.executorch["SM8650"]
    assert e.check["scope"] == e0.check["scope"] and e.check["same_tokens"] and e.check["worst_logits_sqnr_db"] > 100
    assert e.bytes == e0.bytes and e.methods == e0.methods and e.binaries_stored == 1
