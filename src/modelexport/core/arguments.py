"""Checks of numeric arguments shared by every verb and the Python API: a range or a NaN is refused
with the flag's name, before any work (`--repeat 0` used to run nothing and exit 0)."""
from __future__ import annotations

import math

from .errors import InputError


def finite(flag: str, value: float | None, example: str) -> None:
    if value is not None and not math.isfinite(value):
        raise InputError(f"{flag} must be a finite number, got {value}", f"e.g. {flag} {example}")


def one_of(flag: str, value: str | None, choices) -> None:
    if value is not None and value not in choices:
        raise InputError(f"{flag} {value!r} is not one of {', '.join(choices)}", f"e.g. {flag} {next(iter(choices))}")


def at_least(flag: str, value: float | None, minimum: float, example: str) -> None:
    """None means "not given"; NaN fails too (no comparison holds for it)."""
    if value is not None and not value >= minimum:
        raise InputError(f"{flag} must be at least {minimum}, got {value}", f"e.g. {flag} {example}")
