"""Which functions run, verify and profile a bundle: its format's row in `core.formats`.

The row is the one of the bundle's (format, kind) (an LLM's context binaries are not a model's), else its
format's model row, else the context-binary one (which reports what is wrong with a path that is no bundle).
`modelexport.run` / `verify` / `profile` call what the row names, so a new format is one row, not a branch.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..core.arguments import at_least, finite
from ..core.errors import InputError, UnsupportedError
from ..core.formats import BundleFormat, bundle_format, retired
from ..core.vocab import BundleKind, Format
from ..profiling.report import check_arguments

DEFAULT_FORMAT = Format.CONTEXT_BINARY


def _manifest_fields(path: str | Path) -> dict:
    try:
        data = json.loads((Path(path) / "manifest.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}                  # the default runner reports what is wrong with the path


def format_of(path: str | Path) -> str:
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".pte":
        return Format.PTE
    return _manifest_fields(p).get("format") or DEFAULT_FORMAT


def format_row(path: str | Path) -> BundleFormat:
    """The row of the bundle's format and kind, else of its format, else the default's."""
    fmt = format_of(path)
    kind = _manifest_fields(path).get("kind") or BundleKind.MODEL
    refuse_retired(path, fmt, kind)
    return (bundle_format(fmt, kind) or bundle_format(fmt, BundleKind.MODEL)
            or bundle_format(DEFAULT_FORMAT, BundleKind.MODEL))


def refuse_retired(path, fmt: str | None, kind: str | None) -> None:
    """An InputError for a bundle of a (format, kind) an older modelexport wrote and none runs now."""
    gone = retired(fmt, kind)
    if gone:
        raise InputError(f"{path} is {gone[0]}", gone[1])


class Entries:
    """A row's entry points as attributes (`runner_for(b).verify(...)`), each imported when first read; one the
    format does not have raises UnsupportedError naming the format and what it does offer."""

    def __init__(self, row: BundleFormat):
        self.row = row

    def __getattr__(self, name: str):
        fn = self.row.entry(name)
        if fn is None:
            offered = [e for e in ("run", "verify", "profile") if getattr(self.row, e)]
            raise UnsupportedError(f"{self.row.format} bundles ({self.row.kind}) have no `{name}`",
                                   f"this format offers: {', '.join(offered) or 'inspect only'}")
        return fn


def runner_for(path: str | Path) -> Entries:
    """The run / verify / profile functions of the bundle's format (`runner_for(b).verify(b, ...)`)."""
    return Entries(format_row(path))


def profile_bundle(bundle: str | Path, runs: int = 5, level: str = "basic", part: str | None = None,
                   target: str | None = None, inputs=None, trace: str | Path | None = None,
                   keep_dir: str | Path | None = None):
    """Per-op times of a bundle's compiled graph on the HTP simulator → ProfileReport."""
    check_arguments(level, runs)
    if keep_dir is not None and Path(keep_dir).exists() and not Path(keep_dir).is_dir():
        raise InputError(f"--keep {keep_dir} is a file: it names the folder the raw profiles are kept in",
                         "give a folder path (it is made if missing)")
    return runner_for(bundle).profile(bundle, runs, level, part, target, inputs, trace, keep_dir)


def check_verify_arguments(min_sqnr: float | None, max_samples: int | None, threshold_db: float | None = None) -> None:
    finite("--min-sqnr", min_sqnr, "20")
    finite("--threshold-db", threshold_db, "20")
    at_least("--samples", max_samples, 1, "4")
