"""A weight computed in forward by a parametrization (weight_norm, as Wav2Vec2's positional conv)
broke ExecuTorch's QNN passes before any node was placed; the frontend bakes it into a copy."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import modelexport
from modelexport.core.errors import ModelExportError
from modelexport.frontends import torch_module


class WeightNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 3, padding=1), name="weight", dim=2)

    def forward(self, x):
        return torch.relu(self.conv(x))


def test_weight_norm_is_baked_into_a_copy_and_runs_on_the_htp(tmp_path):
    torch.manual_seed(0)
    m, x = WeightNormed().eval(), torch.randn(1, 8, 32)
    b = modelexport.compile(m, (x,), output=tmp_path / "b", target="SM8650", precision="fp16")
    assert b.manifest.placement["summary"]["htp_share"] == 1.0
    assert modelexport.verify(b.path).passed
    assert nn.utils.parametrize.is_parametrized(m.conv)        # the user's module is untouched
    assert torch.equal(m(x), m(x)) and m.conv.weight.shape == (8, 8, 3)
    again = modelexport.compile(m, (x,), output=tmp_path / "again", target="SM8650", precision="fp16", use_cache=False)
    assert again.manifest.placement["summary"]["htp_share"] == 1.0   # and can be compiled again


def test_without_the_bake_the_qnn_passes_refuse_it(tmp_path, monkeypatch):
    """What the bake is for: the same model with its parametrization left in place fails to lower."""
    monkeypatch.setattr(torch_module, "without_parametrizations", lambda loaded: loaded)
    m, x = WeightNormed().eval(), torch.randn(1, 8, 32)
    with pytest.raises(ModelExportError):
        modelexport.compile(m, (x,), output=tmp_path / "b", target="SM8650", precision="fp16")
