"""Audit a PyTorch model for the HTP through ExecuTorch's QNN backend, node by node.

The model goes through the same steps as compile (export, rewrites, quantization, QNN's export
and to-edge passes), then ExecuTorch's QNN partitioner decides every node, explained
(backends/et_partition.py): nothing is delegated and no HTP graph is built, so an audit costs
an export plus one validator call per node. Each node gets its nn.Module path, its aten op, HTP
or CPU, the reason in the backend's own words, and a fix from audit.fixes.
"""
from __future__ import annotations

import copy
import math
import operator
import time
from pathlib import Path
from typing import Any

from ...auditing.fixes import fix_for, source_fn
from ...auditing.report import BLOCKS, CPU, HTP, AuditReport, NodeAudit
from ...core.errors import InputError, ModelExportError, clip
from ...frontends.module_paths import fx_module_path
from .locate import locate
from .lower import QDQ_OPS, delegate_again, is_qdq, lower, lowering_error
from .partition import op_name, qnn_reason
from .specs import qnn_ready


def _macs(node) -> int:
    """Multiply-accumulates of linear/conv/matmul nodes, from the traced shapes."""
    name = getattr(node.target, "__name__", str(node.target))
    try:
        out = node.meta.get("val")
        if "linear" in name or "addmm" in name or "matmul" in name or "bmm" in name or name.startswith("aten.mm"):
            a = node.args[0].meta["val"] if "addmm" not in name else node.args[1].meta["val"]
            return int(math.prod(out.shape) * a.shape[-1])
        if "convolution" in name or "conv2d" in name or "conv1d" in name:
            w = node.args[1].meta["val"]
            return int(math.prod(out.shape) * math.prod(w.shape[1:]))
    except (AttributeError, KeyError, IndexError, TypeError):
        return 0
    return 0


def is_qdq_name(target: str) -> bool:
    return any(q in target for q in QDQ_OPS)


def nodes_from_decisions(edge_program, decisions, quantized: bool | None = None) -> list[NodeAudit]:
    out = []
    for node in edge_program.graph_module.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        d = decisions.get(node.name)
        op = op_name(node.target)
        supported = bool(d and d.supported)
        if supported and is_qdq(node.target):
            continue  # (de)quantize nodes QNN takes become its tensors' encodings: not ops on the HTP
        backend = HTP if supported else CPU
        n = NodeAudit(node.name, op, backend, fx_module_path(node), macs=_macs(node))
        if backend == CPU:
            n.reason = d.reason if d else "not seen by the QNN partitioner"
            source = source_fn(node)
            n.fix = fix_for(op, n.reason, source, quantized)
            n.details = {"reason_kind": d.kind if d else None}
            if source:
                n.details["source_fn"] = source
            if d and d.log:
                n.details["qnn_log"] = d.log[-20:]
        out.append(n)
    return out


def audit_torch(model: Any, target: str = "SM8650", precision: str = "fp16", input_shapes=None, calibration=None,
                log_path: str | Path | None = None, example_inputs: Any = None, **options: Any) -> AuditReport:
    """→ AuditReport (backend "executorch-qnn"). Quantized precisions calibrate on `calibration`
    or, when none is given, on random data: placement does not depend on the values. `options`:
    overrides, block_size, rewrites, dynamic_shapes (pipeline.PrepareOptions)."""
    from .pipeline import PrepareOptions, prepare
    state = qnn_ready()
    if input_shapes:
        raise InputError("--input-shape is for ONNX models", "a PyTorch model's shapes are those of its example inputs")
    t0 = time.perf_counter()
    log: list[str] = []
    try:
        prep = prepare(model, example_inputs, target, precision, calibration if calibration is not None else "random",
                       PrepareOptions(**options))
        try:
            low = lower(copy.deepcopy(prep.lowerable()), prep.lower_inputs(), delegate=False, log_level="warn")
        except ModelExportError:
            raise
        except Exception as e:  # ExecuTorch's passes raise plain exceptions: said cleanly, as compile does
            log += getattr(e, "native_log", []) or []
            raise lowering_error(e) from None
        log += low.log
        nodes = nodes_from_decisions(low.edge.exported_program(), low.decisions, prep.precision.quantized)
        refused = None
        if any(n.backend == HTP for n in nodes):
            # The partitioner judges one op at a time; QNN can still refuse a whole partition when
            # it builds it. Build them as compile would, and name the op when that fails.
            refused, blocker = check_partitions(prep, low, log)
            if blocker is not None:
                nodes = [blocker if n.name == blocker.name else n for n in nodes]
    finally:
        if log_path:   # written whatever happened: a failed audit needs its log most
            Path(log_path).write_text("\n".join(log) + "\n")
    notes = []
    folded = sum(1 for d in low.decisions.values() if d.supported and is_qdq_name(d.target))
    if folded:
        notes.append(f"{folded} (de)quantize node(s) fold into the HTP graph's tensor encodings (not listed)")
    if prep.precision.quantized and prep.calibration is not None and not prep.calibration.representative:
        notes.append("quantized with random calibration data: placement does not depend on the values")
    for r in prep.rewrites:
        notes.append(f"rewrite {r['name']}: {r['nodes_rewritten']} node(s) changed")
    rep = AuditReport(model=prep.loaded.source, target=prep.soc.name, htp_arch=prep.soc.htp_arch,
                      precision=prep.precision.name, backend="executorch-qnn", nodes=nodes,
                      qairt_build=state.qairt_build, notes=notes, log_file=str(log_path) if log_path else None,
                      refused=refused)
    rep.notes.append(f"audited in {time.perf_counter() - t0:.1f} s")
    return rep


def _lower_fails(prep, audited=None, skip: set[str] | None = None) -> tuple[str | None, list[str]]:
    """(QNN's words when building the QNN partitions fails, else None; the native log). With the
    `audited` (undelegated) lowering, its graph is delegated again instead of lowering from scratch."""
    try:   # a copy: a lowering's passes change the graph it is given, and the audit lowers it again
        if audited is not None:
            low = delegate_again(audited, prep.soc, use_fp16=not prep.precision.quantized, skip_nodes=skip)
        else:
            low = lower(copy.deepcopy(prep.lowerable()), prep.lower_inputs(), fallback=None, delegate=True,
                        log_level="warn", skip_nodes=skip)
        return None, low.log
    except Exception as e:   # any failure of the real lowering is the answer sought here
        log = getattr(e, "native_log", []) or []
        return qnn_reason(log) or clip(f"{type(e).__name__}: {e}", 600), log


def check_partitions(prep, low, log: list[str]) -> tuple[str | None, NodeAudit | None]:
    """Lower the QNN partitions for real; on failure bisect for the op → (QNN's words, its row).
    The real lowering's native log is added to `log`."""
    error, more = _lower_fails(prep)
    log += more
    if error is None:
        return None, None
    found = locate(low.edge.exported_program(), low.decisions, lambda skip: _lower_fails(prep, low, skip)[0], error)
    if found is None:
        return error, None
    where = (f"QNN partition {found.partition + 1} of {found.partitions}" if found.partition is not None
             else "a QNN partition") + (f" (modules {', '.join(found.partition_modules[:6])})"
                                        if found.partition_modules else "")
    fed = f"; it is fed by {' ← '.join(found.inputs_chain)}" if found.inputs_chain else ""
    reason = (f"lowering failed: QNN accepted this op alone but could not build {where} once it was added{fed}. "
              f"QNN said: {found.qnn_said or error}")
    n = NodeAudit(found.node, found.op, BLOCKS, found.module_path, reason,
                  fix_for(found.op, reason, quantized=prep.precision.quantized),
                  details={"partition": found.partition, "partitions": found.partitions,
                           "partition_modules": found.partition_modules, "located_by": "bisect",
                           "lowerings": found.lowerings})
    return error, n
