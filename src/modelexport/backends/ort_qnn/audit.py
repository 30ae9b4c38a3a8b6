"""Audit an ONNX model on the real QNN EP: which node runs where, and the validator's reasons.

The placement is what the session reports (`session.record_ep_graph_assignment_info`). The
reasons come from the EP's own verbose log (`log_severity_level=0`), which ONNX Runtime's C++
logger writes to the process's stderr: the session is opened in a child process whose stderr
goes to a file, and the log's `Validation FAILED ... Node name: X ... REASON : ...` blocks and
`backendValidateOpConfig() failed for node X ... error code N` lines are matched to nodes by
name. The EP's framework op trace (`enable_framework_op_trace`) adds its `unsupported_nodes`.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.atomic import check_output
from ...core.errors import InputError, ToolchainError, clip
from ...frontends.onnx_index_inputs import index_limits
from ...frontends.onnx_model import LoadedOnnx
from ...quant import ONNX_PRECISIONS, get_precision, load_calibration
from ...quant.calibration import CalibrationSet, random_samples
from ...quant.onnx_qdq import quantize_onnx
from ...quant.precision import Precision
from ...core.targets import SoC, get_target
from ...toolchain.ort_qnn import CPU_EP_NAME, EP_NAME
from ...toolchain.qairt import find_qairt
from ...auditing.fixes import suggest_fix
from .audit_blockers import blocker_audit
from ...toolchain.ort_qnn_log import Blocker, blockers_from_log, is_graph_refusal, layout_refusal_fix, parse_ep_log
from ...frontends.module_paths import onnx_module_path
from ...frontends.onnx_graph import node_macs
from ...auditing.report import CPU, FOLDED, HTP, IO, AuditReport, NodeAudit
from ...passes.onnx.loop_unroll import MAX_ITERATIONS
from ...passes.onnx.control_flow import control_flow_on_inputs
from .repair import control_flow_fix, load_repaired, precision_repairs

_TOKEN = re.compile(r"_token_\d+$")
IO_REASON = ("graph input/output (de)quantization: ONNX Runtime keeps it on the CPU by design "
             "(offload_graph_io_quantization=1); the context binary itself takes the quantized tensor")


@dataclass(frozen=True)
class _Audited:
    """What an audit's report names whatever it found: the model, target, precision, QAIRT build,
    and the notes gathered on the way (a list the audit still appends to)."""
    loaded: LoadedOnnx
    soc: SoC
    prec: Precision
    qairt_build: str
    notes: list[str]

    def report(self, nodes: list[NodeAudit], **found: Any) -> AuditReport:
        return AuditReport(model=str(self.loaded.path or self.loaded.name), target=self.soc.name,
                           htp_arch=self.soc.htp_arch, precision=self.prec.name, backend="onnxruntime-qnn",
                           nodes=nodes, qairt_build=self.qairt_build, notes=self.notes, **found)


def _name_nodes(model) -> None:
    for i, n in enumerate(model.graph.node):
        if not n.name:
            n.name = f"{n.op_type}_{i}"


def _run_probe(model_path: Path, opts: dict, work: Path, log: Path, timeout: float) -> tuple[dict, str]:
    """(the child's result, its log) for one audit_probe run."""
    with open(log, "ab") as err:
        try:
            proc = subprocess.run([sys.executable, "-m", "modelexport.backends.ort_qnn.audit_probe", str(model_path), json.dumps(opts)],
                                  stdout=subprocess.PIPE, stderr=err, cwd=work, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ToolchainError(f"the QNN EP did not finish placing the model in {timeout:.0f} s",
                                 "audit a smaller part of the model, or call modelexport.audit(..., timeout=SECONDS) from Python") from None
    text = log.read_text(errors="replace")
    marker = proc.stdout.decode(errors="replace").rpartition("@@RESULT@@")[2].strip()
    if not marker:
        tail = "\n".join(l for l in text.splitlines()[-5:])
        raise ToolchainError(f"the QNN EP probe crashed (exit {proc.returncode}) before reporting a placement: "
                             f"{clip(tail, 600)}", "run `modelexport doctor`; if it passes, report this model as a bug")
    return json.loads(marker), text


def _probe(model_path: Path, provider_options: dict, work: Path, timeout: float) -> tuple[dict, str, dict]:
    """(placement, the EP's log, the framework op trace); placement None and {"error": ...} when
    the session could not be opened."""
    trace_dir = work / "trace"
    opts = {"provider_options": provider_options | {"enable_framework_op_trace": "1", "framework_op_trace_dir": str(trace_dir)}}
    result, text = _run_probe(model_path, opts, work, work / "ep.log", timeout)
    if not result.get("ok"):
        return None, text, {"error": result.get("error", "")}
    trace = {}
    for f in trace_dir.glob("*.json") if trace_dir.is_dir() else []:
        try:
            trace = json.loads(f.read_text())
        except json.JSONDecodeError:
            pass
    return result["placement"], text, trace


def audit_onnx(model: Any, target: str = "SM8650", precision: str = "fp16", input_shapes=None,
               calibration: Any = None, log_path: str | Path | None = None, timeout: float = 1800,
               input_values: Any = None) -> AuditReport:
    """Place `model` on the QNN EP for `target` and explain every node the HTP does not take."""
    import onnx
    soc = get_target(target)
    prec = get_precision(precision, ONNX_PRECISIONS)
    if log_path:
        check_output(Path(log_path), force=True)     # a log is replaced; its folder must be writable
    loaded: LoadedOnnx = load_repaired(model, input_shapes, input_values, allow_dynamic=True, allow_control_flow=True,
                                       **precision_repairs(prec))
    qairt = find_qairt()
    notes: list[str] = [f"repair {r['name']}: " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "name")[:300]
                        for r in loaded.repairs]
    open_flow = control_flow_fix(loaded.model)
    if open_flow:
        notes.append(f"{open_flow.problem}. Fix: {open_flow.fix}")
    audited = _Audited(loaded, soc, prec, qairt.build_id, notes)
    work = Path(tempfile.mkdtemp(prefix="modelexport-audit-"))
    try:
        ref = onnx.ModelProto()
        ref.CopyFrom(loaded.model)
        _name_nodes(ref)
        float_path = work / "float.onnx"
        onnx.save(ref, str(float_path))
        probe_path, graph_for_nodes = float_path, ref
        options: dict[str, str] = {"soc_model": str(soc.soc_model)}
        if prec.quantized and open_flow:
            notes.append(f"{prec.name} needs the control flow folded to calibrate; audited as fp16 instead (give --input-value)")
            options["enable_htp_fp16_precision"] = "1"
        elif prec.quantized and loaded.dynamic_inputs:
            notes.append(f"{prec.name} needs static shapes to calibrate; audited as fp16 instead (give --input-shape)")
            options["enable_htp_fp16_precision"] = "1"
        elif prec.quantized:
            limits = index_limits(loaded.model)
            calib = (load_calibration(calibration, loaded.inputs, limits=limits) if calibration is not None else
                     CalibrationSet(random_samples(loaded.inputs, 2, limits=limits), "random", "random", representative=False))
            qdq = work / "qdq.onnx"
            info = quantize_onnx(float_path, qdq, prec, calib)
            probe_path = qdq
            graph_for_nodes = onnx.load(info["preprocessed_model"], load_external_data=False) if info["preprocessed"] else ref
            _name_nodes(graph_for_nodes)
            if info["preprocessed"]:
                notes.append("qnn_preprocess_model rewrote the graph (e.g. fused GELU / LayerNorm patterns); nodes are those of the rewritten graph")
        else:
            options["enable_htp_fp16_precision"] = "1"
        placement, log_text, trace = _probe(probe_path, options, work, timeout)
        if placement is None and open_flow:   # the EP's failure comes from the unfolded branches: name the real blocker
            raise open_flow.reworded(f"{open_flow.problem} (the QNN EP then fails: {clip(trace['error'], 200)})")
        if placement is None:
            return _refused_report(audited, probe_path, options, work, log_text, trace["error"], log_path, timeout)
        report = _build_report(audited, graph_for_nodes, onnx.load(str(probe_path), load_external_data=False),
                               placement, parse_ep_log(log_text), trace)
        report.log_file = str(log_path) if log_path else None
        return report
    finally:
        if log_path and (work / "ep.log").is_file():   # kept whatever happened: a failed audit needs it most
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / "ep.log", log_path)
        shutil.rmtree(work, ignore_errors=True)


def _dynamic_shape_fix(loaded) -> str:
    dyn = loaded.dynamic_inputs
    if dyn:
        shown = " ".join(f"--input-shape {i.name}={','.join(str(d) if isinstance(d, int) else 'N' for d in i.shape)}"
                         for i in dyn)
        return f"give the dynamic inputs their sizes: {shown} (N: the size you will run)"
    return ("the inputs are static but the model computes a shape at run time: fix the inputs you feed it with "
            "--input-value NAME=VALUE where an input sets a size, or re-export the model with static shapes")


def _refused_report(audited: _Audited, probe_path, options, work, log_text, error, log_path, timeout) -> AuditReport:
    """The session failed: name the node(s) QNN refused (from the log, else by bisection), or
    raise a clear error when it is not a refusal of the graph."""
    import onnx
    loaded, prec = audited.loaded, audited.prec
    if not is_graph_refusal(error):
        if prec.quantized:   # the float model loaded; the QDQ model the quantizer wrote did not
            opset = next((o.version for o in loaded.model.opset_import if o.domain in ("", "ai.onnx")), 0)
            raise ToolchainError(f"ONNX Runtime could not open the {prec.name} (QDQ) model its quantizer wrote: "
                                 f"{clip(error, 600)}", layout_refusal_fix(error) or
                                 (f"the model is at opset {opset} and per-channel Q/DQ needs 13: re-export it at "
                                  "opset 13 or later, or " if 0 < opset < 13 else "")
                                 + "audit and compile it at --precision fp16 (no Q/DQ)")
        if "Dynamic shape is not supported" in error:
            raise InputError(f"the QNN EP needs every tensor's shape fixed, and one is not: {clip(error, 300)}",
                             _dynamic_shape_fix(loaded))
        raise ToolchainError(f"ONNX Runtime could not open the model with the QNN EP: {clip(error, 600)}",
                             "the model itself is invalid for ONNX Runtime: check it with `onnx.checker.check_model` "
                             "and fix or re-export it; `modelexport audit --log FILE` keeps the EP's log")
    blockers = blockers_from_log(log_text)
    if not blockers:
        result, _ = _run_probe(probe_path, {"provider_options": options, "locate": str(work / "ep.log")},
                               work, work / "ep.log", timeout)
        if result.get("ok") and result.get("blocker"):
            blockers = [Blocker(**result["blocker"])]
    graph = onnx.load(str(probe_path), load_external_data=False)
    nodes = [blocker_audit(b, graph, prec) for b in blockers]
    ep_error = clip(error.split(" : ")[-1], 300)
    if not nodes:
        audited.notes.append("the log names no node and bisection found none: see the EP's log (--log FILE)")
    return audited.report(nodes, log_file=str(log_path) if log_path else None, refused=ep_error)


def _feeds(q, model, where: dict[str, str]) -> str:
    """`; it feeds Conv `conv` (on the CPU)`: a (de)quantize node's fate follows the op it feeds,
    whose row then holds the fix that matters."""
    users = [n for n in model.graph.node if q.output[0] in n.input]
    if not users:
        return ""
    u = users[0]
    at = "on the HTP" if where.get(u.name) == EP_NAME else ("on the CPU" if u.name in where else "folded")
    return f"; it feeds {u.op_type} `{u.name}` ({at})"


def _build_report(audited: _Audited, graph_model, probe_model, placement, log_reasons, trace) -> AuditReport:
    loaded, prec = audited.loaded, audited.prec
    where: dict[str, str] = {}
    for ep, nodes in placement.items():
        for name, _op in nodes:
            for key in (name, _TOKEN.sub("", name)):
                # a node split by the layout transformer counts as HTP if any piece is on the HTP
                if where.get(key) != EP_NAME:
                    where[key] = ep
    for u in trace.get("unsupported_nodes", []) or []:
        log_reasons.setdefault(u.get("node_name", ""), [])
        r = re.sub(r"\.(?=\S)", ". ", str(u.get("reason", "")).strip())
        if r and not any(r in x or x in r for x in log_reasons[u["node_name"]]):
            log_reasons[u["node_name"]].append(r)
    macs = node_macs(graph_model)
    open_flow = control_flow_on_inputs(graph_model)
    loop_fix = _kept_loop_fix(graph_model) if not loaded.dynamic_inputs else None
    nodes: list[NodeAudit] = []
    for n in graph_model.graph.node:
        if n.op_type == "Constant":
            continue
        ep = where.get(n.name)
        reasons = log_reasons.get(n.name, [])
        if ep == EP_NAME:
            backend, reason = HTP, None
        elif ep == CPU_EP_NAME or ep is not None:
            backend = CPU
            reason = " | ".join(reasons) or "the EP validated it but left it to the CPU when partitioning the graph"
        else:
            backend, reason = FOLDED, "removed by ONNX Runtime's graph optimizer before placement (folded or fused)"
        fix = suggest_fix(n.op_type, reason, prec.quantized) if backend == CPU else None
        if backend == CPU and n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            reason += _feeds(n, graph_model, where)
            fix = suggest_fix(n.op_type, reason, prec.quantized)
        if backend == CPU and loop_fix and re.search(r"cannot get shape", reason, re.I):
            fix = loop_fix               # every input is static: the unknown shape comes from a Loop left in the graph
        if n.name in open_flow:          # the EP's reason (often "Cannot get shape") hides the real blocker
            ins = open_flow[n.name]
            backend = CPU
            reason = f"{n.op_type} on the input(s) {', '.join(ins)}: the HTP runs no control flow" + (f" | {reason}" if reason else "")
            fix = (" ".join(f"--input-value {i}=VALUE" for i in ins)
                   + ": fix the value you will run with; the branch is then folded at compile time")
        nodes.append(NodeAudit(n.name, n.op_type, backend, onnx_module_path(n), reason, fix, macs.get(n.name, 0)))
    # Quantize/Dequantize at the graph boundary of a QDQ model.
    g_in = {i.name for i in probe_model.graph.input}
    g_out = {o.name for o in probe_model.graph.output}
    known = {n.name for n in graph_model.graph.node}
    for n in probe_model.graph.node:
        if n.name in known or n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        at_io = (n.op_type == "QuantizeLinear" and n.input[0] in g_in) or (n.op_type == "DequantizeLinear" and n.output[0] in g_out)
        ep = where.get(n.name)
        if at_io and ep == CPU_EP_NAME:
            nodes.append(NodeAudit(n.name, n.op_type, IO, None, IO_REASON))
        elif ep == CPU_EP_NAME:
            reason = " | ".join(log_reasons.get(n.name, [])) or "left on the CPU next to a CPU node"
            reason += _feeds(n, probe_model, where)
            nodes.append(NodeAudit(n.name, n.op_type, CPU, None, reason, suggest_fix(n.op_type, reason, prec.quantized)))
    if loaded.dynamic_inputs:
        audited.notes.append("dynamic inputs: " + ", ".join(f"{i.name}{i.shape}" for i in loaded.dynamic_inputs)
                             + " (compile refuses these without --input-shape)")
    return audited.report(nodes)


def _kept_loop_fix(model) -> str | None:
    """The fix for "Cannot get shape" when every input is static: a Loop or Scan left in the graph
    (its count depends on the data, or is over unroll-loops' limit) gives what follows it no shape."""
    kept = [n.name or n.op_type for n in model.graph.node if n.op_type in ("Loop", "Scan")]
    if not kept:
        return None
    return (f"its shape is unknown because it follows the {', '.join(kept[:3])} node(s), which the HTP does not run and "
            f"modelexport could not unroll (an iteration count that depends on the data, or more than {MAX_ITERATIONS}): "
            "export the model without the loop (e.g. call it on one example instead of tf.map_fn over the batch), "
            "or run this part on the CPU")
