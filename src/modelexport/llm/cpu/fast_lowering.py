"""Lowering an LLM to XNNPACK without redoing work that does not change the result.

Where the time goes (profiled on tiny and SmolLM2 Llamas, 2 busy cores): the export is graph
bookkeeping, not arithmetic. A 64-wide Llama costs about as much per layer as the 576-wide
SmolLM2. Nearly all of it is re-tracing the graph with fake tensors, again and again: three
whole-program decompositions inside `to_edge_transform_and_lower`, the edge-dialect passes,
then for every XNNPACK partition the 17 XNNPACK passes of `XnnpackBackend.preprocess`, each a
re-trace of that partition, and finally `to_executorch`'s passes. Every op costs a few
milliseconds per re-trace, and torchao's `*_affine` quantization ops cost ~20 ops each (they
decompose on every trace), which is why `xnnpack_export` writes the quantized linears with
`quantized_decomposed` ops instead.

Two things here remove repeated work and keep the program byte-for-byte the same:

1. `fast_lowering()` memoizes XNNPACK preprocessing per partition *structure*. A decoder's
   layers give partitions identical except for their weights: the first of a structure goes
   through the real passes, keeping the transformed program; the next ones reuse that graph
   with their own weights and debug handles bound in, and only the node visitors (which
   serialize the XNNPACK graph and pack the weights) run. It falls back to the real pipeline
   whenever it cannot prove the reuse exact: the passes created or folded constants, a
   constant is held as a graph attribute, or the structures differ in any op, argument,
   shape, dtype or input kind.
2. `to_edge_one_decomposition()` decomposes the program once instead of three times when every
   op the partitioner wants kept passes its check (else the standard path runs).

`tests/test_llm_generate_cpu.py` checks that the programs are identical with and without
these; `bench/results/llm_cpu_decode.json` records the times.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
_LOCK = threading.Lock()


@dataclass
class LoweringStats:
    partitions: int = 0
    reused: int = 0
    fallbacks: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"partitions": self.partitions, "reused": self.reused, "fallbacks": self.fallbacks,
                "fallback_reasons": dict(self.reasons)}


@dataclass
class _Template:
    post_ep: Any                      # the partition after the XNNPACK passes
    pre_targets: list[str]            # input-spec targets (constants) of the pre-pass partition, in order
    pre_kinds: list[str]
    handle_index: dict[int, int]      # debug handle -> index of the pre-pass node that carried it
    compile_specs: Any


def _spec_kind(spec) -> str:
    return getattr(spec.kind, "name", str(spec.kind))


def _describe(v) -> Any:
    """A hashable, weight-free description of a node argument / meta value."""
    import torch
    if isinstance(v, torch.fx.Node):
        return ("node", v._idx)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_describe(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((str(k), _describe(x)) for k, x in v.items())))
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(str(s) for s in v.shape), str(v.dtype))
    if isinstance(v, (int, float, bool, str, type(None))):
        return v
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v)
    return (type(v).__name__, str(v))


def structure_key(ep, compile_specs) -> str | None:
    """A digest of everything about a partition except its weights' values; None if it holds
    constants the key cannot see (graph attributes)."""
    import torch
    gm = ep.graph_module
    nodes = list(gm.graph.nodes)
    for i, n in enumerate(nodes):
        n._idx = i
    kinds = {s.arg.name: _spec_kind(s) for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    h = hashlib.sha256()
    try:
        for n in nodes:
            if n.op == "get_attr":
                attr = getattr(gm, n.target, None)
                if isinstance(attr, torch.Tensor):
                    return None
            val = n.meta.get("val")
            item = (n.op, str(n.target) if n.op != "placeholder" else kinds.get(n.name, "?"),
                    _describe(n.args), _describe(n.kwargs), _describe(val))
            h.update(repr(item).encode())
        for s in compile_specs:
            h.update(s.key.encode() + b"=" + bytes(s.value))
    finally:
        for n in nodes:
            del n._idx
    return h.hexdigest()


def _constants_of(ep) -> tuple[list[str], list[str]]:
    targets, kinds = [], []
    for s in ep.graph_signature.input_specs:
        k = _spec_kind(s)
        if k in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            targets.append(s.target)
            kinds.append(k)
    return targets, kinds


def _tensor(ep, target: str):
    if target in ep.state_dict:
        return ep.state_dict[target]
    return ep.constants[target]


def _run_passes(edge_program, compile_specs):
    """The first half of `XnnpackBackend.preprocess`: the same ExportedProgram wrapper and passes."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager
    from executorch.backends.xnnpack._passes.convert_to_linear import ConvertToLinearPass
    from executorch.backends.xnnpack.utils.configs import get_xnnpack_edge_compile_config
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
    from torch.export.exported_program import ExportedProgram

    ep = ExportedProgram(
        root=edge_program.graph_module, graph=edge_program.graph, graph_signature=edge_program.graph_signature,
        state_dict=edge_program.state_dict, range_constraints=edge_program.range_constraints,
        module_call_graph=edge_program.module_call_graph, example_inputs=edge_program.example_inputs,
        constants=edge_program.constants,
        verifiers=[EXIREdgeDialectVerifier(edge_compile_config=get_xnnpack_edge_compile_config(), class_only=True)])
    passes = [ConvertToLinearPass for s in compile_specs if s.key == "dqlinear_partitioner"] or None
    return XNNPACKPassManager(ep, passes=passes).transform()


def _serialize(ep):
    """The second half of `XnnpackBackend.preprocess`: node visitors → XNNPACK flatbuffer + named data."""
    from executorch.backends.xnnpack.operators.node_visitor import get_node_visitors
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import ConstantDataOffset, XNNGraph
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import serialize_xnnpack_binary
    from executorch.backends.xnnpack.xnnpack_preprocess import DEFAULT_DEBUG_HANDLE, generate_node_to_external_map
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.backend_details import PreprocessResult

    named_data_store = NamedDataStore()
    graph_module = ep.graph_module
    node_to_external_map = generate_node_to_external_map(ep, graph_module)
    vals_to_ids: dict = {}
    xnnpack_graph = XNNGraph(version="0", xnodes=[], xvalues=[], num_externs=len(node_to_external_map),
                             input_ids=[], output_ids=[], constant_data=[ConstantDataOffset(0, 0)])
    node_visitors = get_node_visitors(ep, node_to_external_map, named_data_store)
    for node in graph_module.graph.nodes:
        if node.op == "call_function":
            name = node.target.__name__
            if name not in node_visitors:
                raise RuntimeError(f"For {node}, {node.op}:{name} is not supported in XNNPACK Delegate")
            node_visitors[name].define_node(node, xnnpack_graph, vals_to_ids,
                                            node.meta.get("debug_handle", DEFAULT_DEBUG_HANDLE))
        elif node.op not in ("get_attr", "placeholder", "output"):
            raise RuntimeError(f"{node.op} is not supported in XNNPACK")
    return PreprocessResult(processed_bytes=serialize_xnnpack_binary(xnnpack_graph, bytearray()),
                            debug_handle_map={}, data_store_output=named_data_store.get_named_data_store_output())


class _Memo:
    def __init__(self):
        self.templates: dict[str, _Template | None] = {}   # None: this structure cannot be reused
        self.stats = LoweringStats()

    def _fallback(self, reason: str) -> None:
        self.stats.fallbacks += 1
        self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1

    def preprocess(self, edge_program, compile_specs):
        import torch
        self.stats.partitions += 1
        key = structure_key(edge_program, compile_specs)
        if key is None:
            self._fallback("graph attribute constants")
            return _serialize(_run_passes(edge_program, compile_specs))
        tpl = self.templates.get(key, "missing")
        if tpl == "missing":
            pre_nodes = list(edge_program.graph_module.graph.nodes)
            handle_index = {n.meta["debug_handle"]: i for i, n in enumerate(pre_nodes) if "debug_handle" in n.meta}
            pre_targets, pre_kinds = _constants_of(edge_program)
            post = _run_passes(edge_program, compile_specs)
            post_targets, _ = _constants_of(post)
            attrs = [n for n in post.graph_module.graph.nodes
                     if n.op == "get_attr" and isinstance(getattr(post.graph_module, n.target, None), torch.Tensor)]
            if set(post_targets) - set(pre_targets) or attrs:
                self.templates[key] = None      # the passes made constants of their own
                self._fallback("passes created constants")
            else:
                self.templates[key] = _Template(copy.deepcopy(post), pre_targets, pre_kinds, handle_index, compile_specs)
            return _serialize(post)
        if tpl is None:
            self._fallback("passes created constants")
            return _serialize(_run_passes(edge_program, compile_specs))
        new_targets, new_kinds = _constants_of(edge_program)
        if new_kinds != tpl.pre_kinds:
            self._fallback("constant kinds differ")
            return _serialize(_run_passes(edge_program, compile_specs))
        self.stats.reused += 1
        return _serialize(_rebind(tpl, edge_program, new_targets))


def _rebind(tpl: _Template, edge_program, new_targets: list[str]):
    """The template's transformed partition with this partition's weights and debug handles."""
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
    from executorch.backends.xnnpack.utils.configs import get_xnnpack_edge_compile_config
    from torch.export.exported_program import ExportedProgram

    post = tpl.post_ep
    gm = copy.deepcopy(post.graph_module)
    by_template = dict(zip(tpl.pre_targets, new_targets))
    state_dict, constants = {}, {}
    for s in post.graph_signature.input_specs:
        k = _spec_kind(s)
        if k in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            t = _tensor(edge_program, by_template[s.target])
            (constants if s.target in post.constants else state_dict)[s.target] = t
    new_pre = list(edge_program.graph_module.graph.nodes)
    for n in gm.graph.nodes:
        h = n.meta.get("debug_handle")
        if h in tpl.handle_index:
            n.meta["debug_handle"] = new_pre[tpl.handle_index[h]].meta.get("debug_handle", h)
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=post.graph_signature, state_dict=state_dict,
        range_constraints=post.range_constraints, module_call_graph=post.module_call_graph,
        example_inputs=post.example_inputs, constants=constants,
        verifiers=[EXIREdgeDialectVerifier(edge_compile_config=get_xnnpack_edge_compile_config(), class_only=True)])


_active: list[_Memo] = []


@contextmanager
def fast_lowering(enabled: bool = True):
    """Within this block XNNPACK preprocessing reuses per-structure pass results; yields the
    `LoweringStats` (None when disabled)."""
    if not enabled:
        yield None
        return
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    with _LOCK:
        memo = _Memo()
        original = XnnpackBackend.__dict__["preprocess"]
        XnnpackBackend.preprocess = staticmethod(memo.preprocess)
        try:
            yield memo.stats
        finally:
            XnnpackBackend.preprocess = original
            log.info("XNNPACK lowering: %s", memo.stats.to_dict())


# --------------------------------------------------------------------------------------------
def to_edge_one_decomposition(ep, partitioner, config, constant_methods):
    """`to_edge_transform_and_lower(ep, [partitioner])` with one decomposition pass instead of three.

    ExecuTorch decomposes the whole program three times for a partitioner that checks op
    support (functionalize; decompose all but the partitioner's ops; hide the kept ops,
    decompose again, restore them). When every node of a kept op passes the partitioner's check,
    one decomposition with the kept ops left out of the table gives the same graph. Returns
    None (use the standard path) when some node fails the check.
    """
    from executorch.exir.program._program import (EdgeProgramManager, _default_decomposition_table,
                                                  _generate_edge_program, _remove_invalid_ops_for_not_decompose)

    ops, check = partitioner.ops_to_not_decompose(ep)
    ops = _remove_invalid_ops_for_not_decompose(list(ops))
    table = _default_decomposition_table()
    for op in ops:
        table.pop(op, None)
    for op in config.preserve_ops:
        table.pop(op, None)
    program = ep.run_decompositions(table)
    _, check = partitioner.ops_to_not_decompose(program)
    kept = set()
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target in ops:
            if check is not None and not check(node):
                return None
            kept.add(node.target)
    edge = _generate_edge_program(config, program, preserve_ops=list(kept))
    config._core_aten_ops_exception_list = list(set(config._core_aten_ops_exception_list) | kept)
    manager = EdgeProgramManager({"forward": edge}, constant_methods, config, list(kept))
    # to_backend() on a manager built this way is what to_edge_transform_and_lower does inside;
    # the partitioner's warning about the old to_edge()+to_backend() workflow does not apply
    plog = logging.getLogger("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    level = plog.level
    plog.setLevel(logging.ERROR)
    try:
        return manager.to_backend({"forward": partitioner})
    finally:
        plog.setLevel(level)
