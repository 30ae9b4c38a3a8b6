"""`modelexport::linear_q4`, `modelexport::swiglu_q4`, `modelexport::linear_q8` and
`modelexport::swiglu_q8`: the export-time
side of `linear_q4.cpp` (schemas, references, shape functions), the weight packing, and the
modules that put them in place of a quantized Linear and of a SwiGLU MLP's gate and up projections.

y = x W^T (+ bias) with W stored per block of 32 input channels, as a GGUF file stores it:
- 4-bit values u in 0..15 and a scale d per block (bfloat16 for our own quantization of float
  weights, float16 for a GGUF's, float32 where a GGUF's is a product of two: Q4_K's super-block
  scale times its 6-bit sub-block scale), W = d * (u - 8) (Q4_0, and ours), or with a min m per
  block (of the scales' type) W = d * u + m (Q4_1, Q4_K);
- 8-bit values q and a scale d per block, W = d * q (Q8_0; Q5_0's 5-bit values minus 16), or
  with a min m per block W = d * q + m (Q5_1, Q5_K).
The activations are quantized to int8 per block of 32 on the fly (symmetric, scale max|x|/127, as
llama.cpp quantizes them to Q8_0/Q8_1 for its dot products). The reference below is what eager
runs and what the tests compare the C++ kernel with.
"""
from __future__ import annotations

import types

import torch

BLOCK = 32
SWIGLU_GROUP = 16      # swiglu_q4's weight: gate and up rows alternate in groups of this many (kRowsPerTask)

_LIB = torch.library.Library("modelexport", "FRAGMENT")
_LINEAR_ARGS = ("Tensor x, Tensor weight, Tensor scales, Tensor? bias=None, Tensor? residual=None, "
                "Tensor? norm_weight=None, float eps=0.0")
_MINS = ", Tensor? mins=None"           # a weight's per-block mins (GGUF Q4_1, Q4_K, Q5_1, Q5_K)
_SWIGLU_ARGS = "Tensor x, Tensor weight, Tensor scales, Tensor? norm_weight=None, float eps=0.0" + _MINS
_LIB.define(f"linear_q4({_LINEAR_ARGS}{_MINS}) -> Tensor")
_LIB.define(f"linear_q4.out({_LINEAR_ARGS}{_MINS}, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.define(f"linear_q8({_LINEAR_ARGS}{_MINS}) -> Tensor")
_LIB.define(f"linear_q8.out({_LINEAR_ARGS}{_MINS}, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.define(f"swiglu_q4({_SWIGLU_ARGS}) -> Tensor")
_LIB.define(f"swiglu_q4.out({_SWIGLU_ARGS}, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.define(f"swiglu_q8({_SWIGLU_ARGS}) -> Tensor")
_LIB.define(f"swiglu_q8.out({_SWIGLU_ARGS}, *, Tensor(a!) out) -> Tensor(a!)")


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


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] → the stored 4-bit values u in 0..15, int16 [N, K] (GGUF's qs layout)."""
    return unpack_int4(packed).to(torch.int16) + 8


def _q8_order(k: int) -> torch.Tensor:
    """For each stored position of an 8-bit row, the input channel it holds: per pair of blocks
    the first 16 values of each, then the last 16 of each (the activations' order in the
    kernel); an odd last block in order."""
    idx = torch.arange(k)
    pairs = k // (2 * BLOCK) * 2 * BLOCK
    head = idx[:pairs].reshape(-1, 2, 2, BLOCK // 2).transpose(1, 2).reshape(-1)   # [pair, half, block, 16]
    return torch.cat([head, idx[pairs:]])


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] (GGUF Q8_0's values, blocks of 32 in order) → the kernel's order."""
    if q.shape[1] % BLOCK:
        raise ValueError(f"input size {q.shape[1]} is not a multiple of {BLOCK}")
    return q[:, _q8_order(q.shape[1])].contiguous()


def unpack_int8(packed: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(packed)
    out[:, _q8_order(packed.shape[1])] = packed
    return out


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


def _block_linear_reference(x, values, scales, mins, bias, residual, norm_weight, eps):
    """values: the stored block values as integers [N, K] (u or q); W = scales * values + mins per block."""
    q, d = quantize_activations(rms_norm(x.float(), norm_weight, eps))        # [..., B, 32], [..., B, 1]
    v = values.double().reshape(values.shape[0], -1, BLOCK)                    # [N, B, 32]
    dots = torch.einsum("...bi,nbi->...nb", q.double(), v)                     # exact integers
    dx = d.squeeze(-1).double().unsqueeze(-2)                                   # [..., 1, B]
    y = (dots * scales.double() * dx).sum(-1)
    if mins is not None:                                                        # m x the block's quantized sum
        y = y + (mins.double() * dx * q.double().sum(-1).unsqueeze(-2)).sum(-1)
    if bias is not None:
        y = y + bias.double()
    if residual is not None:
        y = y + residual.double()
    return y.to(x.dtype)


def linear_q4_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                        norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                        mins: torch.Tensor | None = None) -> torch.Tensor:
    d = scales.float()
    m = -8.0 * d if mins is None else mins.float()       # without mins: W = d * (u - 8)
    return _block_linear_reference(x, unpack_nibbles(weight), d, m, bias, residual, norm_weight, eps)


def linear_q8_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                        norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                        mins: torch.Tensor | None = None) -> torch.Tensor:
    return _block_linear_reference(x, unpack_int8(weight), scales.float(), None if mins is None else mins.float(),
                                   bias, residual, norm_weight, eps)


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Rows of gate and up [H, ...] → [2H, ...] alternating in groups of SWIGLU_GROUP."""
    h = gate.shape[0]
    if h % SWIGLU_GROUP or up.shape != gate.shape:
        raise ValueError(f"gate/up of {h} rows do not split into groups of {SWIGLU_GROUP}")
    g = gate.reshape(h // SWIGLU_GROUP, 1, SWIGLU_GROUP, *gate.shape[1:])
    u = up.reshape(h // SWIGLU_GROUP, 1, SWIGLU_GROUP, *up.shape[1:])
    return torch.cat([g, u], dim=1).reshape(2 * h, *gate.shape[1:]).contiguous()


def _swiglu(both: torch.Tensor) -> torch.Tensor:
    """[..., 2H] gate and up interleaved in groups → silu(gate) * up [..., H]."""
    pairs = both.reshape(*both.shape[:-1], -1, 2, SWIGLU_GROUP)
    out = torch.nn.functional.silu(pairs[..., 0, :]) * pairs[..., 1, :]
    return out.reshape(*both.shape[:-1], -1)


def swiglu_q4_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                        norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                        mins: torch.Tensor | None = None) -> torch.Tensor:
    return _swiglu(linear_q4_reference(x, weight, scales, norm_weight=norm_weight, eps=eps, mins=mins))


def swiglu_q8_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                        norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                        mins: torch.Tensor | None = None) -> torch.Tensor:
    return _swiglu(linear_q8_reference(x, weight, scales, norm_weight=norm_weight, eps=eps, mins=mins))


def _register(name: str, reference, out_width) -> None:
    """The eager (reference) and fake kernels of `name` and `name.out`."""
    @torch.library.impl(_LIB, name, "CompositeExplicitAutograd")
    def _op(*args, **kwargs):
        return reference(*args, **kwargs)

    @torch.library.impl(_LIB, f"{name}.out", "CompositeExplicitAutograd")
    def _op_out(*args, out, **kwargs):
        ref = reference(*args, **kwargs)
        out.resize_(ref.shape).copy_(ref)
        return out

    @torch.library.register_fake(f"modelexport::{name}")
    def _fake(x, weight, *args, **kwargs):
        return x.new_empty((*x.shape[:-1], out_width(weight)))

    @torch.library.register_fake(f"modelexport::{name}.out")
    def _fake_out(*args, out, **kwargs):
        return out


_register("linear_q4", linear_q4_reference, lambda w: w.shape[0])
_register("linear_q8", linear_q8_reference, lambda w: w.shape[0])
_register("swiglu_q4", swiglu_q4_reference, lambda w: w.shape[0] // 2)
_register("swiglu_q8", swiglu_q8_reference, lambda w: w.shape[0] // 2)


class _NormFirst(torch.nn.Module):
    """A module of ours that can take over the RMSNorm before it (its weight and eps)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("norm_weight", None)
        self.eps = 0.0

    def set_norm(self, weight: torch.Tensor, eps: float) -> None:
        self.norm_weight = weight.detach().float().contiguous()
        self.eps = float(eps)


GGUF_SCALE_TYPES = (torch.float16, torch.float32)   # a GGUF's scales: as stored, or products of two


def _gguf_scales(d: torch.Tensor) -> torch.Tensor:
    if d.dtype not in GGUF_SCALE_TYPES:
        raise ValueError(f"GGUF block scales are float16 or float32, not {d.dtype}")
    return d.contiguous()


def _set_mins(module: torch.nn.Module, mins: torch.Tensor | None) -> None:
    """Mins of the scales' type (the kernel reads both alike)."""
    if mins is None:
        module.mins = None
    else:
        module.register_buffer("mins", mins.to(module.scales.dtype).contiguous())


class Q4Linear(_NormFirst):
    """A Linear whose weight is 4-bit per block of 32, run by our kernel: from our own
    symmetric quantization (`quantize_weight(w, 4, 32)`: values in -8..7, bfloat16 scales) or
    from a GGUF's blocks as stored (`from_blocks`). `set_norm` gives it the RMSNorm that precedes
    it, `forward(x, residual)` adds the residual stream to its output."""

    def __init__(self, weight_q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight", pack_int4(weight_q))                       # uint8 [N, K/2]
        self.register_buffer("scales", scales.to(torch.bfloat16).contiguous())    # [N, K/32]
        self.mins = None   # a plain attribute, not a None buffer (torch.export miscounts those on its root)
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())
        self.in_features, self.out_features = weight_q.shape[1], weight_q.shape[0]

    @classmethod
    def from_blocks(cls, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, bias: torch.Tensor | None):
        """GGUF Q4_0 (m None: W = d (u - 8)) or Q4_1 / Q4_K (W = d u + m) blocks: qs uint8 [N, K/2]
        in Q4_0's nibble order, d and m [N, K/32] float16 (as a Q4_0/Q4_1 file stores them) or
        float32 (Q4_K's products of two scales, exact in float32)."""
        self = cls.__new__(cls)
        _NormFirst.__init__(self)
        self.register_buffer("weight", qs.contiguous())
        self.register_buffer("scales", _gguf_scales(d))
        _set_mins(self, m)
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())
        self.in_features, self.out_features = qs.shape[1] * 2, qs.shape[0]
        return self

    def forward(self, x, residual=None):
        return torch.ops.modelexport.linear_q4(x.contiguous(), self.weight, self.scales, self.bias,
                                               None if residual is None else residual.contiguous(),
                                               self.norm_weight, self.eps, self.mins)


class Q8Linear(_NormFirst):
    """A Linear whose weight is 8-bit values per block of 32 with a scale each (float16 or
    float32), and optionally a min each: a GGUF's Q8_0, Q5_0, Q5_1 or Q5_K blocks as stored."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None, mins: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("weight", pack_int8(q))                               # int8 [N, K]
        self.register_buffer("scales", _gguf_scales(d))                            # [N, K/32]
        _set_mins(self, mins)
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())
        self.in_features, self.out_features = q.shape[1], q.shape[0]

    def forward(self, x, residual=None):
        return torch.ops.modelexport.linear_q8(x.contiguous(), self.weight, self.scales, self.bias,
                                               None if residual is None else residual.contiguous(),
                                               self.norm_weight, self.eps, self.mins)


class Q4GateUp(_NormFirst):
    """silu(gate(x)) * up(x) of a SwiGLU MLP in one call: both weights interleaved, 4-bit (ours,
    or a GGUF's 4-bit blocks) or 8-bit (`from_linears` of two `Q8Linear`s: swiglu_q8)."""

    def __init__(self, gate_q: torch.Tensor, gate_scales: torch.Tensor, up_q: torch.Tensor, up_scales: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", pack_int4(interleave_gate_up(gate_q, up_q)))
        self.register_buffer("scales", interleave_gate_up(gate_scales, up_scales).to(torch.bfloat16).contiguous())
        self.mins = None
        self.eight_bit = False

    @staticmethod
    def fits(gate, up) -> bool:
        """Whether `from_linears` takes these two: both of one kernel's module, stored alike, no bias."""
        return (type(gate) is type(up) and isinstance(gate, (Q4Linear, Q8Linear)) and gate.bias is None
                and up.bias is None and (gate.mins is None) == (up.mins is None) and gate.scales.dtype == up.scales.dtype)

    @classmethod
    def from_linears(cls, gate, up):
        """Two `Q4Linear`s or two `Q8Linear`s of the same layout (no bias) → one: their stored
        blocks interleaved."""
        if not cls.fits(gate, up):
            raise ValueError("gate and up are not stored alike")
        self = cls.__new__(cls)
        _NormFirst.__init__(self)
        self.eight_bit = isinstance(gate, Q8Linear)
        self.register_buffer("weight", interleave_gate_up(gate.weight, up.weight))
        self.register_buffer("scales", interleave_gate_up(gate.scales, up.scales))
        _set_mins(self, None if gate.mins is None else interleave_gate_up(gate.mins, up.mins))
        return self

    def forward(self, x):
        op = torch.ops.modelexport.swiglu_q8 if self.eight_bit else torch.ops.modelexport.swiglu_q4
        return op(x.contiguous(), self.weight, self.scales, self.norm_weight, self.eps, self.mins)


def _swiglu_forward(self, x):
    return self.w2(self.gate_up(x))


def fuse_swiglu(model: torch.nn.Module, quantize) -> int:
    """Give every ExecuTorch `FeedForward` (w2(silu(w1 x) * w3 x)) one `Q4GateUp` for w1 and w3;
    `quantize(linear)` → a `Q4Linear` or `Q8Linear` (gate and up not alike: that MLP stays as it
    is; so does one whose activation is not silu, `FeedForward.activation`: row_patches.set_activation).
    Returns how many MLPs were fused."""
    from executorch.examples.models.llama.feed_forward import FeedForward

    done = 0
    for m in model.modules():
        if (type(m) is FeedForward and getattr(m, "activation", "silu") == "silu"
                and m.w1.out_features % SWIGLU_GROUP == 0 and m.w1.in_features % BLOCK == 0):
            gate, up = quantize(m.w1), quantize(m.w3)
            if not Q4GateUp.fits(gate, up):
                continue
            m.gate_up = Q4GateUp.from_linears(gate, up)
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


def _rms_factor(norm) -> torch.Tensor | None:
    """What an ExecuTorch RMSNorm multiplies by (w, or 1 + w for Gemma's), None for anything else."""
    from executorch.examples.models.llama.norm import RMSNorm

    if type(norm) is not RMSNorm:
        return None
    w = norm.weight.detach().float()
    return 1.0 + w if norm.add_unit_offset else w


def _mlp_inputs(ff) -> list:
    """The projections reading an MLP's input, if all are ours: gate|up fused, or gate and up
    apart (a GeGLU MLP: the fused kernel's activation is silu); else []."""
    if isinstance(getattr(ff, "gate_up", None), Q4GateUp):
        return [ff.gate_up]
    ours = (Q4Linear, Q8Linear)
    w1, w3 = getattr(ff, "w1", None), getattr(ff, "w3", None)
    return [w1, w3] if isinstance(w1, ours) and isinstance(w3, ours) else []


def fuse_blocks(model: torch.nn.Module) -> int:
    """In every plain Llama block whose projections are ours (fused q|k|v, o, gate|up, down), move
    the two RMSNorms and the two residual adds into those calls: a block then has no elementwise
    op left outside our kernels but RoPE (one XNNPACK partition per layer instead of four). The
    model's final norm goes into its output projection likewise. Returns how many blocks were
    fused."""
    from executorch.examples.models.llama.llama_transformer import TransformerBlock

    ours = (Q4Linear, Q8Linear)     # both take the norm before them and the residual after

    done = 0
    for b in model.modules():
        a, ff = getattr(b, "attention", None), getattr(b, "feed_forward", None)
        if not (type(b) is TransformerBlock and b.mlp_type == "default" and not b.use_residual_gate
                and not hasattr(b, "post_ffn_norm") and _rms_factor(b.attention_norm) is not None
                and _rms_factor(b.ffn_norm) is not None
                and isinstance(getattr(a, "wqkv", None), ours) and isinstance(a.wo, ours)
                and isinstance(getattr(ff, "gate_up", None), Q4GateUp) and isinstance(ff.w2, ours)):
            continue
        a.wqkv.set_norm(_rms_factor(b.attention_norm), b.attention_norm.eps)
        ff.gate_up.set_norm(_rms_factor(b.ffn_norm), b.ffn_norm.eps)
        b.attention_norm = b.ffn_norm = torch.nn.Identity()
        b.forward = types.MethodType(_fused_block_forward, b)
        done += 1
    _final_norm_into_output(model, done)
    return done


def fuse_input_norms(model: torch.nn.Module) -> int:
    """In every sandwich block (Gemma: the attention and MLP outputs are normed before the
    residual adds, so those adds cannot go into o and down), move the two input RMSNorms into the
    projections after them: q|k|v, and gate|up (or gate and up, each computing the norm, for a
    GeGLU MLP). The final norm goes into the output projection. Returns how many blocks."""
    from executorch.examples.models.llama.llama_transformer import TransformerBlock

    done = 0
    for b in model.modules():
        a, ff = getattr(b, "attention", None), getattr(b, "feed_forward", None)
        if not (type(b) is TransformerBlock and hasattr(b, "post_attention_norm")
                and isinstance(getattr(a, "wqkv", None), (Q4Linear, Q8Linear)) and _mlp_inputs(ff)
                and _rms_factor(b.attention_norm) is not None and _rms_factor(b.ffn_norm) is not None):
            continue
        a.wqkv.set_norm(_rms_factor(b.attention_norm), b.attention_norm.eps)
        for m in _mlp_inputs(ff):
            m.set_norm(_rms_factor(b.ffn_norm), b.ffn_norm.eps)
        b.attention_norm = b.ffn_norm = torch.nn.Identity()
        done += 1
    _final_norm_into_output(model, done)
    return done


def _final_norm_into_output(model, blocks_fused: int) -> None:
    norm = getattr(model, "norm", None)
    if blocks_fused and isinstance(getattr(model, "output", None), (Q4Linear, Q8Linear)) and _rms_factor(norm) is not None:
        model.output.set_norm(_rms_factor(norm), norm.eps)    # the final norm, into the lm_head
        model.norm = torch.nn.Identity()
