"""What an audit says, whoever made it: the report types (one row per node: op, module path, HTP or
CPU, the validator's reason, a fix) and the rules table of fixes. The audits themselves belong to
their formats (`backends/ort_qnn/audit.py`, `backends/executorch_qnn/audit.py`).

Named `auditing`, not `audit`: a subpackage `modelexport.audit` would replace the API function of
that name as soon as it is imported."""
from .report import AuditReport, NodeAudit

__all__ = ["AuditReport", "NodeAudit"]
