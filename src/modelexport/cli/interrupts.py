"""Ctrl-C or SIGTERM during a verb: partials removed, workers stopped, one line, exit 128+signal.

The signal raises `Interrupted` in the main thread, which unwinds through every `finally` that
removes a partial (atomic writes, the cache, worker pools that stop their workers). Python runs that
handler only between bytecodes, so while the main thread is inside native code (a QNN compile, the
HTP simulator) it would wait for that call to return: a watcher thread, woken through the signal
wakeup fd, gives the main thread a moment, then removes this process's partials itself, says so
and exits (the workers die with this process: toolchain/worker_pool.py).

The line says what the next identical command starts from: the cache entries this run finished
(a compile resumes from them), or that nothing was written.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from collections.abc import Iterator

from ..core.atomic import remove_partials
from ..core.cache import kept_this_run
from ..core.errors import Interrupted

# Ctrl-C; and `kill`, a job scheduler's or a container's stop, a CI timeout
SIGNALS = (signal.SIGINT, signal.SIGTERM)
NOTHING_KEPT = "nothing was written (partial files were removed)"
GRACE_S = 2.0       # how long native code may hold the main thread before the watcher acts


def interrupted_line() -> str:
    """The one line an interrupted verb ends with, its first word `interrupted`."""
    kept = kept_this_run()
    if not kept:
        return f"interrupted: {NOTHING_KEPT}"
    n = sum(sum(c.values()) for c in kept.values())
    where = "; ".join(f"{root} (" + ", ".join(f"{k} {ns}" for ns, k in sorted(c.items())) + ")"
                      for root, c in kept.items())
    return (f"interrupted; the next identical command resumes from the {n} cache entr{'y' if n == 1 else 'ies'} "
            f"this run finished, in {where}; partial files were removed")


class Caught:
    """The signal this verb received, if any. A library that runs our code inside its own (a
    pydantic serializer, a C callback) may turn the `Interrupted` raised there into an error of its
    own; the verb still ends as interrupted when `signum` is set."""

    signum: int | None = None

    def as_interrupted(self) -> Interrupted | None:
        return Interrupted(self.signum) if self.signum else None


@contextmanager
def interrupts_explained() -> Iterator[Caught]:
    caught = Caught()
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    handled = threading.Event()

    def on_signal(signum, frame):
        caught.signum = caught.signum or signum
        handled.set()
        raise Interrupted(signum)

    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(r, handled), daemon=True, name="modelexport-interrupts")
    watcher.start()
    try:
        yield caught
    finally:
        signal.set_wakeup_fd(previous_fd)
        for s, handler in previous.items():
            signal.signal(s, handler)
        os.close(w)            # the watcher reads EOF and ends
        watcher.join(timeout=1)


def _watch(r: int, handled: threading.Event) -> None:
    try:
        while True:
            data = os.read(r, 64)
            if not data:
                return
            got = [s for s in SIGNALS if s in data]
            if got and not handled.wait(GRACE_S):
                remove_partials()
                os.write(2, f"\n{interrupted_line()}\n".encode())
                os._exit(Interrupted(got[0]).exit_code)
    finally:
        os.close(r)
