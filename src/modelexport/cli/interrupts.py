"""Ctrl-C during a verb: always `interrupted: nothing was written`, partials removed, exit 130.

SIGINT raises `Interrupted` in the main thread, which unwinds through every `finally` that removes
a partial (atomic writes, the cache, worker pools that stop their workers). Python runs that
handler only between bytecodes, so while the main thread is inside native code (a QNN compile, the
HTP simulator) it would wait for that call to return: a watcher thread, woken through the signal
wakeup fd, gives the main thread a moment, then removes this process's partials itself, says so
and exits 130.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from ..core.atomic import remove_partials
from ..core.errors import Interrupted

MESSAGE = "interrupted: nothing was written (partial files were removed)"
GRACE_S = 2.0       # how long native code may hold the main thread before the watcher acts


@contextmanager
def interrupts_explained() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled = threading.Event()

    def on_sigint(signum, frame):
        handled.set()
        raise Interrupted()

    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.signal(signal.SIGINT, on_sigint)
    previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(r, handled), daemon=True, name="modelexport-interrupts")
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous)
        os.close(w)            # the watcher reads EOF and ends
        watcher.join(timeout=1)


def _watch(r: int, handled: threading.Event) -> None:
    try:
        while True:
            data = os.read(r, 64)
            if not data:
                return
            if signal.SIGINT in data and not handled.wait(GRACE_S):
                remove_partials()
                os.write(2, f"\n{MESSAGE}\n".encode())
                os._exit(130)
    finally:
        os.close(r)
