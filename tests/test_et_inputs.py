"""PyTorch inputs as users write them: nested example inputs (an LSTM's `(x, (h0, c0))`, as
ExecuTorch's examples/models/lstm builds it), calibration as ExecuTorch's docs write it (a list of
input tuples), and a module that writes a buffer (a state) in forward."""
from __future__ import annotations

import numpy as np
import pytest

import modelexport
from modelexport.core.errors import InputError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _lstm():
    """ExecuTorch's examples/models/lstm (torch.nn.quantizable LSTM 10 → 20, 2 layers), on 2 time
    steps instead of 5: the unrolled cells cost compile time, the nested input tuple is what is tested."""
    import torch
    from torch.nn.quantizable.modules import rnn
    torch.manual_seed(0)
    return rnn.LSTM(10, 20, 2).eval(), (torch.randn(2, 3, 10), (torch.randn(2, 3, 20), torch.randn(2, 3, 20)))


def _state_module():
    """A running state written in forward (`self.state.copy_(...)`), KV-cache style."""
    import torch

    class Running(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("state", torch.linspace(-1, 1, 8)[None])  # not zero: its initial value is kept

        def forward(self, x):
            self.state.copy_(self.state * 0.5 + self.lin(x))
            return self.state * 2 + x
    torch.manual_seed(0)
    return Running().eval(), (torch.randn(1, 8),)


@pytest.fixture(scope="module")
def lstm_fp16(tmp_path_factory):
    d = tmp_path_factory.mktemp("lstm")
    model, example = _lstm()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        bundle = modelexport.compile(model, example, output=d / "bundle", precision="fp16")
    return bundle, example


def test_nested_lstm_inputs_are_flattened_with_their_names_and_run_on_the_htp(lstm_fp16):
    bundle, _ = lstm_fp16
    m = bundle.manifest
    assert [i.name for i in m.parts[0].inputs] == ["x", "hidden_0", "hidden_1"]
    assert [t.name for t in m.graphs[0].inputs] == ["x", "hidden_0", "hidden_1"]
    assert m.options["flattened_inputs"]["lstm"] == ["x", "hidden_0", "hidden_1"]
    assert m.placement["summary"]["htp_share"] == 1.0
    assert m.numerics["passed"] and len(m.numerics["outputs"]) == 3      # y, (h_n, c_n) flattened


def test_run_and_verify_take_the_flattened_names(lstm_fp16):
    bundle, (x, (h, c)) = lstm_fp16
    feed = {"x": x.numpy(), "hidden_0": h.numpy(), "hidden_1": c.numpy()}
    res = modelexport.run(bundle.path, inputs=feed)
    assert len(res.outputs) == 3
    assert modelexport.verify(bundle.path, inputs=feed).passed
    files = []
    for name, arr in feed.items():                         # the CLI's --input NAME=path.npy
        np.save(bundle.path.parent / f"{name}.npy", arr)
        files.append(f"{name}={bundle.path.parent / f'{name}.npy'}")
    assert modelexport.verify(bundle.path, inputs=files).passed
    with pytest.raises(InputError, match="missing input"):
        modelexport.run(bundle.path, inputs={"x": x.numpy()})


def test_calibration_as_a_list_of_input_tuples_like_executorchs_docs(tmp_path):
    import torch
    model, example = _lstm()
    calib = [(torch.randn(2, 3, 10), (torch.randn(2, 3, 20), torch.randn(2, 3, 20))) for _ in range(3)]
    b = modelexport.compile(model, example, output=tmp_path / "q", precision="8a8w", calibration=calib)
    assert b.manifest.calibration["lstm"]["kind"] == "tuples" and b.manifest.calibration["lstm"]["samples"] == 3
    assert b.manifest.placement["summary"]["htp_share"] == 1.0


def test_a_module_writing_a_buffer_keeps_the_write_out_of_the_delegate_and_verifies(tmp_path):
    model, example = _state_module()
    b = modelexport.compile(model, example, output=tmp_path / "s", precision="fp16")
    assert b.manifest.options["mutable_buffers"] == {"running": ["state"]}
    assert b.manifest.numerics["passed"]                    # was -97 dB, silently, with the write delegated
    assert modelexport.verify(b.path).passed
    assert model.state[0, 0] == -1                          # the user's module is left as it was


def test_calibration_mistakes_on_a_torch_model_are_one_clear_message(tmp_path):
    import torch
    model, example = _lstm()
    with pytest.raises(InputError) as e:
        modelexport.compile(model, example, output=tmp_path / "bad", precision="8a8w",
                            calibration=[(torch.randn(2, 3, 10), torch.randn(2, 3, 20))])
    assert "calibration sample 0 holds 2 array(s); the model has 3 input(s)" in e.value.problem
    assert not (tmp_path / "bad").exists()


def test_a_failing_qnn_pass_names_the_pass_node_and_line_and_its_fix_works(monkeypatch):
    """A weight computed in forward (weight_norm, as Wav2Vec2's positional conv) fails QNN's
    LayoutTransform at fp16: audit and compile said a raw Exception / a 400-character pass list.
    The frontend now bakes such weights (test_et_parametrizations.py); with the bake off, the pass
    failure is named, and the default (the bake, which is the fix) puts every node on the HTP."""
    import torch
    from modelexport.core.errors import ToolchainError
    from modelexport.frontends import torch_module

    class WeightNormConv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(8, 8, 5, padding=2, groups=2), dim=2)

        def forward(self, x):
            return self.conv(x)
    model, x = WeightNormConv().eval(), torch.randn(1, 8, 16)
    with monkeypatch.context() as mp:
        mp.setattr(torch_module, "without_parametrizations", lambda loaded: loaded)
        with pytest.raises(ToolchainError) as e:
            modelexport.audit(model, (x,), precision="fp16")
    assert "pass LayoutTransform failed on aten_convolution" in e.value.problem
    assert "test_et_inputs.py" in e.value.problem and "remove_parametrizations" in e.value.fix
    assert all(n.backend == "HTP" for n in modelexport.audit(model, (x,), precision="fp16").nodes)
