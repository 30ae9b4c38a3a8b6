"""AuditReport / NodeAudit: one shape for every backend's audit (ONNX Runtime QNN EP, ExecuTorch).

A node is on `HTP` or `CPU` as the backend itself reported; `io` marks graph-boundary
(de)quantization that ONNX Runtime keeps on the CPU by design; `folded` marks nodes the runtime's
graph optimizer removed before placement (constants, fused or folded nodes).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import ToolchainError, clip

HTP, CPU, IO, FOLDED = "HTP", "CPU", "io", "folded"
BLOCKS = "blocks"   # QNN refused to build the whole graph because of this node: nothing compiles


@dataclass
class NodeAudit:
    name: str
    op_type: str
    backend: str                     # HTP | CPU | io | folded | blocks
    module_path: str | None = None   # e.g. features.3.conv.0.0, from node names or exporter metadata
    reason: str | None = None        # the backend's own words for CPU nodes
    fix: str | None = None           # a suggestion from audit.fixes
    macs: int = 0                    # multiply-accumulates (Conv, ConvTranspose, MatMul, Gemm)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def is_fallback(self) -> bool:
        return self.backend == CPU


@dataclass
class AuditReport:
    model: str
    target: str
    htp_arch: int
    precision: str
    backend: str                     # "onnxruntime-qnn" or "executorch-qnn"
    nodes: list[NodeAudit]
    qairt_build: str | None = None
    notes: list[str] = field(default_factory=list)
    log_file: str | None = None
    refused: str | None = None       # QNN refused the whole graph (its words); `blockers` say where

    @property
    def fallbacks(self) -> list[NodeAudit]:
        return [n for n in self.nodes if n.is_fallback]

    @property
    def blockers(self) -> list[NodeAudit]:
        return [n for n in self.nodes if n.backend == BLOCKS]

    @property
    def ok(self) -> bool:
        return not self.fallbacks and not self.refused

    def totals(self) -> dict[str, Any]:
        count = Counter(n.backend for n in self.nodes)
        macs = Counter()
        for n in self.nodes:
            macs[n.backend] += n.macs
        total_macs = sum(macs.values())
        placed_macs = macs[HTP] + macs[CPU]      # a node folded away computes nothing where it was
        compute = count[HTP] + count[CPU]
        return {"nodes": len(self.nodes), "by_backend": dict(count), "macs": dict(macs), "total_macs": total_macs,
                "htp_node_share": round(count[HTP] / compute, 4) if compute else None,
                "htp_mac_share": round(macs[HTP] / placed_macs, 4) if placed_macs else None,
                "fallback_ops": dict(Counter(n.op_type for n in self.fallbacks)),
                "blocking_ops": dict(Counter(n.op_type for n in self.blockers))}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["totals"] = self.totals()
        d["ok"] = self.ok
        return d


def graph_refused_error(report: AuditReport):
    """The one error for an audit whose graph QNN refused: the blocking node(s) and the first fix."""
    b = report.blockers
    if not b:
        return ToolchainError(f"QNN refused to build the graph at {report.precision} ({report.refused}) and no node "
                              "could be named", "read the EP's log (modelexport audit --log FILE) for the first error")
    lead = "QNN refused to build the graph at this node "
    where = "; ".join(f"{n.name} ({n.op_type}) {(n.reason or '').removeprefix(lead)}" for n in b[:3])
    return ToolchainError(clip(f"QNN refused to build the graph at {report.precision}, at node {where}", 1200), b[0].fix)
