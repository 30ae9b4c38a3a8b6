"""The Typer app and the small helpers every verb shares (console, --json output, progress)."""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from importlib.metadata import version as package_version
from typing import Any
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..core.compile_flags import FLAG_OF

app = typer.Typer(
    name="modelexport",
    help="Audit, quantize, compile, inspect, run and verify models for Snapdragon NPUs (Hexagon HTP), "
         "on the real QNN libraries.\n\nStart with `modelexport doctor`, then `modelexport targets`.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
)

# Piped or logged output (CI, `make demo | tee`) gets wide tables rather than rich's 80 columns,
# which cut names and numbers to "mobi…"; a terminal keeps its own width.
_PIPE_WIDTH = 160
console = Console(width=None if sys.stdout.isatty() else _PIPE_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else _PIPE_WIDTH)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"modelexport {package_version('modelexport')}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print modelexport's version and exit.")) -> None:
    pass


def option(name: str, panel: bool = True) -> Any:
    """The typer.Option of `compile`'s option `name` (its row in core.compile_flags); `panel=False`
    lists it with a verb's other options (compile-qnn, audit), not under its `compile --help` panel."""
    f = FLAG_OF[name]
    return typer.Option(f.default, *f.flags, help=f.help, rich_help_panel=f.panel if panel else None)


def emit_json(data: Any) -> None:
    """Machine-readable output goes to stdout alone, nothing else mixed in."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


class _Null:
    def update(self, *a, **k): pass
    def advance(self, *a, **k): pass


class _StageLines(_Null):
    """Progress for a log: a line when the stage changes (never one per step)."""

    def __init__(self, description: str):
        self.t0, self.last = time.perf_counter(), None
        self.update(description)

    def update(self, description: str | None = None, **k):
        if description and description != self.last:
            self.last = description
            print(f"[{time.perf_counter() - self.t0:7.1f} s] {description}", file=sys.stderr, flush=True)


@contextmanager
def progress(description: str, enabled: bool = True, total: float | None = None) -> Iterator[Any]:
    """A progress bar (or spinner when total is unknown) on stderr, not under --json (`enabled`).
    A log or pipe gets no bar (nor the blank line it leaves) but one plain line per stage, with
    the seconds since the start, --json or not: stdout stays the result alone."""
    if not err_console.is_terminal:
        yield _StageLines(description)
        return
    if not enabled:
        yield _Null()
        return
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=err_console, transient=True) as p:
        task = p.add_task(description, total=total)

        class _Task:
            def update(self, description: str | None = None, **k):
                p.update(task, description=description or p.tasks[0].description, **k)

            def advance(self, n: float = 1):
                p.advance(task, n)
        yield _Task()


STATUS_STYLE = {"OK": "bold green", "WARN": "bold yellow", "FAIL": "bold red", "HTP": "green", "CPU": "red", "blocks": "bold red"}
