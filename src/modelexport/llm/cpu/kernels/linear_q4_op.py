"""`modelexport::linear_q4` and `modelexport::swiglu_q4`: the export-time side of `linear_q4.cpp`
(schemas, references, shape functions), the weight packing, and the modules that put them in
place of a quantized Linear and of a SwiGLU MLP's gate and up projections.

y = x W^T (+ bias) with W stored as 4-bit values q in -8..7 and one bfloat16 scale per block of
32 input channels; the activations are quantized to int8 per block of 32 on the fly (symmetric,
scale max|x|/127). The reference below is what eager runs and what the tests compare the C++
kernel with.
"""
from __future__ import annotations

import torch

BLOCK = 32
SWIGLU_GROUP = 16      # swiglu_q4's weight: gate and up rows alternate in groups of this many (kRowsPerTask)

_LIB = torch.library.Library("modelexport", "FRAGMENT")
_LINEAR_ARGS = ("Tensor x, Tensor weight, Tensor scales, Tensor? bias=None, Tensor? residual=None, "
                "Tensor? norm_weight=None, float eps=0.0")
_SWIGLU_ARGS = "Tensor x, Tensor weight, Tensor scales, Tensor? norm_weight=None, float eps=0.0"
_LIB.define(f"linear_q4({_LINEAR_ARGS}) -> Tensor")
_LIB.define(f"linear_q4.out({_LINEAR_ARGS}, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.define(f"swiglu_q4({_SWIGLU_ARGS}) -> Tensor")
_LIB.define(f"swiglu_q4.out({_SWIGLU_ARGS}, *, Tensor(a!) out) -> Tensor(a!)")


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] in -8..7 → uint8 [N, K/2]: per block of 32, byte j = (q[j]+8) | (q[16+j]+8) << 4."""
    n, k = q.shape
    if k % BLOCK:
        raise ValueError(f"input size {k} is not a multiple of {BLOCK}")
    u = (q.to(torch.int16) + 8).to(torch.uint8).reshape(n, k // BLOCK, 2, BLOCK // 2)
    return (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4`: int8 [N, K] in -8..7."""
    n, half = packed.shape
    b = packed.reshape(n, half // (BLOCK // 2), 1, BLOCK // 2)
    u = torch.cat([b & 15, b >> 4], dim=2)
    return (u.to(torch.int16) - 8).to(torch.int8).reshape(n, half * 2)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [..., K] → (int8 values as float [..., K/32, 32], scales [..., K/32, 1]), as the kernel does."""
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    d = xb.abs().amax(dim=-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return torch.round(xb * inv), d


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim (the identity without a weight)."""
    if weight is None:
        return x
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def linear_q4_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                        norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    q, d = quantize_activations(rms_norm(x.float(), norm_weight, eps))                                        # [..., B, 32], [..., B, 1]
    w = unpack_int4(weight).float().reshape(weight.shape[0], -1, BLOCK)    # [N, B, 32]
    dots = torch.einsum("...bi,nbi->...nb", q.double(), w.double())        # exact integers
    y = (dots * (scales.float().double() * d.squeeze(-1).double().unsqueeze(-2))).sum(-1)
    if bias is not None:
        y = y + bias.double()
    if residual is not None:
        y = y + residual.double()
    return y.to(x.dtype)


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Rows of gate and up [H, ...] → [2H, ...] alternating in groups of SWIGLU_GROUP."""
    h = gate.shape[0]
    if h % SWIGLU_GROUP or up.shape != gate.shape:
        raise ValueError(f"gate/up of {h} rows do not split into groups of {SWIGLU_GROUP}")
    g = gate.reshape(h // SWIGLU_GROUP, 1, SWIGLU_GROUP, *gate.shape[1:])
    u = up.reshape(h // SWIGLU_GROUP, 1, SWIGLU_GROUP, *up.shape[1:])
    return torch.cat([g, u], dim=1).reshape(2 * h, *gate.shape[1:]).contiguous()


def swiglu_q4_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                        norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    both = linear_q4_reference(x, weight, scales, norm_weight=norm_weight, eps=eps)   # [..., 2H] interleaved
    pairs = both.reshape(*both.shape[:-1], -1, 2, SWIGLU_GROUP)
    out = torch.nn.functional.silu(pairs[..., 0, :]) * pairs[..., 1, :]
    return out.reshape(*both.shape[:-1], -1)


@torch.library.impl(_LIB, "linear_q4", "CompositeExplicitAutograd")
def _linear_q4(x, weight, scales, bias=None, residual=None, norm_weight=None, eps=0.0):
    return linear_q4_reference(x, weight, scales, bias, residual, norm_weight, eps)


@torch.library.impl(_LIB, "linear_q4.out", "CompositeExplicitAutograd")
def _linear_q4_out(x, weight, scales, bias=None, residual=None, norm_weight=None, eps=0.0, *, out):
    ref = linear_q4_reference(x, weight, scales, bias, residual, norm_weight, eps)
    out.resize_(ref.shape).copy_(ref)
    return out


@torch.library.register_fake("modelexport::linear_q4")
def _linear_q4_fake(x, weight, scales, bias=None, residual=None, norm_weight=None, eps=0.0):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("modelexport::linear_q4.out")
def _linear_q4_out_fake(x, weight, scales, bias=None, residual=None, norm_weight=None, eps=0.0, *, out):
    return out


@torch.library.impl(_LIB, "swiglu_q4", "CompositeExplicitAutograd")
def _swiglu_q4(x, weight, scales, norm_weight=None, eps=0.0):
    return swiglu_q4_reference(x, weight, scales, norm_weight, eps)


@torch.library.impl(_LIB, "swiglu_q4.out", "CompositeExplicitAutograd")
def _swiglu_q4_out(x, weight, scales, norm_weight=None, eps=0.0, *, out):
    ref = swiglu_q4_reference(x, weight, scales, norm_weight, eps)
    out.resize_(ref.shape).copy_(ref)
    return out


@torch.library.register_fake("modelexport::swiglu_q4")
def _swiglu_q4_fake(x, weight, scales, norm_weight=None, eps=0.0):
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


@torch.library.register_fake("modelexport::swiglu_q4.out")
def _swiglu_q4_out_fake(x, weight, scales, norm_weight=None, eps=0.0, *, out):
    return out


class _NormFirst(torch.nn.Module):
    """A module of ours that can take over the RMSNorm before it (its weight and eps)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("norm_weight", None)
        self.eps = 0.0

    def set_norm(self, weight: torch.Tensor, eps: float) -> None:
        self.norm_weight = weight.detach().float().contiguous()
        self.eps = float(eps)


class Q4Linear(_NormFirst):
    """A Linear whose weight is 4-bit per block of 32 (from `quantize_weight(w, 4, 32)`), run by
    our kernel; `set_norm` gives it the RMSNorm that precedes it, `forward(x, residual)` adds
    the residual stream to its output."""

    def __init__(self, weight_q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight", pack_int4(weight_q))                       # uint8 [N, K/2]
        self.register_buffer("scales", scales.to(torch.bfloat16).contiguous())    # [N, K/32]
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())
        self.in_features, self.out_features = weight_q.shape[1], weight_q.shape[0]

    def forward(self, x, residual=None):
        return torch.ops.modelexport.linear_q4(x.contiguous(), self.weight, self.scales, self.bias,
                                               None if residual is None else residual.contiguous(),
                                               self.norm_weight, self.eps)


class Q4GateUp(_NormFirst):
    """silu(gate(x)) * up(x) of a SwiGLU MLP in one call: both 4-bit weights interleaved."""

    def __init__(self, gate_q: torch.Tensor, gate_scales: torch.Tensor, up_q: torch.Tensor, up_scales: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", pack_int4(interleave_gate_up(gate_q, up_q)))
        self.register_buffer("scales", interleave_gate_up(gate_scales, up_scales).to(torch.bfloat16).contiguous())

    def forward(self, x):
        return torch.ops.modelexport.swiglu_q4(x.contiguous(), self.weight, self.scales, self.norm_weight, self.eps)


def _swiglu_forward(self, x):
    return self.w2(self.gate_up(x))


def fuse_swiglu(model: torch.nn.Module, quantize) -> int:
    """Give every ExecuTorch `FeedForward` (w2(silu(w1 x) * w3 x)) one `Q4GateUp` for w1 and w3;
    `quantize(weight)` → (int4 values, scales). Returns how many MLPs were fused."""
    import types

    from executorch.examples.models.llama.feed_forward import FeedForward

    done = 0
    for m in model.modules():
        if type(m) is FeedForward and m.w1.out_features % SWIGLU_GROUP == 0 and m.w1.in_features % BLOCK == 0:
            m.gate_up = Q4GateUp(*quantize(m.w1.weight), *quantize(m.w3.weight))
            m.w1 = m.w3 = None
            m.forward = types.MethodType(_swiglu_forward, m)
            done += 1
    return done


def _fused_block_forward(self, x, freqs_cos, freqs_sin, attn_options):
    """ExecuTorch's `TransformerBlock.forward` with the norms inside the projections after them
    and the residual adds inside the projections before them."""
    h, update = self.attention(x, freqs_cos, freqs_sin, residual=x, **attn_options)
    ff = self.feed_forward
    return ff.w2(ff.gate_up(h), h), update


def fuse_blocks(model: torch.nn.Module) -> int:
    """In every plain Llama block whose projections are ours (fused q|k|v, o, gate|up, down), move
    the two RMSNorms and the two residual adds into those calls: a block then has no elementwise
    op left outside our kernels but RoPE (one XNNPACK partition per layer instead of four). The
    model's final norm goes into its output projection likewise. Returns how many blocks were
    fused."""
    import types

    from executorch.examples.models.llama.llama_transformer import TransformerBlock
    from executorch.examples.models.llama.norm import RMSNorm

    def plain_norm(m) -> bool:
        return type(m) is RMSNorm and not m.add_unit_offset

    done = 0
    for b in model.modules():
        a, ff = getattr(b, "attention", None), getattr(b, "feed_forward", None)
        if not (type(b) is TransformerBlock and b.mlp_type == "default" and not b.use_residual_gate
                and not hasattr(b, "post_ffn_norm") and plain_norm(b.attention_norm) and plain_norm(b.ffn_norm)
                and isinstance(getattr(a, "wqkv", None), Q4Linear) and isinstance(a.wo, Q4Linear)
                and isinstance(getattr(ff, "gate_up", None), Q4GateUp) and isinstance(ff.w2, Q4Linear)):
            continue
        a.wqkv.set_norm(b.attention_norm.weight, b.attention_norm.eps)
        ff.gate_up.set_norm(b.ffn_norm.weight, b.ffn_norm.eps)
        b.attention_norm = b.ffn_norm = torch.nn.Identity()
        b.forward = types.MethodType(_fused_block_forward, b)
        done += 1
    if done and isinstance(getattr(model, "output", None), Q4Linear) and plain_norm(getattr(model, "norm", None)):
        model.output.set_norm(model.norm.weight, model.norm.eps)    # the final norm, into the lm_head
        model.norm = torch.nn.Identity()
    return done
