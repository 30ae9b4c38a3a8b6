"""Lower a (quantized) torch graph to a `.pte`: QNN first, XNNPACK for what QNN refuses.

The steps are executorch 1.5.1's `to_edge_transform_and_lower_to_qnn` (QNN's export passes,
its to-edge passes, a QnnManager context), with two differences: the QNN partitioner is the
explaining one (et_partition), and an XnnpackPartitioner follows it so that what the HTP will
not take runs on XNNPACK rather than on portable kernels. `to_pte` writes the program with the
delegate blobs extracted into segments aligned for mmap.
"""
from __future__ import annotations

import copy
import logging
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...auditing.fixes import fix_for, source_fn
from ...core.errors import ToolchainError, clip
from ...core.targets import SoC
from ...frontends.module_paths import fx_module_path
from .partition import Decision, capture_native_output, explaining_partitioner, op_name, qnn_reason
from .specs import compile_specs

# 16 KiB: a multiple of every page size Android uses (4 KiB and 16 KiB), so each delegate segment
# can be mmapped straight from the file on any device.
SEGMENT_ALIGNMENT = 16384
QDQ_OPS = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel", "dequantize_per_channel",
           "quantize_affine", "dequantize_affine", "choose_qparams")
BACKEND_OF = {"QnnBackend": ("HTP", "QNN"), "XnnpackBackend": ("CPU", "XNNPACK")}


@dataclass(frozen=True)
class LowerInputs:
    """What a graph is lowered with and for: its example inputs (and their dynamic dimensions), the
    SoC, fp16 or quantized, and QNN's ConvertLinearToConv2d pass: block-wise 4-bit weights need it
    (measured: a block-quantized linear left as FullyConnected gives -5 dB on the HTP, as conv2d 20 dB)."""
    example_inputs: tuple
    soc: SoC
    use_fp16: bool
    dynamic_shapes: Any = None
    linear_to_conv2d: bool = False


@dataclass
class Lowered:
    edge: Any                               # EdgeProgramManager
    decisions: dict[str, Decision]          # per edge node: the QNN partitioner's answer and reason
    log: list[str] = field(default_factory=list)
    mutable_buffers: list[str] = field(default_factory=list)   # kept out of the delegate (skip_mutable_buffer)


def _silence_python_logs() -> None:
    for name in ("executorch", "executorch.backends.qualcomm", "executorch.exir", "torch.export", "torch._export"):
        logging.getLogger(name).setLevel(logging.ERROR)


def lower(module, given: LowerInputs, fallback: str | None = "xnnpack", delegate: bool = True,
          log_level: str = "error", method: str = "forward", skip_nodes: set[str] | None = None) -> Lowered:
    """export → QNN export passes → to_edge + QNN (+ XNNPACK) partitioners → EdgeProgramManager.

    `skip_nodes`: edge node names QNN must not take (the locator delegates part of a graph)."""
    import torch
    from executorch.backends.qualcomm._passes.qnn_pass_manager import get_qnn_pass_manager_cls
    from executorch.backends.qualcomm.serialization.qc_schema_serialize import flatbuffer_to_option
    from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerContext
    from executorch.backends.qualcomm.utils.utils import qnn_edge_config
    from executorch.exir import to_edge_transform_and_lower

    _silence_python_logs()
    specs = compile_specs(given.soc, given.use_fp16, log_level)
    backend_type = flatbuffer_to_option(specs[0].value).backend_options.backend_type
    log: list[str] = []
    mutated: list[str] = []
    qnn = None
    try:
        with capture_native_output() as log:
            ep = torch.export.export(module, tuple(given.example_inputs), dynamic_shapes=given.dynamic_shapes,
                                     strict=True)
            # A buffer the forward writes (a KV cache, a running state): delegated, QNN gives it the
            # same I/O address, which the x86 simulator does not honour (measured: -97 dB, silently).
            # As ExecuTorch's x86 tests do, the write stays outside the delegate, in the program.
            mutated = mutated_buffers(ep)
            qnn = explaining_partitioner(specs, delegate=delegate, skip_node_id_set=set(skip_nodes or ()),
                                         skip_mutable_buffer=bool(mutated))
            pm = get_qnn_pass_manager_cls(backend_type)()
            aten = pm.transform_for_export_pipeline(ep)
            passes = pm.get_to_edge_transform_passes(ep, compiler_specs=specs,
                                                     convert_linear_to_conv2d=given.linear_to_conv2d)
            with QnnManagerContext({method: specs}):
                edge = to_edge_transform_and_lower({method: aten}, transform_passes={method: passes},
                                                   partitioner={method: [qnn]}, compile_config=qnn_edge_config())
            # XNNPACK gets what QNN left, as a second step: in one to_edge_transform_and_lower call
            # its decomposition table would also decompose the ops QNN asked to keep whole.
            if fallback == "xnnpack" and delegate and _has_cpu_ops(edge, method):
                from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
                edge = edge.to_backend({method: XnnpackPartitioner()})
    except Exception as e:
        e.native_log = log  # type: ignore[attr-defined]
        raise
    return Lowered(edge, dict(qnn.decisions), log, mutated)


def delegate_again(low: Lowered, soc: SoC, use_fp16: bool, skip_nodes: set[str] | None = None,
                   log_level: str = "warn", method: str = "forward") -> Lowered:
    """Delegate an audited lowering's graph (`lower(..., delegate=False)`) to QNN, keeping the nodes in
    `skip_nodes` off it. The graph is already exported, decomposed and through QNN's passes, so only
    partitioning and QNN's graph build run: the locator's trial lowerings cost a fraction of a lowering."""
    from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerContext

    specs = compile_specs(soc, use_fp16, log_level)
    log: list[str] = []
    qnn = explaining_partitioner(specs, delegate=True, skip_node_id_set=set(skip_nodes or ()),
                                 skip_mutable_buffer=bool(low.mutable_buffers))
    try:
        with capture_native_output() as log, QnnManagerContext({method: specs}):
            edge = copy.deepcopy(low.edge).to_backend({method: qnn})
    except Exception as e:
        e.native_log = log  # type: ignore[attr-defined]
        raise
    return Lowered(edge, dict(qnn.decisions), log, low.mutable_buffers)


def mutated_buffers(ep) -> list[str]:
    """Buffers the forward writes. torch.export's IR keeps in-place ops (`copy_` on a buffer) until
    it is functionalized, so the signature's buffers_to_mutate is not enough: writes are read off
    the ops' schemas too."""
    sig = ep.graph_signature
    buffers = sig.inputs_to_buffers
    found = set(sig.buffers_to_mutate.values())
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for arg_schema, arg in zip(schema.arguments, node.args):
            written = arg_schema.alias_info is not None and arg_schema.alias_info.is_write
            if written and getattr(arg, "name", None) in buffers:
                found.add(buffers[arg.name])
    return sorted(found)


def _pass_failure(e: Exception) -> ToolchainError | None:
    """ExecuTorch's pass manager wraps the real error ("An error occurred when running the 'X' pass
    after the following passes: [30 names]"): say the pass, the node and the model's line instead."""
    m = re.match(r"An error occurred when running the '(\w+)' pass", str(e))
    cause = e.__cause__ or e.__context__
    if not m or cause is None:
        return None
    text = str(cause)
    reason = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(cause).__name__)
    node = re.search(r"While executing %(\S+)", text)
    frames = re.findall(r'File "([^"]+)", line (\d+), in \w+\n\s+(.+)', text)
    user = [f for f in frames if "/torch/" not in f[0]]
    at = f" at {Path(user[-1][0]).name}:{user[-1][1]} (`{user[-1][2].strip()}`)" if user else ""
    return ToolchainError(f"ExecuTorch's QNN pass {m[1]} failed on {node[1] if node else 'a node'}{at}: {reason}",
                          "the pass runs before any node is placed, so an audit stops here too: change that op "
                          "(a weight computed in forward, such as weight_norm, becomes a constant with "
                          "torch.nn.utils.parametrize.remove_parametrizations), or compile at another --precision")


def lowering_error(e: Exception) -> ToolchainError:
    text = " ".join(str(e).split())
    if "was not decomposed or delegated" in text:
        op = re.search(r"with op <EdgeOpOverload: ([\w.]+)>", text)
        return ToolchainError(f"{op[1] if op else 'an op'} was kept whole for QNN, which then refused it, and no other "
                              "backend took it", "run `modelexport audit` for the reason; change the op or the precision")
    failed_pass = _pass_failure(e)
    if failed_pass is not None:
        return failed_pass
    said = qnn_reason(getattr(e, "native_log", []) or [])
    return ToolchainError(f"ExecuTorch lowering failed: {type(e).__name__}: {clip(text, 1000)}"
                          + (f" — QNN said: {clip(said, 1000)}" if said else ""),
                          "run `modelexport audit` on the model with the same --precision: it builds the QNN "
                          "partitions as compile does and names the op that fails, with its fix")


def _has_cpu_ops(edge, method: str) -> bool:
    import torch
    for node in edge.exported_program(method).graph_module.graph.nodes:
        if node.op == "call_function" and node.target not in (operator.getitem,
                                                             torch.ops.higher_order.executorch_call_delegate):
            return True
    return False


def to_pte(edge, alignment: int = SEGMENT_ALIGNMENT, mutable_buffers: list[str] | None = None):
    """ExecutorchProgramManager with delegate data in segments starting on `alignment` boundaries.

    ExecuTorch serializes only the shape of a mutable buffer unless told to keep its initial
    value (InitializedMutableBufferPass, matched on placeholder names `b_<path>`): without it a
    state that does not start at zero starts from whatever the memory held."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
    passes = [InitializedMutableBufferPass([b.replace(".", "_") for b in mutable_buffers])] if mutable_buffers else []
    with capture_native_output():
        return edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True, segment_alignment=alignment,
                                                          passes=passes))


def is_qdq(target) -> bool:
    name = op_name(target)
    return any(q in name for q in QDQ_OPS)


def _aten(target) -> str:
    return op_name(target)


def placement(edge, decisions: dict[str, Decision], method: str = "forward") -> list[dict]:
    """One record per compute node of the lowered program: which runtime runs it and why.

    QNN-delegated nodes are on the HTP; XNNPACK-delegated and portable nodes are on the CPU, with
    the QNN partitioner's reason. (De)quantize nodes inside a delegate are folded into its
    tensors' encodings and left out; outside one they run on the CPU and are listed.
    """
    import torch
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    gm = edge.exported_program(method).graph_module
    rows: list[dict] = []

    def record(node, backend: str, runtime: str) -> None:
        if node.op != "call_function" or node.target is operator.getitem:
            return
        if is_qdq(node.target) and runtime != "portable":
            return
        d = decisions.get(node.name)
        row = {"name": node.name, "op_type": _aten(node.target), "module_path": fx_module_path(node),
               "backend": backend, "runtime": runtime}
        if backend != "HTP":
            row["reason_kind"] = d.kind if d else None
            row["reason"] = d.reason if d else ("not seen by the QNN partitioner" if not is_qdq(node.target) else
                                                "(de)quantization between a CPU op and the rest of the graph")
            row["fix"] = fix_for(row["op_type"], row["reason"], source_fn(node))
        rows.append(row)

    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.higher_order.executorch_call_delegate:
            lowered = getattr(gm, node.args[0].target)
            assert isinstance(lowered, LoweredBackendModule)
            backend, runtime = BACKEND_OF.get(lowered.backend_id, ("CPU", lowered.backend_id))
            for inner in lowered.original_module.graph_module.graph.nodes:
                record(inner, backend, runtime)
        else:
            record(node, "CPU", "portable")
    return rows


def delegation_summary(rows: list[dict]) -> dict:
    by_runtime = Counter(r["runtime"] for r in rows)
    total = len(rows)
    return {"nodes": total, "by_runtime": dict(by_runtime),
            "htp_share": round(by_runtime.get("QNN", 0) / total, 4) if total else None,
            "fallback_ops": dict(Counter(r["op_type"] for r in rows if r["backend"] != "HTP"))}
