"""Nested inputs (tuples, lists, dicts of tensors or arrays) ↔ a flat list of named leaves.

One naming rule for example inputs and calibration samples alike, so both line up: a leaf is
named after its top-level argument, then its position or key at each level: an LSTM's
`forward(input, hx)` called with `(x, (h0, c0))` has the leaves `input`, `hx_0`, `hx_1`;
`{"ids": a, "mask": b}` given as argument `batch` gives `batch_ids`, `batch_mask`.
Pure Python: a leaf is anything that is not a tuple, list or dict.
"""
from __future__ import annotations

from typing import Any

CONTAINERS = (tuple, list, dict)


def is_nested(values: Any) -> bool:
    """True when some value of the sequence is itself a container."""
    return any(isinstance(v, CONTAINERS) for v in values)


def flatten_named(value: Any, name: str) -> list[tuple[str, Any]]:
    """`(h0, c0)` named `hx` → [("hx_0", h0), ("hx_1", c0)]; a leaf keeps `name`."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in flatten_named(v, f"{name}_{k}")]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in flatten_named(v, f"{name}_{i}")]
    return [(name, value)]


def flatten_args(args: Any, names: list[str]) -> list[tuple[str, Any]]:
    """Positional arguments → named leaves; argument i is named `names[i]`, else `input_i`."""
    out: list[tuple[str, Any]] = []
    for i, v in enumerate(args):
        out += flatten_named(v, names[i] if i < len(names) else f"input_{i}")
    return out


def template(value: Any, counter: list[int] | None = None) -> Any:
    """The structure of `value` with each leaf replaced by its index in the flat order."""
    counter = counter if counter is not None else [0]
    if isinstance(value, dict):
        return {k: template(v, counter) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(template(v, counter) for v in value)
    counter[0] += 1
    return counter[0] - 1


def unflatten(tmpl: Any, flat: Any) -> Any:
    """Inverse of flattening: put `flat[i]` where `template` left index i."""
    if isinstance(tmpl, dict):
        return {k: unflatten(v, flat) for k, v in tmpl.items()}
    if isinstance(tmpl, (tuple, list)):
        return type(tmpl)(unflatten(v, flat) for v in tmpl)
    return flat[tmpl]
