"""`--override 'REGEX=PRECISION'`: the one override type and its parser, shared by every path
(ONNX, ExecuTorch, LLM). Which precisions an override may take differs per path: each path passes
the names its format offers and its own check."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ..core.errors import InputError
from .precision import Precision, get_precision


@dataclass(frozen=True)
class Override:
    pattern: str
    precision: Precision

    def matches(self, *names: str | None) -> bool:
        """The regex is found in one of the node's names (module paths, node name); empty ones are skipped."""
        return any(n and re.search(self.pattern, n) for n in names)


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


def parse_override_specs(specs: list[str] | None, example: str, check: Callable[[str, Precision], None],
                         offered: tuple[str, ...] | None = None) -> list[Override]:
    """'REGEX=PRECISION' specs → Overrides, in order. `offered`: the format's precision names (see
    get_precision); `check(spec, precision)` raises when the path does not take that override."""
    out = []
    for spec in specs or []:
        pattern, name = split_override(spec, example)
        p = get_precision(name, offered)
        check(spec, p)
        out.append(Override(pattern, p))
    return out
