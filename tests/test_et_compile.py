"""PyTorch → .pte through modelexport (Python API and CLI): quantization schemes and overrides,
QNN + fallback placement, inspect, run and verify on the host, and the bad inputs."""
from __future__ import annotations

import json
import numpy as np
import pytest

from conftest import assert_clean_error, run_cli
from et_models import DATA_DEPENDENT, MLP, MLP_TOPK, write


@pytest.fixture(scope="module")
def topk_fp16(tmp_path_factory):
    """An MLP + a topk head (refused by QNN's op builder) compiled through the Python API, fp16."""
    import importlib.util

    import modelexport
    d = tmp_path_factory.mktemp("et_compile")
    spec = write(d, "mlp_topk", MLP_TOPK)
    loader = importlib.util.spec_from_file_location("mlp_topk", d / "mlp_topk.py")
    mod = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(mod)
    model, example = mod.build()
    with pytest.MonkeyPatch.context() as mp:   # conftest's cache folder (module fixtures run before its fixture)
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        bundle = modelexport.compile(model, example, output=d / "bundle", target="SM8650", precision="fp16")
    return {"dir": d, "spec": spec, "model": model, "example": example, "bundle": bundle}


def test_api_compiles_a_module_to_a_pte_bundle_with_placement_per_node(topk_fp16):
    m = topk_fp16["bundle"].manifest
    assert m.format == "pte" and m.targets == ["SM8650"] and m.htp_arch == {"SM8650": 75}
    assert m.qairt_build.startswith("v2.51") and m.options["segment_alignment"] == 16384
    nodes = {n["op_type"]: n for n in m.placement["nodes"]}
    assert nodes["aten.linear.default"]["backend"] == "HTP" and nodes["aten.gelu.default"]["runtime"] == "QNN"
    topk = nodes["aten.topk.default"]
    assert topk["backend"] == "CPU" and topk["runtime"] in ("XNNPACK", "portable") and topk["module_path"] == "head"
    assert "only supports channel as dimension for topK" in topk["reason"]
    g = m.graphs[0]
    assert g.kind == "pte-method" and g.inputs[0].name == "x" and g.delegate_calls == {"QnnBackend": 1}
    assert g.qnn_graphs and all(d.alignment % 16384 == 0 for d in g.delegates)
    assert m.numerics["passed"] and m.numerics["outputs"][0]["sqnr_db"] > 30


def test_run_and_verify_on_the_host_match_eager(topk_fp16, cli_here):
    import torch

    import modelexport
    model, example, bundle = topk_fp16["model"], topk_fp16["example"], topk_fp16["bundle"]
    x = torch.randn(1, 16, 32)
    got = modelexport.run(bundle.path, {"x": x.numpy()}).outputs["output_0"]
    np.testing.assert_allclose(got, model(x).detach().numpy(), atol=2e-2)
    one = modelexport.run(bundle.path, inputs=x.numpy()).outputs["output_0"]   # one array for a one-input model
    np.testing.assert_array_equal(one, got)
    res = modelexport.run(bundle.path, random=True, repeat=2)
    assert res.outputs["output_0"].shape == (1, 4, 32) and len(res.run_seconds) == 2
    rep = json.loads(cli_here("verify", str(bundle.path), "--json", check=True).stdout)
    assert rep["passed"] and rep["graphs"][0]["outputs"][0]["sqnr_db"] > 35 and rep["graphs"][0]["threshold_sqnr_db"] == 35


def test_inspect_reads_the_pte_through_the_flatbuffer_schema(topk_fp16, cli_here):
    import modelexport
    pte = next(topk_fp16["bundle"].path.rglob("*.pte"))
    info = modelexport.inspect(pte)
    assert info["kind"] == "pte"
    p = info["pte"]
    (method,) = p["methods"]
    assert method["name"] == "forward" and method["inputs"] == [{"kind": "Tensor", "dtype": "float32", "shape": [1, 16, 32]}]
    assert method["delegate_calls"] == {"QnnBackend": 1} and "aten::topk.values" in method["kernel_calls"]
    qnn = [d for d in p["delegates"] if d["backend_id"] == "QnnBackend"]
    assert len(qnn) == 1 and all(d["location"] == "segment" and d["offset"] % 16384 == 0 for d in qnn)
    cb = qnn[0]["qnn"]["context_binary"]
    assert cb["soc_model"] == 57 and cb["dsp_arch"] == 75 and cb["build_id"].startswith("v2.51")
    bundle = modelexport.inspect(topk_fp16["bundle"].path)
    assert bundle["kind"] == "pte-bundle" and bundle["integrity"]["ok"]
    assert bundle["placement_summary"]["by_runtime"]["QNN"] >= 3
    shown = cli_here("inspect", str(topk_fp16["bundle"].path), check=True).stdout   # the terminal rendering
    assert "QnnBackend" in shown and "SM8650" in shown and "integrity OK" in shown


def test_our_protocol_reader_agrees_with_executorchs(topk_fp16):
    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.backends.executorch_qnn.inspect import qnn_binaries
    qnn_ready()
    import executorch.backends.qualcomm.python.PyQnnManagerAdaptor as PyQnnManagerAdaptor
    from executorch.exir._serialize._program import deserialize_pte_binary
    data = next(topk_fp16["bundle"].path.rglob("*.pte")).read_bytes()
    program = deserialize_pte_binary(data).program
    theirs = [PyQnnManagerAdaptor.StripProtocol(program.backend_delegate_data[d.processed.index].data).tobytes()
              for plan in program.execution_plan for d in plan.delegates if d.id == "QnnBackend"]
    assert [b for _, b in qnn_binaries(data)] == theirs


def test_recompiling_the_same_model_hits_the_cache_and_writes_the_same_pte(topk_fp16, tmp_path):
    """The fixture's compile filled conftest's session cache; the same model from its model.py file,
    same options, is a hit (no lowering) and the .pte is byte for byte the same."""
    import hashlib

    import modelexport
    again = modelexport.compile(topk_fp16["spec"], output=tmp_path / "again", target="SM8650", precision="fp16")
    first = topk_fp16["bundle"].manifest.cache
    assert first.hits == 0 and first.misses == 1 and first.root == again.manifest.cache.root
    assert again.manifest.cache.model_dump(exclude_none=True) | {"root": None} == {"enabled": True, "root": None, "hits": 1,
                                                                                  "misses": 0}
    assert again.manifest.parts[0].cache_hit == {"SM8650": True}

    def sha(b):
        (pte,) = b.path.rglob("*.pte")          # <part>/SM8650/<part>.pte; the part's name differs (file vs class)
        return pte.parent.name, hashlib.sha256(pte.read_bytes()).hexdigest()
    assert sha(again) == sha(topk_fp16["bundle"])
    assert again.manifest.placement["nodes"] == topk_fp16["bundle"].manifest.placement["nodes"]


def test_qnn_setup_prints_nothing_on_stdout():
    """libQnnHtp.so prints a "LIBNATIVE ..." banner on fd 1 when it loads: ensure_executorch_qnn()
    sends it to stderr, so `--json` output and a user's own stdout stay clean (fresh process: the
    libraries load once per process)."""
    import os
    import subprocess
    import sys
    code = ("from modelexport.toolchain.executorch_env import ensure_executorch_qnn\n"
            "s = ensure_executorch_qnn()\n"
            "import sys; print(s.mode, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=os.environ)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "", proc.stdout
    assert {"adapter", "direct"} & {line.strip() for line in proc.stderr.splitlines()}, proc.stderr


def test_strict_refuses_the_fallback_and_writes_nothing(topk_fp16, cli_here, tmp_path):
    out = tmp_path / "strict"
    proc = cli_here("compile", topk_fp16["spec"], "--precision", "fp16", "--strict", "-o", str(out))
    assert_clean_error(proc, "--strict", "aten_topk_default")
    assert proc.returncode == 3 and not out.exists() and not list(tmp_path.glob(".strict*"))


def test_cli_8a8w_with_an_override_and_block_quantization(tmp_path, cli_here):
    spec = write(tmp_path, "mlp", MLP)
    out = tmp_path / "b"
    proc = cli_here("compile", spec, "--precision", "16a4w_block", "--block-size", "16", "--override", r"fc2=16a8w",
                    "--calibration", "random", "--format", "pte", "-o", str(out), "--json", check=True)
    res = json.loads(proc.stdout)        # the whole of stdout is the JSON result: no native banner before it
    assert "LIBNATIVE" not in proc.stdout
    assert res["format"] == "pte" and res["placement"]["summary"]["by_runtime"] == {"QNN": res["placement"]["summary"]["nodes"]}
    m = json.loads((out / "manifest.json").read_text())
    q = m["options"]["quantization"]["mlp"]
    assert q["precision"] == "16a4w_block" and q["block_size"] == 16 and q["block_quantized_nodes"] == 1
    assert q["overrides"] == [{"regex": "fc2", "precision": "16a8w", "nodes": 1}]
    assert m["calibration"]["mlp"]["representative"] is False
    assert m["numerics"]["outputs"][0]["sqnr_db"] > 12      # measured ~20 dB (linear as conv2d for LPBQ)


def test_block_quantization_below_v69_is_refused_up_front(tmp_path, cli_here):
    spec = write(tmp_path, "mlp", MLP)
    proc = cli_here("compile", spec, "--precision", "16a4w_block", "--target", "SM8350", "--calibration", "random",
                    "-o", str(tmp_path / "out"))
    assert_clean_error(proc, "16a4w_block", "V69", "SM8350")
    assert not (tmp_path / "out").exists()


def test_a_module_export_cannot_capture_names_the_module_and_the_reason(tmp_path, cli_here):
    spec = write(tmp_path, "gate", DATA_DEPENDENT)
    proc = cli_here("compile", spec, "--precision", "fp16", "-o", str(tmp_path / "out"))
    assert_clean_error(proc, "torch.export cannot capture", "blocks.1", "data-dependent", "Gate.forward", "if x.sum() > 0")
    assert not (tmp_path / "out").exists()
    import modelexport
    from modelexport.core.errors import InputError
    with pytest.raises(InputError, match=r"blocks\.1.*data-dependent"):
        modelexport.audit(spec)


def test_missing_gcc_is_a_clear_message(tmp_path):
    """A fresh adapter cache and no compiler on PATH: the adapter cannot be built."""
    spec = write(tmp_path, "mlp", MLP)
    env = {"MODELEXPORT_CACHE_DIR": str(tmp_path / "cache"), "PATH": str(tmp_path / "empty-bin"), "CC": ""}
    (tmp_path / "empty-bin").mkdir()
    proc = run_cli("compile", spec, "--precision", "fp16", "-o", str(tmp_path / "out"), env=env)
    assert_clean_error(proc, "gcc", "apt-get install gcc")
    assert not (tmp_path / "out").exists()


def test_pytorch_only_options_and_formats_are_checked(tmp_path):
    import modelexport
    from modelexport.core.errors import InputError
    spec = write(tmp_path, "mlp", MLP)
    with pytest.raises(InputError, match="PyTorch models compile to: pte"):
        modelexport.compile(spec, output=tmp_path / "o", output_format="context-binary")
    with pytest.raises(InputError, match="REGEX=PRECISION"):
        modelexport.compile(spec, output=tmp_path / "o", overrides=["fc2"])
    with pytest.raises(InputError, match="unknown rewrite pass"):
        modelexport.compile(spec, output=tmp_path / "o", rewrites=["gelu-tanh"])
    assert not (tmp_path / "o").exists()


def test_dynamic_shapes_are_refused_before_any_work(tmp_path):
    import torch

    import modelexport
    from modelexport.core.errors import UnsupportedError
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    seq = torch.export.Dim("seq", min=2, max=64)
    with pytest.raises(UnsupportedError, match="static shapes") as e:
        modelexport.compile(m, (torch.randn(1, 8, 16),), output=tmp_path / "o", precision="fp16", dynamic_shapes=({1: seq},))
    assert "one program per shape" in e.value.fix and not (tmp_path / "o").exists()


def test_fp16_folds_batch_norms_into_convolutions():
    """Measured: left as its own HTP op in fp16, BatchNorm cost MobileNetV2 its accuracy (2.5 dB); folded, 47 dB."""
    import torch

    from modelexport.backends.executorch_qnn.pipeline import prepare
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
                            torch.nn.Conv2d(8, 8, 3, groups=8), torch.nn.BatchNorm2d(8)).eval()
    for bn in (m[1], m[4]):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 16, 16)
    prep = prepare(m, (x,), "SM8650", "fp16")
    gm = prep.lowerable()
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("batch_norm" in o for o in ops), ops
    torch.testing.assert_close(gm(x), m(x), rtol=1e-4, atol=1e-4)
    assert any("batch_norm" in str(n.target) for n in prep.exported.graph.nodes)   # the verify reference is untouched
