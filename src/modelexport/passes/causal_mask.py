"""`--rewrite causal-mask`: scaled_dot_product_attention(is_causal=True) → the same attention with
an explicit boolean causal mask held as a constant.

Measured (docs/op_support.md, row `sdpa`): with `is_causal=True` the decomposition builds the
mask at run time with `tril`, whose `aten.le.Scalar` has no QNN op builder in executorch 1.5.1
(to_be_implemented list), so it falls back to the CPU at every precision. Given the mask as a
constant `(L, S)` lower-triangular boolean tensor — exactly what is_causal means — every node
goes to the HTP. The result is identical: the same mask, computed once at export time.
"""
from __future__ import annotations

from . import rewrite_pass

SDPA = "aten.scaled_dot_product_attention.default"


def _is_causal(node) -> bool:
    if len(node.args) > 5:
        return bool(node.args[5])
    return bool(node.kwargs.get("is_causal", False))


@rewrite_pass("causal-mask", "scaled_dot_product_attention(is_causal=True) → explicit constant causal mask",
              fixes=(("aten.le.Scalar", r"tril|to_be_implemented"),))
def causal_mask(gm) -> int:
    import torch
    target = torch.ops.aten.scaled_dot_product_attention.default
    n = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not target or not _is_causal(node):
            continue
        attn_mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        if attn_mask is not None:
            continue  # torch refuses is_causal with a mask anyway
        q, k = node.args[0].meta["val"], node.args[1].meta["val"]
        L, S = int(q.shape[-2]), int(k.shape[-2])
        name = f"_modelexport_causal_mask_{L}x{S}"
        if not hasattr(gm, name):
            gm.register_buffer(name, torch.ones(L, S, dtype=torch.bool).tril(), persistent=False)
        with gm.graph.inserting_before(node):
            mask = gm.graph.get_attr(name)
        args = list(node.args[:3])
        kwargs = {k: v for k, v in node.kwargs.items() if k not in ("attn_mask", "is_causal")}
        rest = list(node.args[3:])
        if len(rest) > 1:        # positional dropout_p, is_causal, scale ...
            kwargs["dropout_p"] = rest[1]
        if len(rest) > 3:
            kwargs["scale"] = rest[3]
        node.args = tuple(args)
        node.kwargs = {**kwargs, "attn_mask": mask, "is_causal": False}
        n += 1
    return n
