"""A PyTorch model whose ops QNN's partitioner accepts one by one but whose partition QNN then
fails to build: the audit names the op, its module and its partition, with a fix that works.

Real behaviour: torch.nn.MultiheadAttention at fp16 passes the partitioner, then QNN's graph
prepare fails (`genNopWithScaleParamsFP16 ... mismatched scale and bias dimensions`) on the
packed q|k|v projection reshaped for the heads; at 8a8w it lowers.
"""
from __future__ import annotations

import pytest

from conftest import assert_clean_error
from et_models import write

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MHA = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(16, 32)
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x):
        h = self.pre(x)
        return self.mha(h, h, h, need_weights=False)[0]


def build():
    torch.manual_seed(0)
    return Model().eval(), (torch.randn(1, 8, 16),)
'''


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return write(tmp_path_factory.mktemp("et_locate"), "mha", MHA)


@pytest.fixture(scope="module")
def fp16_audit(spec, tmp_path_factory):
    import modelexport
    log = tmp_path_factory.mktemp("et_locate_log") / "audit.log"
    return modelexport.audit(spec, precision="fp16", log_path=log), log


def test_fp16_attention_audit_names_the_op_and_partition_qnn_fails(fp16_audit):
    rep, log = fp16_audit
    assert rep.refused and "mismatched scale and bias dimensions" in rep.refused and not rep.ok
    [b] = rep.blockers
    assert b.backend == "blocks" and b.module_path == "mha"
    assert b.details["located_by"] == "bisect" and b.details["partitions"] == 1 and "mha" in b.details["partition_modules"]
    assert "aten.linear.default (mha)" in b.reason          # the packed q|k|v projection feeding it
    assert "QNN partition 1 of 1" in b.reason and "genNopWithScaleParamsFP16" in b.reason
    assert "--precision 8a8w" in b.fix and "calibrat" not in b.fix
    assert "genNopWithScaleParamsFP16" in log.read_text()   # the real lowering's log is kept


def test_the_fix_works_at_8a8w(spec):
    import modelexport
    rep = modelexport.audit(spec, precision="8a8w")
    assert rep.ok and not rep.refused


def test_compile_failure_points_to_the_audit_that_names_the_op(spec, tmp_path, cli_here):
    proc = cli_here("compile", spec, "-p", "fp16", "-o", str(tmp_path / "out"))
    assert_clean_error(proc, "genNopWithScaleParamsFP16", "fix: run `modelexport audit`")
    assert not (tmp_path / "out").exists()


def test_bisection_finds_the_first_op_that_breaks_the_lowering():
    """The search itself, over a stand-in for the lowering (the real one is exercised above)."""
    from modelexport.backends.executorch_qnn.locate import bisect_lowering
    ops = [f"op{i}" for i in range(13)]

    def fails(skip):   # the lowering breaks once op7 is delegated
        return "QNN said no" if "op7" not in skip else None
    i, said, runs = bisect_lowering(ops, fails)
    assert ops[i] == "op7" and said == "QNN said no" and runs <= 5
    i, said, runs = bisect_lowering(ops, fails, known="seen")   # the whole graph's failure already known
    assert ops[i] == "op7" and runs <= 4
    assert bisect_lowering(ops, lambda skip: None) is None
