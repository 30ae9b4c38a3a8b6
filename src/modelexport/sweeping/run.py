"""`modelexport sweep`: every cell of a matrix compiled, locally or on Ray, into OUT/, with
results.json, results.csv and report.html.

Order of work: the matrix is checked whole (every problem at once); OUT is checked (absent, empty,
or an earlier sweep's); the executor is opened (Ray: connected — an unreachable cluster stops here,
with nothing written); then, holding OUT/.sweep.lock, a killed run's temporary folders are
discarded, complete cells are reused (unless `force`) and the missing ones run, at most `slots` at
a time. A cell whose worker died runs once more; then it is reported failed, like any other.
"""
from __future__ import annotations

import datetime as _dt
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock, Timeout

from ..core.atomic import check_output
from ..core.errors import InputError, ModelExportError, clip
from .cells import Cell, discard_partials, discard_partials_of, is_complete, plan_cells
from .executors import open_executor
from .matrix import load_matrix
from .page import write_page
from .results import cell_row, ship_table, sort_rows, write_results

MAX_ATTEMPTS = 2
LOCK_NAME = ".sweep.lock"
RESULTS_NAME = "results.json"
Progress = Callable[[str, float, float], None]


def check_sweep_output(out: Path) -> None:
    """OUT is new, empty, or an earlier sweep's (a re-run fills in its missing cells)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file, not a folder", "give -o a folder (new, empty, or an earlier sweep's)")
    if out.is_dir() and any(out.iterdir()) and not ((out / RESULTS_NAME).is_file() or (out / LOCK_NAME).exists()):
        raise InputError(f"{out} holds files that are not a sweep's output",
                         "choose another -o: a new or empty folder, or the folder of an earlier sweep to complete it")
    check_output(out / RESULTS_NAME, force=True)      # writable, before any work


class _Tally:
    """Progress lines a person can follow in a log: done / running / failed, elapsed, time left."""

    def __init__(self, total: int, reused: int, slots: int, say: Progress):
        self.total, self.done, self.failed, self.slots, self.say = total, reused, 0, slots, say
        self.running: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.cell_seconds: list[float] = []

    def started(self, cell: Cell) -> None:
        self.running[cell.key] = time.perf_counter()
        self.note()

    def ended(self, cell: Cell, outcome: dict[str, Any], retrying: str | None = None) -> None:
        started = self.running.pop(cell.key, self.t0)
        if retrying:
            self.note(f"{cell.key}: {retrying}; running it again")
            return
        self.done += 1
        self.failed += outcome.get("status") == "failed"
        self.cell_seconds.append(time.perf_counter() - started)
        self.note(f"{cell.key} {outcome.get('status')}" + (f": {outcome.get('reason')}" if outcome.get("status") == "failed" else ""))

    def note(self, event: str | None = None) -> None:
        elapsed = time.perf_counter() - self.t0
        left = ""
        if self.cell_seconds:
            per = sum(self.cell_seconds) / len(self.cell_seconds)
            left = f", ~{per * (self.total - self.done) / self.slots:.0f} s left"
        names = ", ".join(list(self.running)[:3]) + (" ..." if len(self.running) > 3 else "")
        msg = (f"sweep: {self.done}/{self.total} cells done ({self.failed} failed), {len(self.running)} running"
               + (f" [{names}]" if names else "") + f", {elapsed:.0f} s{left}" + (f" | {event}" if event else ""))
        self.say(msg, self.done, self.total)


def run_cells(executor, cells: list[Cell], jobs: dict[str, dict], tally: _Tally) -> dict[str, dict[str, Any]]:
    """Every cell's outcome; at most `executor.slots` in flight; a lost cell (its worker died) once more."""
    queue = deque((c, 1) for c in cells)
    inflight: dict[Future, tuple[Cell, int]] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    while queue or inflight:
        while queue and len(inflight) < executor.slots:
            cell, attempt = queue.popleft()
            try:
                future = executor.submit(jobs[cell.key], cell, attempt)
            except ModelExportError as e:    # e.g. an LLM whose estimate cannot be made: this cell fails, not the sweep
                future = Future()
                future.set_result({"cell": cell.key, "status": "failed", "reason": clip(e.problem, 400), "fix": e.in_words_of("sweep").fix,
                                   "error": type(e).__name__, "exit_code": e.exit_code})
            inflight[future] = (cell, attempt)
            tally.started(cell)
        done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
        for f in done:
            cell, attempt = inflight.pop(f)
            try:
                outcome = f.result()
            except Exception as e:      # noqa: BLE001 - only a dead worker is expected here
                why = executor.lost(e)
                if why is None:
                    raise
                discard_partials_of(Path(jobs[cell.key]["bundle"]))
                if attempt < MAX_ATTEMPTS:
                    queue.append((cell, attempt + 1))
                    tally.ended(cell, {}, retrying=why)
                    continue
                outcome = {"cell": cell.key, "status": "failed", "error": "ToolchainError", "exit_code": 2,
                           "reason": f"{why}, {attempt} times",
                           "fix": f"compile it alone (`modelexport compile {cell.model.path} -t {cell.target} "
                                  f"-p {cell.precision.name}`) to see where; report the model if it persists"}
            outcomes[cell.key] = outcome
            tally.ended(cell, outcome)
    return outcomes


def run_sweep(matrix: str | Path, output: str | Path, compile_fn: Callable[..., Any], force: bool = False,
              workers: int | None = None, ray: str | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Run the matrix into `output` → the results (as written to results.json)."""
    say = progress or (lambda msg, done, total: None)
    t0 = time.perf_counter()
    m = load_matrix(matrix)
    out = Path(output)
    check_sweep_output(out)
    with open_executor(workers, ray) as executor:
        out.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(out / LOCK_NAME))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise InputError(f"another sweep is writing {out}", "wait for it to finish, or choose another -o") from None
        try:
            discarded = discard_partials(out)
            cells = plan_cells(m)
            reused = [] if force else [c for c in cells if is_complete(c.folder(out))]
            todo = [c for c in cells if c not in reused]
            tally = _Tally(len(cells), len(reused), executor.slots, say)
            if reused:
                tally.note(f"reusing {len(reused)} complete cell(s) (--force compiles them again)")
            if discarded:
                tally.note(f"discarded {len(discarded)} unfinished cell folder(s) of an interrupted run")
            jobs = {c.key: c.job(out, force, compile_fn) for c in todo}
            outcomes = run_cells(executor, todo, jobs, tally)
            rows = sort_rows([cell_row(c, out, outcomes.get(c.key), c in reused) for c in cells], cells)
            results = {
                "matrix": str(m.path), "matrix_sha256": m.sha256, "output": str(out),
                "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "run": executor.describe() | {"wall_s": round(time.perf_counter() - t0, 3), "force": force},
                "summary": {"cells": len(cells), "compiled": sum(r["status"] == "compiled" for r in rows),
                            "failed": sum(r["status"] == "failed" for r in rows), "reused": len(reused),
                            "ran": len(todo), "discarded_partials": len(discarded)},
                "ship": ship_table(rows), "cells": rows}
            write_results(out, results)
            write_page(out, results)
            return results
        finally:
            lock.release()
