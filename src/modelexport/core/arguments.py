"""Checks of numeric arguments shared by every verb and the Python API: a range or a NaN is refused
with the flag's name, before any work (`--repeat 0` used to run nothing and exit 0)."""
from __future__ import annotations

import math
import re

from .errors import InputError


def finite(flag: str, value: float | None, example: str) -> None:
    if value is not None and not math.isfinite(value):
        raise InputError(f"{flag} must be a finite number, got {value}", f"e.g. {flag} {example}")


def at_least(flag: str, value: float | None, minimum: float, example: str) -> None:
    """None means "not given"; NaN fails too (no comparison holds for it)."""
    if value is not None and not value >= minimum:
        raise InputError(f"{flag} must be at least {minimum}, got {value}", f"e.g. {flag} {example}")


# Binary units, as QNN counts VTCM (vtcm_mb=2 is written into a binary as 2097152 bytes).
SIZE_UNITS = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20}
_SIZE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def size_in_bytes(flag: str, value: int | float | str | None, bare_unit: str) -> int | None:
    """A memory size: a number with an optional unit (B, KB, MB; binary) → bytes. A bare number is in
    `bare_unit` (--vtcm-mb 2 is MB, the seeds' --vtcm_size 524288 is bytes). None means not given."""
    if value is None:
        return None
    m = _SIZE.match(str(value))
    unit = (m.group(2) if m else "").lower() or bare_unit.lower()
    if m is None or unit not in SIZE_UNITS:
        raise InputError(f"{flag} {value!r} is not a size", f"write a number with an optional unit, e.g. {flag} 2MB, "
                         f"{flag} 512KB or {flag} 1048576B (a bare number is {bare_unit})")
    size = float(m.group(1)) * SIZE_UNITS[unit]
    if not math.isfinite(size) or size < 1 or size != int(size):
        raise InputError(f"{flag} {value} is not a positive whole number of bytes", f"e.g. {flag} 2MB")
    return int(size)
