"""One option setting, as each caller of modelexport writes it: a fix's `Setting` (core/errors.py)
rendered for the CLI, the Python API or a sweep matrix, so a user reads the fix in the words of
what they typed.

    cli    --input-shape x=1,3,N,N          (repeated per name; the flag of FLAGS, else --option-name)
    api    input_shapes={"x": [1, 3, N, N]}
    sweep  input_shapes: {x: [1, 3, N, N]}  (a model entry's key; other options under `options:`,
                                             precision and target as the matrix's lists)

A str in capitals ("N", "VALUE") is a placeholder the user replaces: written bare everywhere;
other strings are quoted as each language needs.
"""
from __future__ import annotations

import json
import re
import shlex
from typing import Any
from collections.abc import Callable, Mapping

from .compile_flags import COMPILE_FLAGS, FLAG_OF

# compile options whose CLI flag is not `--` + the name with dashes (their rows in core.compile_flags, and
# CompileOptions' `targets`; mappings are given per item)
FLAGS = {**{f.name: f.flags[0] for f in COMPILE_FLAGS if not f.cli and f.flags[0] != "--" + f.name.replace("_", "-")},
         "targets": FLAG_OF["target"].flags[0]}
# options a sweep matrix's model entry takes as keys of its own (sweeping/matrix.py builds its keys from this)
MATRIX_ENTRY_OPTIONS = ("calibration", "overrides", "input_shapes", "input_values")
# options that are the matrix's own lists
MATRIX_LISTS = {"precision": "precisions", "target": "targets", "targets": "targets"}


PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*")


def _placeholder(v: Any) -> bool:
    return isinstance(v, str) and PLACEHOLDER.fullmatch(v) is not None


def _bare(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(_bare(x) for x in v)
    return str(v) if _placeholder(v) or not isinstance(v, str) else shlex.quote(v)


def _python(v: Any) -> str:
    """Python source for a value; placeholders bare."""
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_python(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_python(x) for x in v) + "]"
    return v if _placeholder(v) else json.dumps(v) if isinstance(v, str) else repr(v)


def _yaml(v: Any) -> str:
    """YAML flow style for a value; placeholders bare."""
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k}: {_yaml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml(x) for x in v) + "]"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v) if _placeholder(v) or not isinstance(v, str) or re.fullmatch(r"[\w.=/\\-]+", v) else json.dumps(v)


def _cli(option: str, value: Any) -> str:
    flag = FLAGS.get(option, "--" + option.replace("_", "-"))
    if isinstance(value, Mapping):
        return " ".join(f"{flag} {k}={_bare(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)) and option in ("overrides", "targets"):
        return " ".join(f"{flag} {_bare(v)}" for v in value)
    if value is True:
        return flag
    return f"{flag} {_bare(value)}"


def _api(option: str, value: Any) -> str:
    return f"{option}={_python(value)}"


def _sweep(option: str, value: Any) -> str:
    if option in MATRIX_LISTS:
        return f"{MATRIX_LISTS[option]}: {_yaml(value if isinstance(value, (list, tuple)) else [value])}"
    if option in MATRIX_ENTRY_OPTIONS:
        return f"{option}: {_yaml(value)}"
    return f"options: {{{option}: {_yaml(value)}}}"


SPELLINGS: dict[str, Callable[[str, Any], str]] = {"cli": _cli, "api": _api, "sweep": _sweep}


def spell(caller: str, setting) -> str:
    return SPELLINGS[caller](setting.option, setting.value)
