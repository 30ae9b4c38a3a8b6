"""The matrix file of `modelexport sweep`: models × targets × precisions, checked whole before any work.

```yaml
models:
  - mobilenet.onnx                      # a path of any input kind `compile` takes (relative to this file)
  - path: model.py:build                # or an entry with per-model settings
    name: tiny                          # the folder name of its cells (default: the file's stem)
    calibration: calib/                 # folder | input list .txt | .npz | random | a text file (LLMs)
    overrides: ['layers\\.0=16a8w']
    input_shapes: {x: [1, 3, 224, 224]}
    options: {strict: true}             # any other `compile` option, by its Python name
targets: [SM8650, SM8750]
precisions:
  - fp16
  - {name: 16a4w_block, max_ppl_ratio: 1.05}   # the LLM path's quality budget (other kinds ignore it)
options: {optimization_level: 3}        # options for every model (a model's own win)
```
JSON with the same keys works too. Every problem (an unknown key, target or precision, a missing
model path, a malformed entry) is collected and raised at once, each with its fix.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ..backends.spec import OPTION_OWNERS, CompileOptions
from ..core.errors import InputError, ModelExportError
from ..core.spellings import MATRIX_ENTRY_OPTIONS
from ..core.targets import get_target
from ..frontends import find_frontend

TOP_KEYS = ("models", "targets", "precisions", "options")
MODEL_KEYS = ("path", "name", *MATRIX_ENTRY_OPTIONS, "options")
PRECISION_KEYS = ("name", "max_ppl_ratio")
# set by the sweep per cell, never by the matrix
CELL_OPTIONS = ("targets", "target", "precision", "output", "force", "progress", "calibration", "input_shapes",
                "input_values", "overrides")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: str                      # absolute, as `compile` takes it (model.py:FUNCTION kept whole)
    kind: str                      # the frontend's kind: onnx, torch, llm
    calibration: str | None = None
    overrides: tuple[str, ...] = ()
    input_shapes: Any = None
    input_values: Any = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PrecisionEntry:
    name: str
    max_ppl_ratio: float | None = None


@dataclass(frozen=True)
class Matrix:
    path: Path
    sha256: str
    models: tuple[ModelEntry, ...]
    targets: tuple[str, ...]       # canonical SoC names
    precisions: tuple[PrecisionEntry, ...]


class _Problems:
    def __init__(self, source: Path):
        self.source = source
        self.items: list[tuple[str, str]] = []     # (problem, fix)

    def add(self, problem: str, fix: str) -> None:
        self.items.append((problem, fix))

    def catch(self, where: str, err: ModelExportError) -> None:
        self.add(f"{where}: {err.problem}", err.in_words_of("sweep").fix or "")

    def raise_if_any(self) -> None:
        if not self.items:
            return
        n = len(self.items)
        problem = f"{self.source}: {n} problem{'s' if n > 1 else ''}: " + " ".join(
            f"({i}) {p}" for i, (p, _) in enumerate(self.items, 1))
        fix = " ".join(f"({i}) {f}" for i, (_, f) in enumerate(self.items, 1) if f)
        raise InputError(problem, fix + " (`modelexport sweep --help` shows the matrix format)")


def _read(path: Path) -> Any:
    if not path.is_file():
        raise InputError(f"matrix file {path} does not exist", "check the path (a .yaml or .json matrix)")
    try:
        if path.suffix.lower() == ".json":
            return json.loads(path.read_text())
        return yaml.safe_load(path.read_text())
    except Exception as e:
        raise InputError(f"{path} is not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: "
                         f"{str(e).splitlines()[0]}", "`modelexport sweep --help` shows the matrix format") from None


def _unknown_keys(problems: _Problems, where: str, given, known: tuple[str, ...]) -> None:
    for k in sorted(set(given) - set(known), key=str):
        problems.add(f"{where}: unknown key {k!r}", f"{where} takes: {', '.join(known)}")


def _known_options() -> set[str]:
    return {f.name for t in (CompileOptions, *OPTION_OWNERS) for f in fields(t)} - set(CELL_OPTIONS)


def _check_options(problems: _Problems, where: str, options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        problems.add(f"{where}: `options` must be a mapping", "write options: {strict: true}")
        return {}
    known = _known_options()
    for k in sorted(set(options) - known, key=str):
        problems.add(f"{where}: unknown option {k!r}", f"options take `compile`'s Python names: {', '.join(sorted(known))}")
    return {k: v for k, v in options.items() if k in known}


def _file_part(value: str) -> str:
    """The file of `model.py:build`, or the path itself."""
    return value.rpartition(":")[0] if ".py:" in value else value


def _model_path(base: Path, value: str) -> str:
    """Relative to the matrix file; `model.py:build` keeps its function name."""
    file_part = _file_part(value)
    sep, func = (":", value.rpartition(":")[2]) if file_part != value else ("", "")
    p = Path(file_part).expanduser()
    p = p if p.is_absolute() else base / p
    return f"{p}{sep}{func}"


def _entry(problems: _Problems, where: str, raw: Any, main: str, known: tuple[str, ...], example: str) -> dict | None:
    """A list item as a mapping: a bare string is its `main` key; unknown keys are problems."""
    entry = {main: raw} if isinstance(raw, str) else raw
    if not isinstance(entry, dict) or not isinstance(entry.get(main), str):
        problems.add(f"{where}: no `{main}`", f"write {example}")
        return None
    _unknown_keys(problems, where, entry, known)
    return entry


def _model(problems: _Problems, base: Path, i: int, raw: Any, top_options: dict, taken: set[str]) -> ModelEntry | None:
    where = f"models[{i}]"
    entry = _entry(problems, where, raw, "path", MODEL_KEYS, "a path, or {path: model.onnx, calibration: ...}")
    if entry is None:
        return None
    path = _model_path(base, entry["path"])
    if not Path(_file_part(path)).exists():
        problems.add(f"{where}: model {entry['path']!r} does not exist ({_file_part(path)})",
                     "check the path (relative to the matrix file)")
        return None
    try:
        kind = find_frontend(path).kind
    except ModelExportError as e:
        problems.catch(f"{where} ({entry['path']})", e)
        return None
    name = str(entry.get("name") or Path(_file_part(path)).stem)
    if name in taken:
        problems.add(f"{where}: the name {name!r} is taken by another model", "give one of them `name: ...`")
    taken.add(name)
    calibration = entry.get("calibration")
    if calibration is not None and str(calibration).lower() != "random":
        calibration = _model_path(base, str(calibration))
        if not Path(calibration).exists():
            problems.add(f"{where}: calibration {entry['calibration']!r} does not exist",
                         "give a folder, an input list .txt, a .npz, or random (LLMs: a text file)")
    overrides = entry.get("overrides") or ()
    if isinstance(overrides, str):
        overrides = (overrides,)
    options = {**top_options, **_check_options(problems, where, entry.get("options"))}
    return ModelEntry(name, path, kind, calibration, tuple(str(o) for o in overrides), entry.get("input_shapes"),
                      entry.get("input_values"), options)


def _precision(problems: _Problems, i: int, raw: Any) -> PrecisionEntry | None:
    from ..quant.precision import get_precision
    where = f"precisions[{i}]"
    entry = _entry(problems, where, raw, "name", PRECISION_KEYS, "8a8w, or {name: 16a4w_block, max_ppl_ratio: 1.05}")
    if entry is None:
        return None
    try:
        name = get_precision(entry["name"]).name
    except ModelExportError as e:
        problems.catch(where, e)
        return None
    ratio = entry.get("max_ppl_ratio")
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio >= 1.0):
        problems.add(f"{where}: max_ppl_ratio must be a number of at least 1.0, got {ratio!r}", "e.g. max_ppl_ratio: 1.05")
        ratio = None
    return PrecisionEntry(name, float(ratio) if ratio is not None else None)


def _list(problems: _Problems, data: dict, key: str, example: str) -> list:
    value = data.get(key)
    if isinstance(value, (str, dict)):
        value = [value]
    if not isinstance(value, list) or not value:
        problems.add(f"no `{key}:` list", f"write {key}: {example}")
        return []
    return value


def load_matrix(path: str | Path) -> Matrix:
    """The whole matrix, or one InputError listing every problem found in it."""
    p = Path(path)
    data = _read(p)
    problems = _Problems(p)
    if not isinstance(data, dict):
        problems.add("the file is not a mapping", "write models: [...], targets: [...], precisions: [...]")
        problems.raise_if_any()
    _unknown_keys(problems, "the matrix", data, TOP_KEYS)
    top_options = _check_options(problems, "options", data.get("options"))
    base = p.resolve().parent
    taken: set[str] = set()
    models = [_model(problems, base, i, m, top_options, taken)
              for i, m in enumerate(_list(problems, data, "models", "[model.onnx, model.py:build]"))]
    targets = []
    for i, t in enumerate(_list(problems, data, "targets", "[SM8650, SM8750]")):
        try:
            name = get_target(str(t)).name
            if name not in targets:
                targets.append(name)
        except ModelExportError as e:
            problems.catch(f"targets[{i}]", e)
    precisions = [_precision(problems, i, x) for i, x in enumerate(_list(problems, data, "precisions", "[fp16, 8a8w]"))]
    problems.raise_if_any()
    return Matrix(p, hashlib.sha256(p.read_bytes()).hexdigest(), tuple(m for m in models if m),
                  tuple(targets), tuple(dict.fromkeys(x for x in precisions if x)))
