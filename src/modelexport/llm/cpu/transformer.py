"""HF model → ExecuTorch's `Transformer` for the CPU program (steps 1, 2 and 4 of export.py's list:
export.py quantizes, exports and lowers what `build_transformer` returns).

Names and arguments per family row come from `hf_layout.py`; what a row needs beyond ExecuTorch's
blocks from `row_patches.py`. The RoPE tables are the HF model's own (`inv_freq` /
`attention_scaling`); RMSNorm and RoPE are rewritten with ops XNNPACK takes at a dynamic sequence
length, and after `torch.export` `views_with_one_inferred_dim` gives views one inferred dim.
"""
from __future__ import annotations

import types

from ...core.errors import UnsupportedError
from ...frontends.llm_families import BY_MODEL_TYPE, rope_parameters
from . import row_patches
from .hf_layout import meta_state_dict, model_args_from_hf, nope_layers
from .kernels.sdpa_op import ExplicitScores, fuse_qkv_attention


def _hf_rope_tables(hf_model, max_seq_len: int, head_dim: int, slot: str = ""):
    """cos/sin [max_seq_len, head_dim] exactly as the HF model computes them for positions 0..n-1,
    of one layer type's table (`slot`, Gemma 3) or the model's one table (""). A partial rotary
    table (Phi-4-mini: 3/4 of the head) is padded with cos 1, sin 0: the dims past it then pass
    through RoPE unchanged, as HF passes them around it."""
    import torch

    rot = hf_model.model.rotary_emb
    pos = torch.arange(max_seq_len).unsqueeze(0)
    dummy = torch.zeros(1, 1, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = rot(dummy, pos, slot) if slot else rot(dummy, pos)
    cos, sin = cos[0].float(), sin[0].float()
    rotary = cos.shape[-1]
    if rotary > head_dim or rotary % 2:
        raise UnsupportedError(f"a RoPE table of {rotary} dims does not fit a head of {head_dim}")
    pad = head_dim - rotary
    cos = torch.cat([cos, torch.ones(max_seq_len, pad)], dim=-1)
    sin = torch.cat([sin, torch.zeros(max_seq_len, pad)], dim=-1)
    return cos.contiguous(), sin.contiguous(), rotary


def _no_rope():
    """RoPE of a layer without position encoding (SmolLM3's NoPE layers): q and k as they are.
    (ExecuTorch's `no_rope_layer_interval` is a ModelArgs field its attention does not read.)"""
    import torch

    class NoRope(torch.nn.Module):
        is_identity = True    # what kernels/sdpa_op.fuse_qkv_attention looks for

        def forward(self, q, k, freqs_cos, freqs_sin):
            return q, k

    return NoRope()


def build_transformer(hf_model, max_seq_len: int, attention: str = "native"):
    """ExecuTorch's `Transformer` holding the HF model's weights, with custom SDPA + KV-cache ops,
    and what its row needs beyond ExecuTorch's blocks (`row_patches.py`).
    `model.kernel_plan` says which of our fusions each layer got (llm.json's `kernels`)."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.source_transformation.custom_kv_cache import \
        replace_kv_cache_with_custom_kv_cache
    from executorch.examples.models.llama.source_transformation.sdpa import replace_sdpa_with_custom_op

    cfg = hf_model.config
    family = BY_MODEL_TYPE[cfg.model_type]
    args = model_args_from_hf(cfg, max_seq_len)
    with torch.device("meta"):
        model = construct_transformer(args)
        if family.sandwich_norms:
            row_patches.add_sandwich_norms(model, args)
    sd = meta_state_dict(hf_model, args)
    _missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    still_meta = [n for n, p in model.named_parameters() if p.is_meta]
    if still_meta or unexpected:
        raise UnsupportedError(f"the weights do not fit ExecuTorch's Llama layout: missing {still_meta[:4]}, "
                               f"unexpected {unexpected[:4]}")
    meta_bufs = [n for n, b in model.named_buffers() if b.is_meta]
    if meta_bufs:  # ExecuTorch makes its buffers (caches, masks, RoPE) on the CPU explicitly
        raise UnsupportedError(f"ExecuTorch's Transformer left buffers uninitialized: {meta_bufs[:4]}")
    slots = sorted(rope_parameters(family, cfg)) if family.rope_per_layer_type else [""]
    tables = {slot: _hf_rope_tables(hf_model, max_seq_len, args.head_dim, slot) for slot in slots}
    rotaries = {rotary for _, _, rotary in tables.values()}
    if len(rotaries) != 1:
        raise UnsupportedError(f"the layer types' RoPE tables rotate different dims {sorted(rotaries)}")
    (rotary,) = rotaries
    if tuple(model.rope.freqs_cos.shape) != tuple(tables[slots[0]][0].shape):
        raise UnsupportedError(f"RoPE table shape {tuple(tables[slots[0]][0].shape)} does not fit "
                               f"{tuple(model.rope.freqs_cos.shape)}")
    row_patches.per_slot_rope(model, family, cfg, {s: t[:2] for s, t in tables.items()})
    nope = nope_layers(cfg)
    for i in nope:
        model.layers[i].attention.rope = _no_rope()
    activation = row_patches.activation_of(family, cfg)
    row_patches.set_activation(model, activation)
    ends = row_patches.scale_embeddings_and_cap_logits(model, hf_model, family)
    scores, fold = row_patches.scores_plan(family, cfg, args.head_dim, max_seq_len, bool(args.use_qk_norm))
    if fold != 1.0:
        row_patches.fold_query_scale_into_q_norm(model, fold)
    _xnnpack_friendly_norms_and_rope(model, args, rotary)
    model = replace_sdpa_with_custom_op(model)
    model = replace_kv_cache_with_custom_kv_cache(model)
    plan = {"rotary_dims": rotary, "head_dim": args.head_dim, "nope_layers": nope,
            "qk_norm": bool(args.use_qk_norm), "attention": "executorch", "activation": activation,
            "rope_tables": len(slots), **ends}
    explicit = [None if s is None else ExplicitScores(*s) for s in scores]
    if attention == "native" or any(e is not None for e in explicit):
        # the torch-ops scores live in our fused attention's forward, whatever `attention` asks
        if fuse_qkv_attention(model, explicit) != args.n_layers:
            raise UnsupportedError("this model's attention does not fit the native kernel",
                                   "build with attention='executorch' (CpuExportOptions)")
        plan["attention"] = "native: fused q|k|v" + (", q/k norms inside" if args.use_qk_norm else "")
        if any(e is not None for e in explicit):
            plan["scores_in_torch_ops"] = [None if e is None else e.describe() for e in explicit]   # per layer
    model.kernel_plan = plan
    return model.eval(), args


def _xnnpack_friendly_norms_and_rope(model, args, rotary: int) -> None:
    """Write RMSNorm and RoPE with ops XNNPACK takes with a dynamic sequence length.

    As ExecuTorch's Transformer writes them, XNNPACK rejects RMSNorm's `mean` (it averages only
    the two inner dims of a 4-D tensor) and RoPE's slices and concat (dynamic shapes): they stay
    on ExecuTorch's portable kernels and cut every layer into ~7 XNNPACK partitions, each lowered
    separately (export time) and entered separately at run time (decode time). Here the mean is
    taken over a [1, n, d, 1] view (inner dims, keepdim) and rotate-half is a product with its
    constant signed-permutation matrix (over the first `rotary` dims; the rest are zero and their
    table entries cos 1, sin 0, so partial rotary needs no slice); together with
    `views_with_one_inferred_dim` a layer's ops between the KV-cache update and SDPA custom ops
    become one partition. Same arithmetic. (The mean as a product with a [1, d] row of 1/d has
    fewer XNNPACK ops but measured ~3% slower per decode step on SmolLM2.)
    """
    import torch
    import torch.nn.functional as F  # noqa: N812
    from executorch.examples.models.llama.norm import RMSNorm

    def norm(self, x):   # x: [1, d] (final norm), [1, n, d] (layers) or [1, n, heads, d] (q/k norms)
        d = x.shape[-1]
        x4 = x.reshape(1, -1, d, 1)
        y = x4 * torch.rsqrt((x4 * x4).mean((2, 3), keepdim=True) + self.eps)
        return y.reshape({2: (1, d), 3: (1, -1, d), 4: (1, -1, x.shape[-2], d)}[x.dim()])

    for m in model.modules():
        if type(m) is RMSNorm:
            m._norm = types.MethodType(norm, m)

    d = args.head_dim
    half = rotary // 2
    rot = torch.zeros(d, d)
    rot[torch.arange(half), torch.arange(half) + half] = -1.0    # out[j] = -x[j + r/2]  (j <  r/2)
    rot[torch.arange(half) + half, torch.arange(half)] = 1.0     # out[j] =  x[j - r/2]  (r/2 <= j < r)
    model.rope.register_buffer("rotate_half_matrix", rot, persistent=False)
    rope = model.rope

    def apply_rope(q, k, cos, sin):       # q, k: [1, n, heads, d]; cos, sin: [n, d]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        r = rope.rotate_half_matrix
        return q * cos + F.linear(q, r) * sin, k * cos + F.linear(k, r) * sin

    rope.apply_rotary_emb = apply_rope


def views_with_one_inferred_dim(ep) -> int:
    """`view(x, [1, s, 9, 64])` with a symbolic `s` → `view(x, [1, -1, 9, 64])`.

    XNNPACK lowers reshapes with one inferred (-1) dimension but not with a symbolic one, and
    ExecuTorch's attention writes `view(bsz, seqlen, ...)` with the traced sequence length.
    With the other dims static the two mean the same; returns how many views were rewritten."""
    import torch

    aten = torch.ops.aten
    n_done = 0
    for n in ep.graph_module.graph.nodes:
        if n.op == "call_function" and n.target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            shape = list(n.args[1])
            symbolic = [i for i, v in enumerate(shape) if not isinstance(v, int)]
            if len(symbolic) == 1 and -1 not in shape:
                shape[symbolic[0]] = -1
                n.args = (n.args[0], shape, *n.args[2:])
                n_done += 1
    if n_done:
        ep.graph_module.recompile()
    return n_done
