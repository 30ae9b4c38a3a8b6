"""`modelexport audit model.py:factory`: ExecuTorch's QNN partitioner per node, with module paths,
the backend's reasons (op lists, op-builder refusals, QNN's own validator log) and fixes."""
from __future__ import annotations

import json

import pytest

from conftest import assert_clean_error, run_cli
from et_models import TRANSFORMER, write


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    d = tmp_path_factory.mktemp("et_audit")
    spec = write(d, "block", TRANSFORMER)
    proc = run_cli("audit", spec, "--target", "SM8650", "--precision", "8a8w", "--strict", "--json",
                   env={"MODELEXPORT_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "modelexport-cache")})
    return {"spec": spec, "proc": proc, "report": json.loads(proc.stdout)}


def _nodes(rep, **match):
    return [n for n in rep["nodes"] if all(n.get(k) == v for k, v in match.items())]


def test_exact_gelu_and_the_linears_run_on_htp_with_their_module_paths(block):
    rep = block["report"]
    assert rep["backend"] == "executorch-qnn" and rep["target"] == "SM8650" and rep["htp_arch"] == 75
    gelu = _nodes(rep, op_type="aten.gelu.default")
    assert {n["module_path"] for n in gelu} == {"layers.0.mlp.act"}
    assert all(n["backend"] == "HTP" for n in gelu)          # measured: exact GELU is accepted (the seeds said no)
    linears = _nodes(rep, op_type="aten.linear.default")
    assert len(linears) == 4 and all(n["backend"] == "HTP" for n in linears)
    assert {n["module_path"] for n in linears} == {"layers.0.attn.qkv", "layers.0.attn.proj", "layers.0.mlp.fc1",
                                                   "layers.0.mlp.fc2"}
    assert rep["totals"]["macs"]["HTP"] > 0 and rep["qairt_build"].startswith("v2.51")


def test_causal_attention_mask_falls_back_with_the_reason_and_the_rewrite_as_fix(block):
    cpu = [n for n in block["report"]["nodes"] if n["backend"] == "CPU"]
    assert cpu and {n["op_type"] for n in cpu} == {"aten.le.Scalar"}
    n = cpu[0]
    assert n["module_path"] == "layers.0.attn"
    assert "to_be_implemented" in n["reason"] and n["details"]["reason_kind"] == "to_be_implemented"
    assert "--rewrite causal-mask" in n["fix"]


def test_the_partition_qnn_refuses_is_named_then_the_rewrite_puts_every_node_on_htp(block, cli_here):
    """The mask's constant part, cut off by the CPU le.Scalar, makes a QNN partition without inputs that
    QNN refuses to build (compile fails the same way): the audit names it, exit 2, before --strict's 3."""
    proc = block["proc"]          # --strict --json: the report on stdout, then the error
    assert_clean_error(proc, "QNN refused to build the graph at 8a8w", "No graph inputs present", "--rewrite causal-mask")
    assert proc.returncode == 2
    [b] = [n for n in block["report"]["nodes"] if n["backend"] == "blocks"]
    assert b["details"]["located_by"] == "bisect" and b["details"]["partitions"] == 2
    ok = cli_here("audit", block["spec"], "--target", "SM8650", "--precision", "fp16", "--rewrite", "causal-mask",
                  "--strict", "--json", check=True)
    rep = json.loads(ok.stdout)
    assert rep["ok"] and rep["totals"]["by_backend"].get("CPU", 0) == 0
    assert any("rewrite causal-mask: 1 node(s) changed" in note for note in rep["notes"])


def test_validator_refusal_is_reported_in_qnn_own_words():
    """A dynamic sequence length: QNN's validator (backendValidateOpConfig) refuses, and its log is the reason."""
    import torch

    import modelexport
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    seq = torch.export.Dim("seq", min=2, max=64)
    rep = modelexport.audit(m, (torch.randn(1, 8, 16),), target="SM8650", precision="fp16", dynamic_shapes=({1: seq},))
    lin = next(n for n in rep.nodes if n.op_type == "aten.linear.default")
    assert lin.backend == "CPU" and lin.details["reason_kind"] == "validator_refused"
    assert "static dimensions" in lin.reason and "3110" in lin.reason
    assert "static shapes" in lin.fix and lin.module_path == "0"


def test_unknown_rewrite_is_refused_before_any_work(block):
    import modelexport
    from modelexport.core.errors import InputError
    with pytest.raises(InputError) as e:
        modelexport.audit(block["spec"], rewrites=["no-such-pass"])
    assert "unknown rewrite pass 'no-such-pass'" in e.value.problem and "causal-mask" in e.value.fix
    assert callable(modelexport.audit)   # still the API function once `modelexport.auditing` is imported
