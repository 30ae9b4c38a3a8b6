"""report.html: one self-contained page per bundle (plots embedded, no network needed).

Imported lazily by callers: matplotlib loads only when a page with plots is drawn."""


def build_report(*args, **kwargs):
    from .html_report import build_report as _build
    return _build(*args, **kwargs)


def write_report(*args, **kwargs):
    from .html_report import write_report as _write
    return _write(*args, **kwargs)
