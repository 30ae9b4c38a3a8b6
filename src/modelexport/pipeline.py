"""A pipeline file: several models compiled into one bundle (seed 003's encoder + embedder + decoder).

```yaml
targets: [SM8650, SM8750]          # optional; --target on the command line adds to / replaces it
parts:
  - name: vision_encoder
    model: vision_encoder.onnx     # paths are relative to this file
    precision: 8a8w
    calibration: calib/encoder     # folder | input list .txt | .npz | random
    input_shapes: {image: [1, 3, 224, 224]}
  - name: token_embedder
    model: embedder.onnx
    precision: fp16
```
JSON with the same keys works too.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from .backends.spec import PartSpec
from .core.errors import InputError

PIPELINE_SUFFIXES = (".yaml", ".yml", ".json")
_PART_KEYS = {"name", "model", "precision", "calibration", "input_shapes"}


def is_pipeline(path) -> bool:
    return isinstance(path, (str, Path)) and str(path).lower().endswith(PIPELINE_SUFFIXES)


def load_pipeline(path: str | Path, default_precision: str = "8a8w") -> tuple[list[PartSpec], list[str]]:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"pipeline file {p} does not exist", "check the path")
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text())
        else:
            data = yaml.safe_load(p.read_text())
    except Exception as e:
        raise InputError(f"{p} is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {str(e).splitlines()[0]}",
                         "see `modelexport compile --help` for the pipeline format") from None
    if not isinstance(data, dict) or not isinstance(data.get("parts"), list) or not data["parts"]:
        raise InputError(f"{p} has no `parts:` list", "write parts: [{name: ..., model: x.onnx, precision: 8a8w}, ...]")
    parts = []
    for i, d in enumerate(data["parts"]):
        if not isinstance(d, dict) or "model" not in d:
            raise InputError(f"{p}: part {i} has no `model:`", "each part needs model: path/to/model.onnx")
        unknown = set(d) - _PART_KEYS
        if unknown:
            raise InputError(f"{p}: part {i} has unknown key(s) {', '.join(sorted(unknown))}", f"keys: {', '.join(sorted(_PART_KEYS))}")

        def rel(v):
            if v is None or str(v).lower() == "random":
                return v
            q = Path(v)
            return str(q if q.is_absolute() else p.parent / q)
        parts.append(PartSpec(model=rel(d["model"]), name=d.get("name"), precision=str(d.get("precision", default_precision)),
                              calibration=rel(d.get("calibration")), input_shapes=d.get("input_shapes")))
    targets = data.get("targets") or []
    if isinstance(targets, str):
        targets = [targets]
    return parts, [str(t) for t in targets]
