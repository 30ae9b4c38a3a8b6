"""Audit: ask the real backend, node by node, what runs on the HTP and why the rest does not."""
import sys
import types

from .report import AuditReport, NodeAudit

__all__ = ["AuditReport", "NodeAudit"]


class _CallableAuditPackage(types.ModuleType):
    """`modelexport.audit` names both this package and the API function. Importing the package (which
    the API itself does to run an audit) rebinds the attribute `modelexport.audit` to the package,
    so a second `modelexport.audit(model, ...)` in the same process would find a module: the
    package therefore forwards calls to the function."""

    def __call__(self, *args, **kwargs):
        from ..api import audit
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableAuditPackage
