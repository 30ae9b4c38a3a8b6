"""Which op makes QNN fail to build a partition that its partitioner accepted.

The partitioner validates one op at a time; a partition can still fail when QNN prepares the
whole graph (an fp16 MultiheadAttention: `genNopWithScaleParamsFP16 ... mismatched scale and bias
dimensions`). The op is found by bisection with the real lowering: delegate only the first k
accepted nodes (the rest are skipped, left to the CPU) and find the smallest k that fails; the
k-th node is the culprit. Its partition is named as ExecuTorch's partitioner forms it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ...frontends.module_paths import fx_module_path
from .lower import is_qdq
from .partition import op_name


@dataclass
class LoweringBlocker:
    node: str
    op: str
    module_path: str | None
    partition: int | None            # index among the QNN partitions of the whole graph (graph order)
    partitions: int
    partition_modules: list[str] = field(default_factory=list)
    qnn_said: str | None = None
    lowerings: int = 0               # how many lowerings the bisection took
    inputs_chain: list[str] = field(default_factory=list)   # the ops feeding it, nearest first


def qnn_partitions(edge_program, accepted: set[str]) -> list[list[str]]:
    """The node names of each partition ExecuTorch would form from the accepted nodes."""
    from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import \
        generate_partitions_from_list_of_nodes
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Accepted(OperatorSupportBase):
        def is_node_supported(self, _, node) -> bool:
            return node.name in accepted

    parts = generate_partitions_from_list_of_nodes(edge_program.graph_module, op_support=Accepted())
    order = {n.name: i for i, n in enumerate(edge_program.graph_module.graph.nodes)}
    named = [sorted((n.name for n in p.nodes), key=order.get) for p in parts]
    return sorted(named, key=lambda p: order.get(p[0], 0))


def bisect_lowering(candidates: list[str], fails: Callable[[set[str]], str | None],
                    known: str | None = None) -> tuple[int, str | None, int] | None:
    """(index of the culprit in `candidates`, QNN's words, lowerings run), where
    `fails(skip) -> error or None` lowers with the nodes in `skip` kept off QNN. None when
    delegating every candidate works. `known`: the error of delegating them all, already seen."""
    runs = 0
    said: dict[int, str | None] = {len(candidates): known} if known else {}

    def bad(k: int) -> bool:
        nonlocal runs
        runs += 1
        err = fails(set(candidates[k:]))
        said[k] = err
        return err is not None

    lo, hi = 1, len(candidates)
    if not candidates or not (known or bad(hi)):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if bad(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi - 1, said.get(hi), runs


def locate(edge_program, decisions, lower_part: Callable[[set[str]], str | None],
           known: str | None = None) -> LoweringBlocker | None:
    """The op (and its partition) that makes `lower_part(skip)` fail; `decisions` are the
    partitioner's, `edge_program` the audited (undelegated) graph, `known` the error of the
    whole graph's lowering when already seen."""
    nodes = {n.name: n for n in edge_program.graph_module.graph.nodes}
    accepted = [name for name, n in nodes.items()
                if n.op == "call_function" and decisions.get(name) and decisions[name].supported]
    # Only compute ops are culprits: (de)quantize nodes stay with the ops around them.
    compute = [name for name in accepted if not is_qdq(nodes[name].target)]
    qdq = {name for name in accepted if is_qdq(nodes[name].target)}
    found = bisect_lowering(compute, lambda skip: lower_part(skip | {q for q in qdq if _only_serves(nodes[q], skip)}),
                            known)
    if found is None:
        return None
    i, said, runs = found
    culprit = nodes[compute[i]]
    parts = qnn_partitions(edge_program, set(accepted))
    index = next((p for p, names in enumerate(parts) if culprit.name in names), None)
    modules = list(dict.fromkeys(m for m in (fx_module_path(nodes[x]) for x in parts[index]) if m)) if index is not None else []
    return LoweringBlocker(culprit.name, op_name(culprit.target), fx_module_path(culprit), index, len(parts),
                           modules, said, runs, _chain(culprit))


def _chain(node, depth: int = 4) -> list[str]:
    """`aten.view_copy.default (mha)` for each op up its first input: the failure is often the
    culprit together with what feeds it (a reshape after a linear with bias)."""
    out = []
    while depth and node.all_input_nodes:
        node = node.all_input_nodes[0]
        if node.op != "call_function":
            break
        path = fx_module_path(node)
        out.append(f"{op_name(node.target)}" + (f" ({path})" if path else ""))
        depth -= 1
    return out


def _only_serves(node, skip: set[str]) -> bool:
    """A (de)quantize node whose compute neighbours are all skipped goes with them."""
    near = [n for n in list(node.users) + list(node.all_input_nodes)
            if n.op == "call_function" and not is_qdq(n.target)]
    return bool(near) and all(n.name in skip for n in near)
