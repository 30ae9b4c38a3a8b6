"""Write outputs so that a crash or Ctrl-C never leaves half a file that looks whole."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Iterator

from .errors import InputError, OutputExistsError


def check_output(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise OutputExistsError(f"{path} already exists",
                                "pass --force to replace it, or choose another output path")
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise InputError(f"cannot write {path}: {parent} is not a folder", "choose another output path")
    _check_writable(path, parent)


def _check_writable(path: Path, parent: Path) -> None:
    """Before any work: a compile that runs for minutes must not fail at its last step. Probed by
    creating a file, since permission bits do not tell (root, read-only mounts, /proc)."""
    folder = parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise InputError(f"cannot write {path}: {folder} is not writable ({e.strerror or e})",
                         "choose an output path in a folder you can write to, or fix that folder's permissions") from None


# Every partial named in this process, so an interrupt that cannot unwind (the main thread stuck in
# native code) can still remove them before exiting (cli/interrupts.py).
_PARTIALS: set[Path] = set()


def sibling_temp(path: Path, tag: str = "partial") -> Path:
    tmp = path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}")
    if tag == "partial":
        _PARTIALS.add(tmp)
    return tmp


def remove_partials() -> int:
    """Remove the partials of this process that still exist; how many there were."""
    n = 0
    for tmp in list(_PARTIALS):
        if tmp.exists() or tmp.is_symlink():
            n += 1
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() and not tmp.is_symlink() else tmp.unlink(missing_ok=True)
        _PARTIALS.discard(tmp)
    return n


def replace_path(tmp: Path, final: Path) -> None:
    """Move tmp into place; an existing final (allowed by --force) is swapped out, then removed."""
    _PARTIALS.discard(tmp)
    if final.exists() or final.is_symlink():
        trash = sibling_temp(final, "old")
        os.replace(final, trash)
        os.replace(tmp, final)
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)
    else:
        os.replace(tmp, final)


@contextmanager
def atomic_file(path: str | Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path`; it becomes `path` only if the block succeeds."""
    final = Path(path)
    check_output(final, force)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_temp(final)
    try:
        yield tmp
        if not tmp.exists():
            raise RuntimeError(f"nothing was written to {tmp}")
        replace_path(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink() if tmp.is_file() else shutil.rmtree(tmp, ignore_errors=True)
