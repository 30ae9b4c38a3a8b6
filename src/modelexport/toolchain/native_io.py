"""Native libraries sometimes print to fd 1 (e.g. a 'LIBNATIVE' banner from libQnnHtp.so).

`--json` output must be the only thing on stdout, so native calls that may print run with
fd 1 pointed at stderr.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator


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
