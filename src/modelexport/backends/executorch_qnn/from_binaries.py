"""An ExecuTorch program whose methods call QNN context binaries compiled elsewhere.

ExecuTorch's own mechanism (`backends/qualcomm/utils/utils.py: from_context_binary`, what its
`qaihub_scripts` use for AI Hub's binaries): each pre-compiled graph becomes a custom op of the
`OpContextLoader` namespace whose node carries the binary; QnnBackend's preprocess hands that
binary through as the delegate's payload, and at run time the delegate executes the graph whose
name is the method's. Here a method may chain several binaries (an LLM split into parts, handing
tensors on by name), each in its own delegate, and the program gets constant methods (the metadata
LLM runners read). Two methods calling the same binary store it once (the emitter keys delegate
payloads by content).
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.passes import MemoryPlanningPass

from ...core.errors import InputError
from ...core.targets import SoC
from .lower import SEGMENT_ALIGNMENT
from .specs import compile_specs, qnn_ready

# QNN tensor dtypes (libQnnSystem's names) → torch's, for the graph IO a method passes
TORCH_DTYPES = {"UFIXED_POINT_8": "uint8", "UFIXED_POINT_16": "uint16", "INT_32": "int32", "UINT_32": "uint32",
                "FLOAT_32": "float32", "FLOAT_16": "float16", "INT_64": "int64", "BOOL_8": "bool",
                "UINT_8": "uint8", "UINT_16": "uint16", "INT_8": "int8", "INT_16": "int16"}


@dataclass(frozen=True)
class Io:
    name: str
    dtype: str                       # QNN's name (UFIXED_POINT_16, INT_32, FLOAT_32, ...)
    shape: tuple[int, ...]


@dataclass(frozen=True)
class BinaryCall:
    """One pre-compiled graph a method runs: its context binary (the graph named as the method; bytes, or
    a file read when its payload is made, so a large one is held once) and its IO in the graph's own order."""
    blob: bytes | Path
    inputs: tuple[Io, ...]
    outputs: tuple[Io, ...]


@dataclass(frozen=True)
class MethodPlan:
    """A method: its inputs and outputs in order (names of the calls' tensors), the graphs it runs in turn."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    calls: tuple[BinaryCall, ...]

    def io(self, name: str) -> Io:
        for call in self.calls:
            for t in (*call.inputs, *call.outputs):
                if t.name == name:
                    return t
        raise InputError(f"no graph of the method reads or writes {name!r}", "name the graphs' own tensors")


def build_program(methods: dict[str, MethodPlan], soc: SoC, out: Path, constants: dict | None = None) -> int:
    """The `.pte` at `out` (its size returned): each method of `methods`, plus a constant method per entry of
    `constants`. Written as ExecuTorch streams it: the program is never one block in memory."""
    with _caches_cleared():
        return _build_program(methods, soc, out, constants)


def _build_program(methods: dict[str, MethodPlan], soc: SoC, out: Path, constants: dict | None) -> int:
    qnn_ready()
    specs = compile_specs(soc, use_fp16=False, from_context_binary=True)
    ops = _define_ops(methods, specs)
    exported = {}
    for method, plan in methods.items():
        example = tuple(torch.zeros(plan.io(n).shape, dtype=_torch_dtype(plan.io(n).dtype)) for n in plan.inputs)
        exported[method] = torch.export.export(_Chain(plan, ops.namespace, ops.names[method]), example, strict=False)
    edge = to_edge(exported, constant_methods=constants or None,
                   compile_config=EdgeCompileConfig(_check_ir_validity=False))
    for method in methods:
        ops.attach(edge.exported_program(method))
    with _preprocess_globals_kept():
        lowered = edge.to_backend({m: OnePerCall(specs, ops.namespace) for m in methods})
    # IO not memory-planned: a runner binds its own buffers to the inputs and outputs (qnn_llama_runner's
    # set_outputs fails on a planned output), as ExecuTorch's Qualcomm LLM export plans them
    config = ExecutorchBackendConfig(extract_delegate_segments=True, segment_alignment=SEGMENT_ALIGNMENT,
                                     memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False,
                                                                             alloc_graph_output=False))
    program = lowered.to_executorch(config)
    with open(out, "wb") as f:
        program.write_to_file(f)
    return out.stat().st_size


@contextlib.contextmanager
def _preprocess_globals_kept():
    """QnnBackend's preprocess looks a context-binary op up with `eval(..., globals().update(torch.__dict__))`
    (executorch 1.5.1, qnn_preprocess.py), which leaves torch's names in that module for good: the next
    preprocess in the process then calls `torch.range` for `range`. Its globals are put back after each use."""
    from executorch.backends.qualcomm import qnn_preprocess   # deferred: after qnn_ready()
    saved = dict(vars(qnn_preprocess))
    try:
        yield
    finally:
        vars(qnn_preprocess).clear()
        vars(qnn_preprocess).update(saved)


@contextlib.contextmanager
def _caches_cleared():
    """Two process-wide caches keep what to_backend saw alive for the life of the process, and with it
    the context binaries in the nodes' meta: `exir.backend.utils.is_same_node` (an unbounded lru_cache,
    executorch 1.5.1) and torch's FakeTensor dispatch cache (its keys hold the lowered modules). A
    Llama-3.2-1B program's build left 2.2 GB held that way. Both are emptied after the build, and the
    graphs' reference cycles collected."""
    from executorch.exir.backend import utils as backend_utils
    from torch._subclasses.fake_tensor import FakeTensorMode
    try:
        yield
    finally:
        backend_utils.is_same_node.cache_clear()
        FakeTensorMode.cache_clear()
        gc.collect()


# The library the ops are defined in, one per namespace for the life of the process: a collected Library
# takes its ops out of the dispatcher while torch.ops still lists them, so a second program built from the
# same binaries in one process called a removed op (std::bad_alloc) instead of defining it again.
_LIBRARIES: dict[str, torch.library.Library] = {}


class _Ops:
    """The custom ops standing for the binaries: {method: [op name per call]} and {op name: payload}."""

    def __init__(self, namespace: str):
        self.namespace = namespace
        if namespace not in _LIBRARIES:
            _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
        self.library = _LIBRARIES[namespace]
        self.names: dict[str, list[str]] = {}
        self.payloads: dict[str, bytes] = {}

    def attach(self, program) -> None:
        from executorch.backends.qualcomm.builders.qnn_constants import OpContextLoader
        for node in program.graph.nodes:
            name = _op_name(node, self.namespace)
            if name in self.payloads:
                node.meta[OpContextLoader.meta_ctx_bin] = self.payloads[name]


def _define_ops(methods: dict[str, MethodPlan], specs: list) -> _Ops:
    from executorch.backends.qualcomm.builders.qnn_constants import OpContextLoader
    ops = _Ops(OpContextLoader.namespace)
    header = _payload_maker(specs)
    wrapped: dict[str, bytes] = {}     # one payload per binary: its header carries a signature of its own
    for method, plan in methods.items():
        ops.names[method] = []
        for i, call in enumerate(plan.calls):
            raw = call.blob if isinstance(call.blob, bytes) else call.blob.read_bytes()
            digest = hashlib.sha256(raw).hexdigest()
            name = f"mx_{method}_{i}_{digest[:16]}"
            ops.names[method].append(name)
            if name in ops.payloads:
                continue
            if digest not in wrapped:
                wrapped[digest] = header(raw)
            del raw
            ops.payloads[name] = wrapped[digest]
            if not hasattr(getattr(torch.ops, ops.namespace), name):
                ops.library.define(f"{name}(Tensor[] inputs) -> Any")
                torch.library.impl(ops.library, name, "CompositeExplicitAutograd")(_zeros_like_outputs(call.outputs))
    return ops


def _zeros_like_outputs(outputs: tuple[Io, ...]):
    def impl(inputs):
        return tuple(torch.zeros(o.shape, dtype=_torch_dtype(o.dtype), device="meta") for o in outputs)
    return impl


def _payload_maker(specs: list):
    """raw context binary → the payload QnnBackend stores (ExecuTorch's header in front, as from_context_binary)."""
    from executorch.backends.qualcomm.utils.utils import generate_qnn_executorch_option
    from executorch.backends.qualcomm.python import PyQnnManagerAdaptor
    manager = PyQnnManagerAdaptor.QnnManager(generate_qnn_executorch_option(specs))
    return lambda blob: bytes(manager.MakeBinaryInfo(blob))


def _op_name(node, namespace: str) -> str | None:
    target = getattr(node, "target", None)
    if node.op != "call_function" or getattr(target, "namespace", None) != namespace:
        return None
    return target.name().split("::")[-1].split(".")[0]


def _torch_dtype(qnn_dtype: str):
    name = TORCH_DTYPES.get(qnn_dtype)
    if name is None:
        raise InputError(f"a graph passes a {qnn_dtype} tensor, which an ExecuTorch method cannot",
                         "give the graph's inputs and outputs integer or float types")
    return getattr(torch, name)


class _Chain(torch.nn.Module):
    """A method: each binary's op in turn, tensors handed on by name."""

    def __init__(self, plan: MethodPlan, namespace: str, ops: list[str]):
        super().__init__()
        self.plan, self.namespace, self.ops = plan, namespace, ops

    def forward(self, *args):
        env = dict(zip(self.plan.inputs, args))
        for call, op in zip(self.plan.calls, self.ops):
            outs = getattr(getattr(torch.ops, self.namespace), op).default([env[t.name] for t in call.inputs])
            env.update(zip((t.name for t in call.outputs), outs))
        return tuple(env[n] for n in self.plan.outputs)


class OnePerCall(Partitioner):
    """Each binary's op (and the getitems that unpack it) a delegate of its own: QnnBackend's
    preprocess passes one binary through per partition."""

    def __init__(self, specs: list, namespace: str):
        super().__init__()
        from executorch.backends.qualcomm.qnn_preprocess import QnnBackend   # deferred: after qnn_ready()
        self.delegation_spec = DelegationSpec(QnnBackend.__name__, specs)
        self.namespace = namespace

    def partition(self, program) -> PartitionResult:
        tags = {}
        for node in program.graph_module.graph.nodes:
            if _op_name(node, self.namespace) is None:
                continue
            tag = f"qnn_binary_{len(tags)}"
            tags[tag] = self.delegation_spec
            node.meta["delegation_tag"] = tag
            for user in node.users:
                user.meta["delegation_tag"] = tag
        return PartitionResult(tagged_exported_program=program, partition_tags=tags)
