"""The artifact bundle: a folder of files plus manifest.json, written atomically.

A bundle is assembled in a hidden temporary folder beside its destination and renamed into
place only when complete, so a failure mid-write leaves no bundle behind.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from ..core.errors import InputError, IntegrityError
from ..core.atomic import check_output, replace_path, sibling_temp
from ..core.files import MANIFEST_NAME, REPORT_NAME, sha256_file
from ..core.targets import get_target
from ..core.vocab import Role
from .report import write_report

if TYPE_CHECKING:
    from .manifest import FileEntry, Manifest

# Called with (folder, manifest) just before a bundle is sealed: e.g. the HTML report.
_finalizers: list[Callable[[Path, Manifest], None]] = []


def add_finalizer(fn: Callable[[Path, Manifest], None]) -> Callable[[Path, Manifest], None]:
    _finalizers.append(fn)
    return fn


class BundleWriter:
    """`with BundleWriter(out, force) as w: ...write into w.dir...; w.manifest.x = ...`"""

    def __init__(self, out: str | Path, force: bool = False, manifest: Manifest | None = None):
        self.out = Path(out)
        self.force = force
        check_output(self.out, force)
        from .manifest import Manifest   # deferred: pydantic (~110 ms), kept off CLI start-up
        self.manifest = manifest or Manifest()
        self.dir = sibling_temp(self.out)
        self.roles: dict[str, Role] = {}

    def __enter__(self) -> BundleWriter:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir()
        return self

    def path(self, rel: str, role: Role = Role.ARTIFACT) -> Path:
        role = Role(role)                 # a word the readers know, or ValueError
        p = self.dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        self.roles[rel] = role
        return p

    def add_file(self, src: str | Path, rel: str | None = None, role: Role = Role.ARTIFACT) -> str:
        rel = rel or Path(src).name
        shutil.copyfile(src, self.path(rel, role))
        return rel

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return False
        try:
            self._seal()
            replace_path(self.dir, self.out)
        finally:
            if self.dir.exists():
                shutil.rmtree(self.dir, ignore_errors=True)
        return False

    def _entries(self, known: dict[str, FileEntry]) -> list[FileEntry]:
        from .manifest import FileEntry   # deferred: pydantic (~110 ms), kept off CLI start-up
        out = []
        for p in sorted(self.dir.rglob("*")):
            rel = p.relative_to(self.dir).as_posix()
            if not p.is_file() or rel == MANIFEST_NAME:
                continue
            entry = known.get(rel)
            if entry is None or entry.size != p.stat().st_size:
                entry = FileEntry(path=rel, size=p.stat().st_size, sha256=sha256_file(p), role=self.roles.get(rel, Role.ARTIFACT))
            out.append(entry)
        return out

    def _seal(self) -> None:
        from .manifest import tool_versions   # deferred: pydantic (~110 ms), kept off CLI start-up
        m = self.manifest
        m.versions = tool_versions() | m.versions
        m.files = self._entries({})
        for fn in _finalizers:
            fn(self.dir, m)
        self.roles[REPORT_NAME] = Role.REPORT
        write_report(self.dir, m, REPORT_NAME)  # sees the artifact files; lists itself next time it is rebuilt
        m.files = self._entries({f.path: f for f in m.files})
        (self.dir / MANIFEST_NAME).write_text(m.to_json())


class Bundle:
    """A bundle folder and its manifest, validated on first use; `data` is the same manifest as
    plain JSON, for printing a result without importing pydantic."""

    def __init__(self, path: Path, manifest: Manifest | None = None, data: dict[str, Any] | None = None):
        self.path = Path(path)
        self._manifest = manifest
        self._data = data

    @classmethod
    def from_trusted(cls, path: Path) -> Bundle:
        """A bundle modelexport itself just wrote (e.g. restored from the memo): read, not re-checked."""
        return cls(path, data=json.loads((Path(path) / MANIFEST_NAME).read_text()))

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            from .manifest import Manifest   # deferred: pydantic (~110 ms), kept off CLI start-up
            self._manifest = Manifest.model_validate(self._data or {})
        return self._manifest

    @property
    def data(self) -> dict[str, Any]:
        if self._manifest is not None:          # may have been edited since it was read
            return json.loads(self._manifest.to_json())
        return self._data or {}

    def file(self, rel: str) -> Path:
        """A file the manifest names; IntegrityError if it leads outside the bundle (a link out of it)."""
        p = self.path / rel
        if not p.resolve().is_relative_to(self.path.resolve()):
            raise IntegrityError(f"bundle {self.path}: {rel} leads outside the bundle (to {p.resolve()})",
                                 "rebuild the bundle (modelexport compile ... --force); do not edit files inside it")
        return p

    def check_selection(self, part: str | None, target: str | None) -> str | None:
        """A `--part` / `--target` choice among this bundle's graphs → the target's canonical name (None:
        any); an InputError naming what the bundle has."""
        want = get_target(target).name if target else None
        parts = {g.part for g in self.manifest.graphs}
        if part and part not in parts:
            raise InputError(f"{self.path} has no part {part!r}", f"parts: {', '.join(sorted(p for p in parts if p))}")
        if want and want not in self.manifest.targets:
            raise InputError(f"{self.path} was not compiled for {want}", f"its targets: {', '.join(self.manifest.targets)}")
        return want

    def problems(self) -> list[str]:
        """Every file the manifest names must exist with its recorded size and sha256."""
        out = []
        for f in self.manifest.files:
            p = self.path / f.path
            if not p.resolve().is_relative_to(self.path.resolve()):
                out.append(f"{f.path}: leads outside the bundle (to {p.resolve()})")
            elif not p.is_file():
                out.append(f"{f.path}: missing")
            elif p.stat().st_size != f.size:
                out.append(f"{f.path}: size {p.stat().st_size} B, manifest says {f.size} B (truncated or replaced)")
            elif sha256_file(p) != f.sha256:
                out.append(f"{f.path}: sha256 differs from the manifest (modified after it was written)")
        return out

    def verify_integrity(self) -> None:
        problems = self.problems()
        if problems:
            raise IntegrityError(f"bundle {self.path} does not match its manifest: " + "; ".join(problems),
                                 "rebuild the bundle (modelexport compile ... --force); do not edit files inside it")


def is_bundle(path: str | Path) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()


def open_bundle(path: str | Path, verify: bool = True) -> Bundle:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p} does not exist", "give the folder that `modelexport compile -o` wrote")
    if not is_bundle(p):
        raise InputError(f"{p} is not a modelexport bundle (no {MANIFEST_NAME})",
                         "give the folder that `modelexport compile -o` wrote")
    from .manifest import SCHEMA_VERSION, Manifest, ValidationError   # deferred: pydantic (~110 ms), kept off CLI start-up
    try:
        data = json.loads((p / MANIFEST_NAME).read_text())
        version = data.get("schema_version") if isinstance(data, dict) else None
        if isinstance(version, int) and version > SCHEMA_VERSION:   # before its new words fail validation
            raise InputError(f"bundle schema {version} is newer than this modelexport understands",
                             "upgrade modelexport")
        manifest = Manifest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise IntegrityError(f"{p / MANIFEST_NAME} is not a valid manifest: {where}: {first['msg']}",
                             "rebuild the bundle with --force; do not edit its manifest") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IntegrityError(f"{p / MANIFEST_NAME} is not a valid manifest: {str(e).splitlines()[0]}",
                             "rebuild the bundle with --force") from None
    bundle = Bundle(p, manifest)
    if verify:
        bundle.verify_integrity()
    return bundle


def refresh_report(bundle: Bundle) -> Path:
    """Rebuild report.html inside a bundle from its (possibly updated) manifest, then re-seal the manifest."""
    m = bundle.manifest
    out = write_report(bundle.path, m, REPORT_NAME)
    from .manifest import FileEntry   # deferred: pydantic (~110 ms), kept off CLI start-up
    entry = FileEntry(path=REPORT_NAME, size=out.stat().st_size, sha256=sha256_file(out), role=Role.REPORT)
    m.files = [f for f in m.files if f.path != REPORT_NAME] + [entry]
    save_manifest(bundle)
    return out


def save_manifest(bundle: Bundle) -> None:
    """Atomically rewrite manifest.json (e.g. after verify records numerics)."""
    tmp = bundle.path / (MANIFEST_NAME + ".tmp")
    tmp.write_text(bundle.manifest.to_json())
    tmp.replace(bundle.path / MANIFEST_NAME)
