"""The one rule for a bundle's default folder name when the caller gives no output (API and CLI).

The name carries what tells two compiles of one model apart — format, precision, targets — so the
seed's calls in a row (a float DLC, a quantized DLC, a context binary) each get their own folder
instead of the second failing with "already exists". Only what the caller chose goes in: a plain
`compile("model.onnx")` still writes `model_bundle`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from collections.abc import Iterable

from ..core.targets import get_target


def _stem(model: Any) -> str:
    if isinstance(model, (str, Path)):
        return Path(str(model).split(":")[0]).stem
    return type(getattr(model, "module", model)).__name__.lower()


def default_output(model: Any, output_format: str | None = None, precision: str | None = None,
                   targets: Iterable[str] = ()) -> Path:
    """`<stem>[_<format>][_<precision>][_<target>...]_bundle` in the working directory."""
    pieces = [_stem(model)]
    if output_format:
        pieces.append(output_format)
    if precision:
        pieces.append(precision)
    pieces += [get_target(t).name for t in targets]   # canonical: "8gen3" and "SM8650" name one folder
    return Path(re.sub(r"[^A-Za-z0-9._+]+", "_", "_".join(pieces)) + "_bundle")
