"""`--override 'REGEX=PRECISION'`: the split and the checks every path (ONNX, ExecuTorch, LLM) shares.
What a precision may be overridden with differs per path and stays with each parser."""
from __future__ import annotations

import re

from ..core.errors import InputError


def split_override(spec: str, example: str) -> tuple[str, str]:
    """→ (regex, precision name); `example` is the path's own `--override` example for the fix."""
    pattern, sep, prec = str(spec).rpartition("=")
    if not sep or not pattern or not prec:
        raise InputError(f"--override {spec!r} is not REGEX=PRECISION", f"e.g. --override '{example}'")
    try:
        re.compile(pattern)
    except re.error as e:
        raise InputError(f"--override {spec!r}: {pattern!r} is not a regular expression ({e})",
                         "escape dots as \\. and check brackets") from None
    return pattern, prec
