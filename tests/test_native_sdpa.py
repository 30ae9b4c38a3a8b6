"""`modelexport::sdpa`, our C++ attention kernel for the CPU runtime: compiled here with g++
against the executorch wheel, run by ExecuTorch's runtime inside a real program, compared with
the reference (itself checked against torch's own causal SDPA)."""
from __future__ import annotations

import math

import pytest
import torch

from modelexport.core.errors import ToolchainError
from modelexport.llm.cpu.kernels.sdpa_op import sdpa_reference
from native_programs import load_portable_program


class _OneAttention(torch.nn.Module):
    def __init__(self, q_heads: int):
        super().__init__()
        self.q_heads = q_heads

    def forward(self, q, k_cache, v_cache, pos):
        return torch.ops.modelexport.sdpa(q, k_cache, v_cache, pos[0].item(), self.q_heads)


def _program(tmp_path, n_max: int, heads: int, kv_heads: int, dim: int, cache_len: int, extra_heads: int = 0):
    """An ExecuTorch program holding only the op (portable runtime, no delegate), dynamic n; the
    query tensor carries `extra_heads` more heads after the `heads` queries (a fused q|k|v)."""
    q = torch.randn(1, 2, heads + extra_heads, dim)
    k = torch.randn(1, cache_len, kv_heads, dim)
    dyn = ({1: torch.export.Dim("n", max=n_max)}, None, None, None)
    return load_portable_program(_OneAttention(heads), (q, k, k.clone(), torch.tensor([0])), dyn,
                                 tmp_path / f"sdpa_{heads}_{kv_heads}_{dim}_{extra_heads}.pte")


def test_reference_is_torch_causal_sdpa_with_an_offset():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 5, 6, 16), torch.randn(1, 20, 2, 16), torch.randn(1, 20, 2, 16)
    got = sdpa_reference(q, k, v, 7)
    kk = k[:, :12].repeat_interleave(3, dim=2).transpose(1, 2)
    vv = v[:, :12].repeat_interleave(3, dim=2).transpose(1, 2)
    mask = torch.arange(12)[None, :] <= (7 + torch.arange(5))[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=mask).transpose(1, 2)
    assert torch.allclose(got, want, atol=1e-5)


def test_explicit_scores_are_the_reference_plus_scale_softcap_and_window():
    """`ExplicitScores` (the torch-ops attention of soft-capped or windowed layers: Gemma) is the
    kernel's contract when it adds nothing, and HF's eager attention (scale, tanh soft-cap before
    the mask, a window of `window` positions) when it does."""
    from modelexport.llm.cpu.kernels.sdpa_op import ExplicitScores

    torch.manual_seed(2)
    q, k, v = torch.randn(1, 5, 6 + 4, 16) * 3, torch.randn(1, 20, 2, 16), torch.randn(1, 20, 2, 16)
    plain = ExplicitScores(1 / math.sqrt(16), None, None)(q, k, v, 7, 6)
    assert torch.allclose(plain, sdpa_reference(q, k, v, 7, 6), atol=1e-5)
    scale, cap, window = 0.2, 5.0, 4
    got = ExplicitScores(scale, cap, window)(q, k, v, 7, 6)
    kk = k[0, :12].repeat_interleave(3, dim=1).transpose(0, 1)                 # [H, L, D]
    vv = v[0, :12].repeat_interleave(3, dim=1).transpose(0, 1)
    scores = torch.tanh(q[0, :, :6].transpose(0, 1) @ kk.transpose(1, 2) * scale / cap) * cap   # [H, n, L]
    qpos, kpos = (7 + torch.arange(5))[:, None], torch.arange(12)[None, :]
    allowed = (kpos <= qpos) & (qpos - kpos < window)
    want = (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv).transpose(0, 1)[None]
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-2)        # and they do change it


@pytest.mark.parametrize("heads,kv_heads,dim,extra", [(9, 3, 64, 6), (4, 4, 32, 0), (2, 1, 20, 0)])
def test_kernel_matches_reference_for_decode_and_prefill(tmp_path, heads, kv_heads, dim, extra):
    """GQA with a fused q|k|v input (SmolLM2's shapes), plain MHA, and a head size with no
    vectorized path."""
    cache_len = 300
    method = _program(tmp_path, 64, heads, kv_heads, dim, cache_len, extra)
    torch.manual_seed(1)
    k = torch.randn(1, cache_len, kv_heads, dim) * 2
    v = torch.randn(1, cache_len, kv_heads, dim)
    # (n, start_pos): decode steps early and late, prefill chunks from 0 and mid-cache, and one
    # long enough to be split over ExecuTorch's thread pool
    for n, start in [(1, 0), (1, 5), (1, 298), (7, 0), (16, 40), (64, 236)]:
        q = torch.randn(1, n, heads + extra, dim) * 3
        got = method.forward((q, k, v, torch.tensor([start])))[0]
        want = sdpa_reference(q, k, v, start, heads)
        assert got.shape == want.shape
        err = float((got - want).abs().max())
        assert err < 2e-5, (n, start, err)


def test_kernel_refuses_positions_beyond_the_cache(tmp_path):
    method = _program(tmp_path, 8, 2, 1, 8, 10)
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 10, 1, 8)
    with pytest.raises(RuntimeError):
        method.forward((q, k, k, torch.tensor([8])))    # positions 8..11 of a 10-position cache


@pytest.mark.parametrize("dim", [1, 32])   # the portable path and the AVX2 one (8 scores a vector)
def test_exp_polynomial_is_float_accurate(tmp_path, dim):
    """The kernel's softmax uses its own exp. Eight keys, key 1 scores `gap` and the others 0, only
    key 1 has a value (1): the output is e^gap / (7 + e^gap), over the whole range of gaps."""
    method = _program(tmp_path, 8, 1, 1, dim, 8)
    k = torch.zeros(1, 8, 1, dim)
    k[0, 1, 0, 0] = 1.0
    v = k.clone()
    for gap in (-100.0, -60.0, -20.0, -8.0, -3.0, -1.0, -0.3, -0.01, 0.0, 0.7, 5.0, 30.0):
        q = torch.zeros(1, 1, 1, dim)
        q[..., 0] = gap * math.sqrt(dim)              # undo the 1/sqrt(D) scale
        got = float(method.forward((q, k, v, torch.tensor([7])))[0].reshape(-1)[0])
        want = math.exp(gap) / (7 + math.exp(gap)) if gap < 50 else 1.0
        assert abs(got - want) <= 1e-7 + 1e-6 * want, (gap, got, want)


def test_missing_compiler_is_a_clear_toolchain_error(tmp_path, monkeypatch):
    from modelexport.llm.cpu import kernels as native

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    monkeypatch.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ToolchainError, match="C\\+\\+ compiler"):
        native.build_kernels()


def test_fused_attention_model_matches_transformers_in_eager():
    """`fuse_qkv_attention` as plain PyTorch (the op's reference), before any export: the logits
    of Hugging Face's model, for a prompt and then one more token at its position."""
    from llm_tiny import tiny_llama
    from modelexport.llm.cpu.transformer import build_transformer

    hf = tiny_llama(2)
    model, _ = build_transformer(hf, 64, "native")
    assert all(a.wq is None and a.wqkv.out_features == (4 + 2 * 2) * 16 for a in (l.attention for l in model.layers))
    ids = [1, 72, 101, 108, 108, 111, 32]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
        first = model(torch.tensor([ids[:6]]), {"input_pos": torch.tensor([0])})
        last = model(torch.tensor([ids[6:]]), {"input_pos": torch.tensor([6])})
    first, last = (x[0] if isinstance(x, tuple) else x for x in (first, last))
    assert torch.allclose(first.reshape(-1), ref[5], atol=1e-4) and torch.allclose(last.reshape(-1), ref[6], atol=1e-4)
