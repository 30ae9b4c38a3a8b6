"""`--rewrite topk-last-dim`: topk over a dimension other than the last → transpose it last,
topk there, transpose values and indices back.

Measured (docs/op_support.md, row `topk_other`): ExecuTorch's QNN op builder refuses topk on any
dimension but the last ("QNN currently only supports channel as dimension for topK"), at every
precision; the transposed form (permute, topk, permute) is taken by the HTP. The indices are
transposed as int32 (the HTP's Transpose refuses INT_64, measured) and widened back. Exact: same
values, same indices.
"""
from __future__ import annotations

import operator

from . import rewrite_pass


@rewrite_pass("topk-last-dim", "topk over a non-last dim → transpose, topk over the last dim, transpose back",
              fixes=(("aten.topk.default", r"only supports channel as dimension"),))
def topk_last_dim(gm) -> int:
    import torch
    target = torch.ops.aten.topk.default
    n = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not target:
            continue
        x = node.args[0]
        rank = x.meta["val"].dim()
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1)
        dim = dim % rank
        if dim == rank - 1:
            continue
        k = node.args[1]
        largest = node.args[3] if len(node.args) > 3 else node.kwargs.get("largest", True)
        is_sorted = node.args[4] if len(node.args) > 4 else node.kwargs.get("sorted", True)
        g = gm.graph
        with g.inserting_before(node):
            xt = g.call_function(torch.ops.aten.transpose.int, (x, dim, rank - 1))
            new = g.call_function(target, (xt, k, -1, largest, is_sorted))
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                with g.inserting_after(user):
                    item = g.call_function(operator.getitem, (new, user.args[1]))
                if user.args[1] == 1:
                    # int64 indices: the HTP's Transpose refuses INT_64 (measured; it takes INT_32),
                    # so they are moved as int32 and widened again (exact below 2**31).
                    with g.inserting_after(item):
                        narrow = g.call_function(torch.ops.aten._to_copy.default, (item,), {"dtype": torch.int32})
                    with g.inserting_after(narrow):
                        moved = g.call_function(torch.ops.aten.transpose.int, (narrow, dim, rank - 1))
                    with g.inserting_after(moved):
                        back = g.call_function(torch.ops.aten._to_copy.default, (moved,), {"dtype": torch.int64})
                else:
                    with g.inserting_after(item):
                        back = g.call_function(torch.ops.aten.transpose.int, (item, dim, rank - 1))
                user.replace_all_uses_with(back)
                g.erase_node(user)
        if not node.users:
            g.erase_node(node)
        n += 1
    return n
