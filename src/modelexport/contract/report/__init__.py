"""report.html: one self-contained page per bundle (plots embedded, no network needed).

Imported lazily by callers: matplotlib loads only when a page with plots is drawn."""


def build_report(*args, **kwargs):
    from .html_report import build_report as _build   # deferred: jinja2, pydantic (~120 ms), kept off CLI start-up
    return _build(*args, **kwargs)


def write_report(*args, **kwargs):
    from .html_report import write_report as _write   # deferred: jinja2, pydantic (~120 ms), kept off CLI start-up
    return _write(*args, **kwargs)
