"""ExecuTorch's QNN partitioner, made to say why: the per-node decision with its reason.

`QnnOperatorSupport.is_node_supported` (executorch 1.5.1, partition/qnn_partitioner.py) answers
True/False and logs a line at INFO. `ExplainingSupport` is the same decision, branch for branch,
recording which branch refused a node:

  * `not_supported`      the op is on ExecuTorch's `not_supported_operator` list;
  * `to_be_implemented`  the op is on its `to_be_implemented_operator` list;
  * `forced_fallback`    the node carries QCOM_FALLBACK_NODE (a pass asked for it);
  * `skipped`            the caller listed the node or its op in skip sets;
  * `no_node_visitor`    ExecuTorch has no op builder for the aten op;
  * `builder_refused`    the op builder gave up (its Python warning is the reason);
  * `validator_refused`  QNN's own validator (`IsNodeSupportedByBackend` → backendValidateOpConfig)
                         said no; the native log QNN wrote while deciding is the reason.

The native log is captured by pointing fds 1 and 2 at a temporary file around the call, with the
compile spec's log level raised to warn (see et_specs.compile_specs), so the reason is QNN's own
words. `ExplainingQnnPartitioner` is a QnnPartitioner using it; with `delegate=False` it only
records (the audit), otherwise it partitions exactly as ExecuTorch does (compile).
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from ...core.errors import clip
from ...toolchain.native_io import capture_native_output

SUPPORTED = "supported"
REASON_KINDS = ("not_supported", "to_be_implemented", "forced_fallback", "skipped", "no_node_visitor",
                "builder_refused", "validator_refused")


@dataclass
class Decision:
    node: str
    target: str                      # aten op, e.g. aten.gelu.default
    supported: bool
    kind: str                        # SUPPORTED or one of REASON_KINDS
    reason: str | None = None
    log: list[str] = field(default_factory=list)


_NOISE = re.compile(r"unexpected GraphHtpSettings option|tiling\.h:\d+:WARNING|create QNN Logger|Initializing HtpProvider|"
                    r"Performance Estimates unsupported|HTP Backend Op Definition Supplement|Qnn Backend op validation failed")
_PREFIX = re.compile(r"^\[(?:INFO|WARNING|ERROR|DEBUG|VERBOSE)\] \[Qnn ExecuTorch\]:\s*(?:<[EWIDV]>\s*)?")
_SUPPORTED_SET = re.compile(r"Supported I/O datatype sets for the configuration: (\S+)")


def qnn_reason(lines: list[str]) -> str | None:
    """QNN's own words from a validator log, compacted: error lines without ExecuTorch's prefixes,
    continuation lines folded into the message they belong to ("Requested I/O datatype set:
    in[0]:QNN_DATATYPE_INT_64 ..."), the list of supported datatype sets shortened to its names."""
    messages: list[list[str]] = []
    supported: list[str] = []
    in_supported = False
    for raw in lines:
        if not raw.startswith("["):                      # a continuation of the previous message
            if messages and not in_supported:
                part = raw.strip()
                if part and not part.rstrip(":").isdigit():
                    messages[-1].append(part)
            continue
        if _NOISE.search(raw):
            in_supported = False
            continue
        is_error = "<E>" in raw or raw.startswith("[ERROR]")
        m = _SUPPORTED_SET.search(raw)
        if m:
            supported.append(m[1])
            in_supported = True
            continue
        in_supported = False
        if is_error:
            messages.append([_PREFIX.sub("", raw).strip()])
    if not messages and not supported:
        kept = [_PREFIX.sub("", x).strip() for x in lines if x.startswith("[") and not _NOISE.search(x)]
        return clip(" | ".join(dict.fromkeys(k for k in kept if k)), 600) or None
    out = [" ".join(m) for m in messages]
    if supported:
        out.insert(1 if out else 0, "supported datatype sets: " + ", ".join(dict.fromkeys(supported)))
    return clip(" | ".join(dict.fromkeys(o for o in out if o)), 1000)


def op_name(target) -> str:
    """`aten.gelu.default` for an edge op, the function name otherwise."""
    name = getattr(target, "__name__", None) or str(target)
    return name


def _explaining_support_cls():
    from executorch.backends.qualcomm.builders.qnn_constants import OpContextLoader
    from executorch.backends.qualcomm.partition.common_defs import (allow_list_operator, constant_operator,
                                                                     not_supported_operator,
                                                                     to_be_implemented_operator)
    from executorch.backends.qualcomm.partition.qnn_partitioner import QnnOperatorSupport
    from executorch.backends.qualcomm.utils.constants import QCOM_BYPASS_NODE, QCOM_FALLBACK_NODE

    class ExplainingSupport(QnnOperatorSupport):
        """QnnOperatorSupport.is_node_supported, recording the branch that decided each node."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.decisions: dict[str, Decision] = {}

        def _decide(self, node, supported: bool, kind: str, reason: str | None = None, log=None) -> bool:
            self.decisions[node.name] = Decision(node.name, op_name(node.target), supported, kind, reason, list(log or []))
            return supported

        def is_node_supported(self, _, node) -> bool:  # mirrors executorch 1.5.1 line by line
            if node.op != "call_function":
                return False
            if node.name in self.decisions:
                return self.decisions[node.name].supported
            name = op_name(node.target)
            if node.target in not_supported_operator:
                return self._decide(node, False, "not_supported",
                                    f"{name} is on ExecuTorch's not_supported_operator list for QNN")
            if node.target in to_be_implemented_operator:
                return self._decide(node, False, "to_be_implemented",
                                    f"{name} is on ExecuTorch's to_be_implemented_operator list (QNN could run it; "
                                    "the op builder is not written yet)")
            if node.meta.get(QCOM_FALLBACK_NODE, False):
                return self._decide(node, False, "forced_fallback", "a QNN pass marked this node for CPU fallback")
            if (node.target in allow_list_operator or OpContextLoader.namespace == getattr(node.target, "namespace", None)
                    or node.meta.get(QCOM_BYPASS_NODE, False)):
                return self._decide(node, True, SUPPORTED)
            if node.name in self.skip_node_id_set or name in self.skip_node_op_set:
                return self._decide(node, False, "skipped", "skipped on request (skip_node_id_set / skip_node_op_set)")
            if name not in self.node_visitors:
                return self._decide(node, False, "no_node_visitor", f"ExecuTorch has no QNN op builder for {name}")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with capture_native_output() as build_log:
                    op_wrapper = self.node_visitors[name].define_node(node, self.nodes_to_wrappers)
            if node.target in constant_operator:   # (executorch keeps the wrappers here: so does this)
                return self._decide(node, True, SUPPORTED)
            if op_wrapper is None:
                self.nodes_to_wrappers.clear()
                said = [str(w.message).replace("[QNN Delegate Op Builder]: ", "") for w in caught]
                return self._decide(node, False, "builder_refused",
                                    "; ".join(said) or qnn_reason(build_log) or "the QNN op builder returned nothing",
                                    build_log)
            wrappers = op_wrapper if isinstance(op_wrapper, list) else [op_wrapper]
            with capture_native_output() as log:
                supported = bool(self.qnn_manager.IsNodeSupportedByBackend([w.GetOpWrapper() for w in wrappers]))
            self.nodes_to_wrappers.clear()
            if supported:
                return self._decide(node, True, SUPPORTED, log=log)
            return self._decide(node, False, "validator_refused",
                                qnn_reason(log) or "QNN's validator refused the op config (no message logged)", log)

    return ExplainingSupport


def explaining_partitioner(compiler_specs, delegate: bool = True, skip_node_id_set=None, skip_node_op_set=None,
                           skip_mutable_buffer: bool = False):
    """A QnnPartitioner that records every decision in `.decisions`; `delegate=False` tags nothing."""
    from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner
    from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import \
        generate_partitions_from_list_of_nodes
    from executorch.exir.backend.partitioner import PartitionResult

    support_cls = _explaining_support_cls()

    class ExplainingQnnPartitioner(QnnPartitioner):
        decisions: dict[str, Decision]

        def generate_partitions(self, edge_program):
            self.op_support_checker = support_cls(edge_program, self.compiler_specs_snapshot,
                                                  self.skip_node_id_set, self.skip_node_op_set)
            self.decisions = self.op_support_checker.decisions
            if not delegate:
                for node in edge_program.graph_module.graph.nodes:
                    self.op_support_checker.is_node_supported(None, node)
                return []
            return generate_partitions_from_list_of_nodes(edge_program.graph_module, op_support=self.op_support_checker)

        def partition(self, edge_program):
            if delegate:
                result = super().partition(edge_program)
                self._audited = True
                return result
            self.generate_partitions(edge_program)
            del self.op_support_checker
            self._audited = True
            return PartitionResult(tagged_exported_program=edge_program, partition_tags={})

        def ops_to_not_decompose(self, ep):
            ops, check = super().ops_to_not_decompose(ep)
            if getattr(self, "_audited", False):
                # Asked again after partitioning, to check that every op kept whole was delegated.
                # An audit delegates nothing on purpose; a compile leaves the ops QNN refused to
                # the next backend (XNNPACK) or the portable kernels: neither is an error here.
                return ops, (lambda node: bool(self.decisions.get(node.name)
                                               and self.decisions[node.name].supported and delegate))
            return ops, check

    p = ExplainingQnnPartitioner(compiler_specs, skip_node_id_set=skip_node_id_set, skip_node_op_set=skip_node_op_set,
                                 skip_mutable_buffer=skip_mutable_buffer)
    p.decisions = {}
    return p
