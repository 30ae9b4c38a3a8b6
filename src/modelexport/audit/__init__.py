"""Audit: ask the real backend, node by node, what runs on the HTP and why the rest does not."""
from .report import AuditReport, NodeAudit

__all__ = ["AuditReport", "NodeAudit"]
