"""Entry point: load every verb, run, and turn user-fixable errors into two clear lines."""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import click
import typer
from rich.markup import escape

from ..core.errors import Interrupted, ModelExportError
from ..toolchain.library_loggers import quiet_library_loggers
from ..toolchain.qnn_log_level import describe
from . import commands
from .app import app, err_console
from .interrupts import Caught, interrupted_line, interrupts_explained

# Usage errors (unknown option, bad value): typer ≥ 0.29 raises those of its own copy of click,
# not click's; both are caught so a typo never shows a traceback.
try:
    from typer._click.exceptions import ClickException as TyperClickException
    CLICK_ERRORS: tuple[type, ...] = (click.ClickException, TyperClickException)
except ImportError:
    CLICK_ERRORS = (click.ClickException,)

EXITS = (click.exceptions.Exit, typer.Exit)
ABORTS = (click.exceptions.Abort, typer.Abort)


def _quiet_libraries() -> None:
    quiet_library_loggers()


def _load_commands() -> None:
    for mod in pkgutil.iter_modules(commands.__path__):
        importlib.import_module(f"{commands.__name__}.{mod.name}")


def _say_qnn_log_level() -> None:
    """QNN_LOG_LEVEL is honoured by mapping (toolchain.qnn_log_level): say so once, on stderr."""
    note = describe()
    if note:
        err_console.print(f"[bold]note[/]: {note}", highlight=False, soft_wrap=True)


def _say_interrupted() -> None:
    rest = escape(interrupted_line().removeprefix("interrupted"))   # a path may hold [brackets]
    err_console.print(f"[bold red]interrupted[/]{rest}", highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    _load_commands()
    with interrupts_explained() as caught:
        try:
            return _main(argv, caught)
        except Exception:
            if (e := caught.as_interrupted()) is None:
                raise
            _say_interrupted()   # a library wrapped our Interrupted in an error of its own
            return e.exit_code


def _main(argv: list[str] | None, caught: Caught) -> int:
    try:
        _say_qnn_log_level()
        rc = app(args=argv, standalone_mode=False)  # click returns Exit codes here
        return rc if isinstance(rc, int) else 0
    except Interrupted as e:
        _say_interrupted()
        return e.exit_code
    except ModelExportError as e:
        if (stop := caught.as_interrupted()) is not None:   # our error, made of a wrapped Interrupted
            _say_interrupted()
            return stop.exit_code
        e.in_words_of("cli")       # the API it called wrote its fix in Python's words
        err_console.print(f"[bold red]error:[/] {e.problem}", highlight=False, soft_wrap=True)
        if e.fix:
            err_console.print(f"  [bold]fix:[/] {e.fix}", highlight=False, soft_wrap=True)
        if os.environ.get("MODELEXPORT_DEBUG"):
            raise
        return e.exit_code
    except EXITS as e:
        if isinstance(e.__cause__, KeyboardInterrupt):   # typer's silent exit 130 for a Ctrl-C it caught
            _say_interrupted()
        return e.exit_code
    except CLICK_ERRORS as e:
        e.show()
        return e.exit_code
    except ABORTS:
        err_console.print("[bold red]aborted[/]")
        return 130
    except KeyboardInterrupt:
        _say_interrupted()
        return Interrupted.exit_code


def run() -> None:
    sys.exit(main())
