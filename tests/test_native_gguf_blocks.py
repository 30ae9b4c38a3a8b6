"""A GGUF's own blocks in the CPU program: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights written by
`gguf.quants.quantize`, Q4_K and Q5_K by `gguf_kquants`, computed as stored by our kernels (the reference against the weight
`gguf.quants.dequantize` gives, the C++ kernel in a real ExecuTorch program against the
reference), the rows of a transformers-loaded GGUF model found again in the file, and a tiny
GGUF's CPU program against its dequantized float model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from native_programs import load_portable_program

from modelexport.llm.cpu.gguf_blocks import GgufBlocks
from modelexport.llm.cpu.gguf_layouts import BLOCK, LAYOUTS, kernel_module, module_of
from modelexport.llm.cpu.kernels.linear_q4_op import (
    Q4GateUp,
    Q4Linear,
    quantize_activations,
    unpack_int8,
    unpack_nibbles,
)

LAYOUT_NAMES = tuple(LAYOUTS)
EXACT = tuple(name for name, layout in LAYOUTS.items() if layout.exact)
K_QUANTS = ("Q4_K", "Q5_K")


def _stored(kind: str, n_out: int, k: int, seed: int):
    """(float weight as gguf dequantizes it, blocks uint8 [N, K/block, bytes]) of a random weight."""
    import gguf
    from gguf.quants import dequantize, quantize
    from gguf_kquants import ENCODERS, quantize_k

    qtype = gguf.GGMLQuantizationType[kind]
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n_out, k)) * 0.1 + rng.standard_normal((n_out, 1)) * 0.05).astype(np.float32)
    raw = quantize_k(w, kind) if kind in ENCODERS else quantize(w, qtype)
    layout = LAYOUTS[kind]
    return torch.from_numpy(dequantize(raw, qtype)), raw.reshape(n_out, k // layout.block_weights, layout.block_bytes)


def _weight_of(module) -> torch.Tensor:
    """The weight a kernel module computes with, from its buffers: scale * value + min per block."""
    n = module.weight.shape[0]
    if isinstance(module, Q4Linear):
        values = unpack_nibbles(module.weight).float()
        mins = -8 * module.scales.float() if module.mins is None else module.mins.float()
    else:
        values = unpack_int8(module.weight).float()
        mins = torch.zeros_like(module.scales.float()) if module.mins is None else module.mins.float()
    blocks = values.reshape(n, -1, BLOCK)
    return (module.scales.float().unsqueeze(-1) * blocks + mins.unsqueeze(-1)).reshape(n, -1)


@pytest.mark.parametrize("kind", EXACT)
def test_module_holds_the_files_values_exactly(kind):
    """Every layout kept as stored: the weight our kernel's module computes with is, bit for bit,
    the one `gguf.quants.dequantize` reads from the blocks (Q4_K's float32 scale and min products
    included)."""
    w, blocks = _stored(kind, 24, 512, seed=3)
    module = module_of(kind, blocks, None)
    assert module.scales.dtype == (torch.float32 if kind in K_QUANTS else torch.float16)
    assert torch.equal(_weight_of(module), w), kind


def test_q6_k_rows_become_8_bit_blocks_within_half_a_step():
    """Q6_K (a scale per 16 weights) has no exact layout in our kernels: its rows become 8-bit
    blocks of 32, each value within half a step of the file's, ~45 dB from them."""
    w, blocks = _stored("Q6_K", 24, 512, seed=3)
    module = module_of("Q6_K", blocks, None)
    got = _weight_of(module)
    step = module.scales.float().repeat_interleave(BLOCK, dim=1)
    assert bool(((got - w).abs() <= step * 0.5001).all())
    sqnr = float(10 * torch.log10(w.pow(2).sum() / (got - w).pow(2).sum()))
    assert 40 < sqnr < 60, sqnr


@pytest.mark.parametrize("kinds", [("Q5_0", "Q8_0"), ("Q4_0", "Q4_K"), ("Q4_1", "Q4_0"), ("Q5_K", "Q8_0"),
                                   ("Q4_K", "Q8_0"), ("Q4_0", "Q5_1")])
def test_rows_of_two_layouts_join_exactly(kinds):
    """A fused weight whose rows come from two layouts (a Q4_K_M file's Q5_0 q/k beside a Q8_0 v):
    one module, scales widened, mins made explicit, 4-bit rows held by the 8-bit kernel beside
    8-bit ones, still equal to the file's values."""
    from modelexport.llm.cpu.gguf_layouts import join_rows
    (wa, ba), (wb, bb) = _stored(kinds[0], 16, 256, seed=7), _stored(kinds[1], 8, 256, seed=8)
    rows = join_rows([LAYOUTS[kinds[0]].decode(ba), LAYOUTS[kinds[1]].decode(bb)])
    assert torch.equal(_weight_of(kernel_module(rows, None)), torch.cat([wa, wb])), kinds


def test_a_fused_weight_of_mixed_layouts_is_found_in_order(tmp_path):
    """Rows found in two tensors of different layouts, interleaved, come back in the weight's own
    row order; Q4_K rows beside Q5_0 ones go to the 8-bit kernel, exactly; a row not in the file
    leaves the weight to re-quantization."""
    from test_llm_frontends import write_tiny_gguf
    path = write_tiny_gguf(tmp_path / "mixed.gguf", matrix_type="Q5_0", embedding_type="Q8_0", output_type="Q8_0",
                           layer_types={"attn_v": "Q8_0", "ffn_up": "Q4_K"})
    blocks = GgufBlocks(path)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from modelexport.frontends.gguf_file import read_gguf_matrices
    mats = read_gguf_matrices(path)

    def values(name):
        kind, data = mats[name]
        return torch.from_numpy(dequantize(np.asarray(data), GGMLQuantizationType[kind]))

    q, v = values("blk.0.attn_q.weight"), values("blk.0.attn_v.weight")
    fused = torch.cat([v[:3], q[5:9], v[3:]])
    name, rows = blocks.blocks_of(fused)
    assert name == "Q5_0+Q8_0" and torch.equal(_weight_of(kernel_module(rows, None)), fused)
    up = values("blk.0.ffn_up.weight")
    name, rows = blocks.blocks_of(torch.cat([q, up]))
    assert name == "Q4_K+Q5_0" and rows.kernel == "q8"
    assert torch.equal(_weight_of(kernel_module(rows, None)), torch.cat([q, up]))
    assert blocks.blocks_of(torch.cat([q, torch.randn(1, q.shape[1])])) is None


def _float_activation_linear(x, w, bias):
    """The float linear on the activations as the kernel rounds them (int8 per block of 32)."""
    q, d = quantize_activations(x)
    xq = (q * d).reshape(x.shape)
    return torch.nn.functional.linear(xq.double(), w.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("kind", EXACT)
def test_reference_computes_the_stored_blocks_exactly(kind):
    """The op's reference = the dequantized weight times the same int8 activations, to float
    rounding; and to the activations' rounding from the float product."""
    w, blocks = _stored(kind, 48, 256, seed=1)
    bias = torch.randn(48)
    layer = module_of(kind, blocks, bias).eval()
    x = torch.randn(3, 256) * 2
    got = layer(x).double()
    want = _float_activation_linear(x, w, bias)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max()), kind
    exact = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    rel = float((got - exact).norm() / exact.norm())
    assert 0 < rel < 0.02, (kind, rel)          # only the int8 activations differ from float


class _Layers(torch.nn.Module):
    """Several layers in one program (one export for all the shapes a test needs)."""

    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x0, x1, x2):
        return tuple(layer(x) for layer, x in zip(self.layers, (x0, x1, x2)))


# (rows, input size, bias): the AVX2 path in groups of 4 rows split over the thread pool; an odd
# number of blocks (the portable path); 4 + 1 + 1 rows (the AVX2 path's single-row tail). A
# K-quant's rows are whole super-blocks of 256 (an even number of blocks).
SHAPES = ((64, 1024, False), (40, 96, True), (6, 128, False))
K_SHAPES = ((64, 1024, False), (40, 256, True), (6, 512, False))


@pytest.mark.parametrize("kind", LAYOUT_NAMES)
def test_kernel_matches_reference_on_stored_blocks(tmp_path, kind):
    """The C++ kernel on GGUF blocks against the reference, one token and several (float16 and
    float32 scales, with and without mins, 4- and 8-bit)."""
    shapes = K_SHAPES if LAYOUTS[kind].block_weights > BLOCK else SHAPES
    layers = [module_of(kind, _stored(kind, n_out, k, seed=n_out)[1], torch.randn(n_out) if bias else None)
              for n_out, k, bias in shapes]
    n = torch.export.Dim("n", max=32)
    module = _Layers(layers).eval()
    method = load_portable_program(module, tuple(torch.randn(1, 2, k) for _, k, _ in shapes),
                                   tuple({1: n} for _ in shapes), tmp_path / f"{kind}.pte")
    for tokens in (1, 7):
        xs = tuple(torch.randn(1, tokens, k) * 3 for _, k, _ in shapes)
        xs[0][0, 0, :32] = 0.0                       # an all-zero block: scale 0
        got = method.forward(xs)
        for (n_out, k, _), g, x, layer in zip(shapes, got, xs, layers):
            want = layer(x)
            err = float((g - want).abs().max())
            assert g.shape == want.shape and err <= 2e-5 * float(want.abs().max()) + 1e-5, (kind, n_out, k, tokens, err)


@pytest.mark.parametrize("kind", ("Q4_1", "Q4_K", "Q5_K"))
def test_gate_up_and_norm_on_stored_blocks(tmp_path, kind):
    """Gate and up of one layout interleaved into one swiglu call (swiglu_q4 for 4-bit blocks,
    swiglu_q8 for 5-bit ones in the 8-bit kernel) with the RMSNorm inside, in a program."""
    k = 256 if LAYOUTS[kind].block_weights > BLOCK else 96
    (gw, gb), (uw, ub) = _stored(kind, 64, k, seed=5), _stored(kind, 64, k, seed=6)
    gate, up = module_of(kind, gb, None), module_of(kind, ub, None)
    fused = Q4GateUp.from_linears(gate, up).eval()
    assert fused.eight_bit == (LAYOUTS[kind].kernel == "q8")
    g = torch.rand(k) + 0.5
    fused.set_norm(g, 1e-5)
    x = torch.randn(1, 5, k)
    xn = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g
    want = torch.nn.functional.silu(_float_activation_linear(xn, gw, None)) * _float_activation_linear(xn, uw, None)
    assert float((fused(x).double() - want).abs().max()) <= 1e-4 * float(want.abs().max())
    method = load_portable_program(fused, (x,), ({1: torch.export.Dim("n", max=16)},), tmp_path / f"gate_up_{kind}.pte")
    got = method.forward((x,))[0]
    assert float((got - fused(x)).abs().max()) <= 2e-5 * float(want.abs().max()) + 1e-5


@pytest.fixture(scope="module")
def tiny_q4_1_gguf(tmp_path_factory):
    from test_llm_frontends import write_tiny_gguf
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf", matrix_type="Q4_1",
                           embedding_type="Q8_0", output_type="Q8_0")


def test_every_linear_of_the_loaded_model_is_found_in_the_file(tiny_q4_1_gguf):
    """transformers' model of a GGUF (q/k rows permuted, dequantized): each Linear's rows are one
    tensor's rows, found by content, in its stored layout; a weight not in the file is not."""
    from modelexport.frontends.gguf_file import load_gguf_causal_lm

    model = load_gguf_causal_lm(tiny_q4_1_gguf).model
    blocks = GgufBlocks(tiny_q4_1_gguf)
    assert blocks.types == {"Q4_1": 14, "Q8_0": 2}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            layout, stored = blocks.blocks_of(m.weight)
            assert layout == ("Q8_0" if name == "lm_head" else "Q4_1"), name
            module = kernel_module(stored, None)
            eye = torch.eye(m.in_features)                # the module's weight, read back exactly
            q, d = quantize_activations(eye)
            assert torch.equal(q * d, eye.reshape(q.shape))
            assert torch.allclose(module(eye).T, m.weight, atol=1e-6, rtol=0), name
    assert blocks.blocks_of(torch.randn(8, 64)) is None
    assert blocks.embedding(model.model.embed_tokens).weight.dtype == torch.int8


def kept_and_requantized_programs(gguf, ref_model, tmp_path) -> tuple[dict, dict[bool, float]]:
    """The CPU programs of `gguf` keeping its blocks (True) and re-quantizing them (False): the kept
    one's llm.json `weights` record, and each one's worst logit SQNR against `ref_model` (the
    dequantized float model) over a prefill of 6 tokens, one decode step and 3 more tokens."""
    from modelexport.llm.cpu.export import CpuExportOptions, build_cached
    from modelexport.llm.cpu.session import ExecuTorchSession

    ids = [1, 72, 101, 108, 108, 111, 32, 119, 111, 114]
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    weights, sqnr = {}, {}
    for keep in (True, False):
        entry, meta, _ = build_cached(gguf, CpuExportOptions(max_seq_len=32, gguf_blocks=keep), cache_dir=tmp_path / "cache")
        if keep:
            weights = meta["weights"]
        s = ExecuTorchSession(entry / "model.pte")
        got = [s.feed(ids[:6]), s.feed([ids[6]]), s.feed(ids[7:])]
        sqnr[keep] = min(float(10 * torch.log10(w.pow(2).sum() / (g - w).pow(2).sum()))
                         for g, w in zip(got, (ref[5], ref[6], ref[9])))
    return weights, sqnr


@pytest.mark.heavy
def test_tiny_gguf_program_keeps_its_blocks_and_matches_the_dequantized_model(tiny_q4_1_gguf, tmp_path):
    """The CPU program of a Q4_1 GGUF (Q8_0 embedding and output) holds the stored blocks
    (llm.json says so) and its logits follow the dequantized float model through prefill and
    decode; re-quantizing the same file instead is further from it."""
    from modelexport.frontends.gguf_file import load_gguf_causal_lm

    weights, sqnr = kept_and_requantized_programs(tiny_q4_1_gguf, load_gguf_causal_lm(tiny_q4_1_gguf).model, tmp_path)
    # 2 layers x (q|k|v, o, down, gate|up x 2 stored as two Q4_1 weights interleaved) ... counted per module built
    # per layer: q|k|v (fused), o, gate, up, down; the output and the embedding are Q8_0
    assert weights["kept_as_stored"] == {"Q4_1": 10, "Q8_0": 1, "Q8_0 embedding": 1}, weights
    assert weights["layout"] == "GGUF blocks as stored"
    print("logit SQNR vs the dequantized model (dB):", sqnr)
    # measured: 36.4 dB kept (only the int8 activations differ), 12.1 dB re-quantized
    assert sqnr[True] > 33 and sqnr[True] > sqnr[False] + 15, sqnr


class _SmolLM2Block(torch.nn.Module):
    """A Llama block's projections at SmolLM2-135M's sizes as the program calls them on a Q4_1
    GGUF: RMSNorm + q|k|v, gate|up with its norm, down + residual; and a Q8_0 head with the
    final norm (4096 of its 49152 rows)."""

    def __init__(self):
        super().__init__()
        dim, hidden, qkv = 576, 1536, 960
        self.qkv = module_of("Q4_1", _stored("Q4_1", qkv, dim, seed=11)[1], None)
        self.qkv.set_norm(torch.rand(dim) + 0.5, 1e-5)
        gate, up = (module_of("Q4_1", _stored("Q4_1", hidden, dim, seed=s)[1], None) for s in (12, 13))
        self.gate_up = Q4GateUp.from_linears(gate, up)
        self.gate_up.set_norm(torch.rand(dim) + 0.5, 1e-5)
        self.down = module_of("Q4_1", _stored("Q4_1", dim, hidden, seed=14)[1], None)
        self.head = module_of("Q8_0", _stored("Q8_0", 4096, dim, seed=15)[1], None)
        self.head.set_norm(torch.rand(dim) + 0.5, 1e-5)

    def forward(self, x, mlp_in):
        return self.qkv(x), self.gate_up(x), self.down(mlp_in, x), self.head(x)


def test_kernel_on_smollm2_shapes_prefill_and_decode(tmp_path):
    """The C++ kernels against the reference at the real model's sizes, for a 37-token prompt (a
    chat question's prefill: several tokens per weight task, split over the thread pool) and then
    one token (decode), with activations whose first token carries an outlier as SmolLM2's do.
    (Measured on the real model, issue 20: this program's greedy tokens equal llama.cpp's on the
    same file, and the reference with unrounded activations equals the dequantized model to 68 dB.)"""
    # seeded: an activation within float error of an int8 rounding boundary rounds apart on the two
    # sides (one quantum; unseeded, 1 run in 6 failed)
    torch.manual_seed(0)
    module = _SmolLM2Block().eval()
    n = torch.export.Dim("n", max=64)
    method = load_portable_program(module, (torch.randn(1, 2, 576), torch.randn(1, 2, 1536)),
                                   ({1: n}, {1: n}), tmp_path / "smollm2_block.pte")
    for tokens in (37, 1):
        x, mlp_in = torch.randn(1, tokens, 576), torch.randn(1, tokens, 1536) * 0.3
        x[0, 0, 7] = 400.0                           # a massive activation in one channel
        got = method.forward((x, mlp_in))
        for name, g, w in zip(("qkv", "gate_up", "down", "head"), got, module(x, mlp_in)):
            err = float((g - w).abs().max())
            assert g.shape == w.shape and err <= 2e-5 * float(w.abs().max()) + 1e-5, (name, tokens, err)


def test_requantized_weights_are_counted_with_their_loss(tiny_q4_1_gguf):
    """A weight not stored in a kept layout is re-quantized; the record says how many and what
    they lost against the file's values (weight SQNR), which a re-quantized Q4_1 weight shows."""
    from modelexport.llm.cpu.export import _dequantized, quantize_weight

    blocks = GgufBlocks(tiny_q4_1_gguf)
    assert "requantized_weight_sqnr_db" not in blocks.summary()
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    q, scale = quantize_weight(w, 4, 32)
    blocks.requantized(w, _dequantized(q, scale, 32))
    blocks.requantized(w, w + 0.3 * w)                       # 10.46 dB by construction: the worst
    loss = blocks.summary()["requantized_weight_sqnr_db"]
    assert blocks.used["requantized"] == 2
    assert 10.46 < loss["all"] < 20 and abs(loss["worst"] - 10.46) < 0.01, loss
