"""report.html: one self-contained page per bundle (plots embedded, no network needed)."""
from .html_report import build_report, write_report

__all__ = ["build_report", "write_report"]
