"""A content-addressed cache of compiled results.

The key is the sha256 of everything that shapes a result: the model bytes, the options and the
QAIRT build. An entry is a folder, assembled under a temporary name and renamed into place
while holding a per-key file lock, so two processes compiling the same thing at once never see
half an entry; the loser of the race reuses the winner's entry. `MODELEXPORT_CACHE_DIR` moves
the cache (default ~/.cache/modelexport); `--no-cache` bypasses it.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from filelock import FileLock, Timeout

from .atomic import sibling_temp

ENTRY_META = "entry.json"
SCHEMA = 1


def cache_root() -> Path:
    env = os.environ.get("MODELEXPORT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "modelexport"


def cache_key(*parts: Any) -> str:
    """sha256 over bytes / str / JSON-able parts, each length-prefixed so boundaries count."""
    h = hashlib.sha256(f"modelexport-cache-v{SCHEMA}".encode())
    for p in parts:
        b = p if isinstance(p, (bytes, bytearray)) else (p if isinstance(p, str) else json.dumps(p, sort_keys=True, default=str)).encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def code_fingerprint() -> str:
    """Names, sizes and modification times of the package's own sources: an entry made by other
    code (an upgrade, an edit) is not reused."""
    root = Path(__file__).resolve().parents[1]   # the whole package
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        st = f.stat()
        h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


_SWEPT: set[Path] = set()


def sweep_stale_partials(root: Path) -> list[Path]:
    """Remove the half-built entries a killed process (kill -9, a crash) left behind. A partial
    `.KEY.partial-*` is being built by whoever holds `KEY.lock`; it is removed only when that lock
    can be taken at once, so a live compile's partial is never touched."""
    removed = []
    for tmp in root.glob("*/*/.*.partial-*"):
        key = tmp.name[1:].rpartition(".partial-")[0]
        lock = FileLock(str(tmp.parent / f"{key}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue                      # a live build of that entry
        try:
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
            removed.append(tmp)
        finally:
            lock.release()
    return removed


# Each enabled cache root this process used, and when it first did: what an interrupted run leaves
# for the next one is what it added since (cli/interrupts.py). Read from disk, since its workers
# add entries too.
_FIRST_USED: dict[Path, float] = {}


def kept_this_run() -> dict[Path, dict[str, int]]:
    """Per cache root this process used: the entries finished since, counted per namespace."""
    kept: dict[Path, dict[str, int]] = {}
    for root, since in _FIRST_USED.items():
        counts: dict[str, int] = {}
        for meta in root.glob(f"*/*/*/{ENTRY_META}"):
            try:
                new = not meta.parent.name.startswith(".") and meta.stat().st_mtime >= since
            except OSError:     # removed meanwhile
                continue
            if new:
                ns = meta.parent.parent.parent.name
                counts[ns] = counts.get(ns, 0) + 1
        if counts:
            kept[root] = counts
    return kept


class Cache:
    def __init__(self, root: Path | None = None, enabled: bool = True):
        self.root = root or cache_root()
        self.enabled = enabled
        self.hits = 0
        self.misses = 0
        if enabled:
            _FIRST_USED.setdefault(self.root, time.time())
        if enabled and self.root not in _SWEPT and self.root.is_dir():   # once per process and root
            _SWEPT.add(self.root)
            sweep_stale_partials(self.root)

    def _entry(self, namespace: str, key: str) -> Path:
        return self.root / namespace / key[:2] / key

    def get(self, namespace: str, key: str) -> Path | None:
        if not self.enabled:
            return None
        p = self._entry(namespace, key)
        if (p / ENTRY_META).is_file():
            self.hits += 1
            return p
        return None

    def get_or_create(self, namespace: str, key: str, build: Callable[[Path], dict]) -> tuple[Path, bool]:
        """The entry's folder and whether it was a hit. `build(tmp_dir)` fills a fresh folder and
        returns metadata stored as entry.json. With the cache off, builds into a private temp folder."""
        if not self.enabled:
            tmp = Path(tempfile.mkdtemp(prefix="modelexport-nocache-"))
            if multiprocessing.parent_process() is None:
                # used until the process ends; a worker's entries are its parent's to read, then remove
                atexit.register(shutil.rmtree, tmp, ignore_errors=True)
            meta = build(tmp)
            (tmp / ENTRY_META).write_text(json.dumps(meta, default=str))
            self.misses += 1
            return tmp, False
        hit = self.get(namespace, key)
        if hit:
            return hit, True
        final = self._entry(namespace, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if (final / ENTRY_META).is_file():      # another process finished it while we waited
                self.hits += 1
                return final, True
            tmp = sibling_temp(final)
            tmp.mkdir()
            try:
                meta = build(tmp)
                (tmp / ENTRY_META).write_text(json.dumps(meta, default=str))
                if final.exists():                    # a broken leftover without entry.json
                    shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        self.misses += 1
        return final, False

    @staticmethod
    def meta(entry: Path) -> dict:
        return json.loads((entry / ENTRY_META).read_text())
