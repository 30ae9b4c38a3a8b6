"""`modelexport::linear_q4`, our 4-bit linear kernel for the CPU runtime: the weight packing, the
reference against a float linear, the C++ kernel run by ExecuTorch's runtime inside a real
program against the reference (vectorized and portable paths, one token and many, bias, the
thread pool), and a tiny Llama exported with it against the same model with XNNPACK's kernel."""
from __future__ import annotations

import pytest
import torch

from modelexport.core.errors import InputError
from modelexport.llm.cpu.kernels.linear_q4_op import (
    Q4GateUp, Q4Linear, interleave_gate_up, linear_q4_reference, pack_int4, quantize_activations,
    swiglu_q4_reference, unpack_int4)
from modelexport.llm.cpu.export import CpuExportOptions, quantize_weight
from native_programs import load_portable_program


def _q4_linear(n_out: int, k: int, bias: bool, seed: int = 0) -> tuple[Q4Linear, torch.Tensor]:
    torch.manual_seed(seed)
    w = torch.randn(n_out, k)
    q, scales = quantize_weight(w, 4, 32)
    return Q4Linear(q, scales, torch.randn(n_out) if bias else None).eval(), w


def _program(tmp_path, layer: torch.nn.Module, k: int, n_max: int = 64):
    """An ExecuTorch program holding only the op (portable runtime, no delegate), dynamic n."""
    return load_portable_program(layer, (torch.randn(1, 2, k),), ({1: torch.export.Dim("n", max=n_max)},),
                                 tmp_path / f"{type(layer).__name__}_{layer.weight.shape[0]}_{k}.pte")


def test_packing_round_trips_and_keeps_the_block_layout():
    q = torch.randint(-8, 8, (5, 64), dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    # byte j of a block: value j in the low nibble, value 16 + j in the high one, both + 8
    assert int(packed[0, 0]) == (int(q[0, 0]) + 8) | ((int(q[0, 16]) + 8) << 4)
    with pytest.raises(ValueError):
        pack_int4(torch.zeros(2, 40, dtype=torch.int8))


def test_reference_is_close_to_the_float_linear():
    layer, w = _q4_linear(48, 256, bias=True)
    x = torch.randn(3, 256)
    got = layer(x)
    want = torch.nn.functional.linear(x, w, layer.bias)
    rel = float((got - want).norm() / want.norm())
    assert rel < 0.15, rel                       # 4-bit weights, 8-bit activations
    # the activations' own rounding is at most half a step per value
    q, d = quantize_activations(x)
    assert float((q * d - x.reshape(3, 8, 32)).abs().max()) <= float(d.max()) / 2 + 1e-6


@pytest.mark.parametrize("n_out,k,bias", [(576, 1536, False), (960, 576, True), (40, 96, True), (7, 64, False)])
def test_kernel_matches_reference(tmp_path, n_out, k, bias):
    """SmolLM2's shapes (AVX2 path, split over the thread pool), an odd number of blocks (the
    portable path), and fewer rows than one vectorized group."""
    layer, _ = _q4_linear(n_out, k, bias)
    method = _program(tmp_path, layer, k)
    torch.manual_seed(1)
    for n in (1, 2, 17, 64):
        x = torch.randn(1, n, k) * 3
        x[0, 0, :32] = 0.0                       # an all-zero block: scale 0, no division by it
        got = method.forward((x,))[0]
        want = linear_q4_reference(x, layer.weight, layer.scales, layer.bias)
        assert got.shape == (1, n, n_out)
        err = float((got - want).abs().max())
        assert err <= 2e-5 * float(want.abs().max()) + 1e-5, (n, err)


def test_swiglu_kernel_matches_reference_and_the_unfused_mlp(tmp_path):
    """Gate and up in one call (rows interleaved in groups of 16) = silu(gate x) * up x."""
    torch.manual_seed(2)
    gate_q, gate_s = quantize_weight(torch.randn(64, 96), 4, 32)
    up_q, up_s = quantize_weight(torch.randn(64, 96), 4, 32)
    layer = Q4GateUp(gate_q, gate_s, up_q, up_s).eval()
    assert torch.equal(interleave_gate_up(torch.arange(32), torch.arange(32) + 100)[14:18],
                       torch.tensor([14, 15, 100, 101]))
    x = torch.randn(1, 3, 96)
    gate, up = Q4Linear(gate_q, gate_s, None), Q4Linear(up_q, up_s, None)
    unfused = torch.nn.functional.silu(gate(x)) * up(x)
    assert torch.allclose(swiglu_q4_reference(x, layer.weight, layer.scales), unfused, atol=1e-5)
    big_gate, big_up = quantize_weight(torch.randn(1536, 576), 4, 32), quantize_weight(torch.randn(1536, 576), 4, 32)
    big = Q4GateUp(*big_gate, *big_up).eval()
    big.set_norm(torch.rand(576) + 0.5, 1e-5)            # as a fused block runs it: RMSNorm inside
    for layer, k in ((layer, 96), (big, 576)):
        method = _program(tmp_path, layer, k)
        for n in (1, 9):
            x = torch.randn(1, n, k)
            got = method.forward((x,))[0]
            want = layer(x)                                   # the reference op, norm included
            assert got.shape == want.shape
            assert float((got - want).abs().max()) <= 2e-5 * float(want.abs().max()) + 1e-5


class _NormLinearResidual(torch.nn.Module):
    """linear_q4 with an RMSNorm before and a residual after (how a fused block calls it)."""

    def __init__(self, layer: Q4Linear):
        super().__init__()
        self.layer = layer

    def forward(self, x, residual):
        return self.layer(x, residual)


def test_norm_and_residual_inside_the_kernel(tmp_path):
    layer, _ = _q4_linear(576, 576, bias=False, seed=3)
    g = torch.rand(576) + 0.5
    layer.set_norm(g, 1e-5)
    x, res = torch.randn(1, 5, 576) * 4, torch.randn(1, 5, 576)
    unfused = torch.ops.modelexport.linear_q4(
        (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g).contiguous(), layer.weight, layer.scales) + res
    assert torch.allclose(layer(x, res), unfused, atol=1e-4)
    dyn = ({1: torch.export.Dim("n", max=16)}, {1: torch.export.Dim("n", max=16)})
    method = load_portable_program(_NormLinearResidual(layer).eval(), (x, res), dyn, tmp_path / "norm_residual.pte")
    for n in (1, 5):
        got = method.forward((x[:, :n].contiguous(), res[:, :n].contiguous()))[0]
        want = layer(x[:, :n], res[:, :n])
        assert float((got - want).abs().max()) <= 2e-5 * float(want.abs().max()) + 1e-5


def test_options_pick_the_kernel_and_refuse_what_it_cannot_run():
    assert CpuExportOptions().linear == "native"
    assert CpuExportOptions(quant="8da8w").linear == "xnnpack"
    assert CpuExportOptions(group_size=64).linear == "xnnpack"
    assert CpuExportOptions(linear="xnnpack").linear == "xnnpack"
    with pytest.raises(InputError, match="groups of 32"):
        CpuExportOptions(quant="fp32", linear="native")
    with pytest.raises(InputError, match="unknown linear kernel"):
        CpuExportOptions(linear="mkl")


def test_tiny_llama_with_either_linear_kernel_is_close_to_hf(tmp_path):
    """The same tiny model exported with our kernel and with XNNPACK's: each program holds only
    its own linear op, and both give logits near the float model's through prefill and decode,
    ours no further than XNNPACK's (per-block activation scales are finer than its per-token ones)."""
    from llm_tiny import BOS, EOS, tiny_llama

    from modelexport.llm.cpu.session import ExecuTorchSession
    from modelexport.llm.cpu.export import export_pte

    model = tiny_llama(2)
    ids = [BOS, 72, 101, 108, 108, 111, 32, 119, 111, 114]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    errors = {}
    for kernel in ("native", "xnnpack"):
        folder = tmp_path / kernel
        folder.mkdir()
        export_pte(model, folder, CpuExportOptions(quant="8da4w", max_seq_len=32, linear=kernel),
                   bos_id=BOS, eos_ids=[EOS])
        data = (folder / "model.pte").read_bytes()
        assert (b"modelexport::linear_q4" in data) == (kernel == "native")
        s = ExecuTorchSession(folder / "model.pte")
        got = [s.feed(ids[:6]), s.feed([ids[6]]), s.feed(ids[7:])]
        errors[kernel] = max(float((g - want).norm() / want.norm()) for g, want in zip(got, (ref[5], ref[6], ref[9])))
    print("relative logit error vs float:", errors)
    assert errors["xnnpack"] < 0.2 and errors["native"] < 1.2 * errors["xnnpack"], errors
