"""Opt-in rewrite passes: each moves a node the HTP validator refuses (docs/op_support.md) onto the
HTP, and leaves the model's outputs unchanged."""
from __future__ import annotations

from pathlib import Path

import pytest

from modelexport.passes import all_passes, apply_rewrites


def _attention():
    import torch

    class Causal(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return Causal().eval(), tuple(torch.randn(1, 2, 8, 16) for _ in range(3)), "aten.le.Scalar"


def _topk_dim1():
    import torch

    class TopK(torch.nn.Module):
        def forward(self, x):
            values, indices = torch.topk(x, 3, dim=1)
            return values, indices.float()
    return TopK().eval(), (torch.randn(1, 8, 16),), "aten.topk.default"


CASES = {"causal-mask": _attention, "topk-last-dim": _topk_dim1}


def test_every_pass_file_registers_one_pass_with_a_test_case():
    files = {p.stem.replace("_", "-") for p in (Path(__file__).parents[1] / "src/modelexport/passes").glob("*.py")
             if p.stem != "__init__"}
    assert {p.name for p in all_passes()} == files == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_refused_node_moves_to_htp_and_outputs_do_not_change(name):
    import torch

    from modelexport.backends.executorch_qnn.audit import audit_torch
    module, example, refused_op = CASES[name]()
    before = audit_torch(module, "SM8650", "fp16", example_inputs=example)
    assert [n.op_type for n in before.fallbacks] == [refused_op]
    assert f"--rewrite {name}" in before.fallbacks[0].fix
    after = audit_torch(module, "SM8650", "fp16", example_inputs=example, rewrites=[name])
    assert after.ok and not after.fallbacks, [(n.op_type, n.reason) for n in after.fallbacks]

    gm = torch.export.export(module, example).module()
    done = apply_rewrites(gm, [name])
    assert done == [{"name": name, "nodes_rewritten": 1, "changes_numerics": False}]
    want, got = module(*example), gm(*example)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
