"""Native libraries sometimes print to fd 1 (e.g. a 'LIBNATIVE' banner from libQnnHtp.so).

`--json` output must be the only thing on stdout, so native calls that may print run with
fd 1 pointed at stderr.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 1)
        os.close(saved)


@contextmanager
def capture_native_output() -> Iterator[list[str]]:
    """Everything written to fds 1 and 2 (native code and Python alike) inside the block."""
    lines: list[str] = []
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield lines
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            lines.extend(line.rstrip() for line in tmp.read().decode(errors="replace").splitlines() if line.strip())


@contextmanager
def filtered_stderr(drop: Callable[[str], bool]) -> Iterator[None]:
    """fd 2 through a filter while the block runs: lines for which `drop` is true are not shown,
    every other line is passed on as written (native code's and Python's alike)."""
    try:
        sys.stderr.flush()
        out = os.dup(2)
        r, w = os.pipe()
    except (OSError, ValueError, AttributeError):
        yield
        return

    def pump() -> None:
        # owns `out` and the read end; ends at EOF, when every copy of the write end is closed
        with os.fdopen(r, "rb") as pipe:
            for line in pipe:
                if not drop(line.decode(errors="replace")):
                    os.write(out, line)
        os.close(out)

    saved = os.dup(2)
    os.dup2(w, 2)
    os.close(w)
    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)          # closes the pipe's last write end: the pump reads EOF
        os.close(saved)
        thread.join(timeout=5)
