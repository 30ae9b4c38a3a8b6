"""Calibration given in memory → samples (`{input name: array}`), one adapter for every path.

ONNX (`quant.calibration.load_calibration`), PyTorch (`executorch_qnn.pipeline.calibration_set`)
and the Python API (`compile(..., calibration=...)`, `QNNCompiler(quantization={"calibration_data":
...})`) all end here for anything that is not a path or `random`. A source is one of `SourceKind`:

- one array or tensor (a single-input model);
- a list of arrays/tensors, one per sample (single-input);
- a list of input tuples, positional as `model(*inputs)` takes them (nested ones are flattened
  as the example inputs are: `(x, (h0, c0))` → `input`, `hx_0`, `hx_1`);
- a dict name → array (one sample) or a list of them;
- a generator or any iterator of the above;
- a torch DataLoader whose batches are tensors, tuples/lists or dicts.

A sample whose arrays carry one more leading axis than the inputs (or a batch of N where the
input's batch is 1) is split into that many samples: a DataLoader's batches just work.
Every sample is checked (count, names, shape, dtype, NaN/inf); a mismatch is one
CalibrationError (an InputError) naming the sample and the input, with the fix.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Iterator

import numpy as np

from ..core.errors import CalibrationError
from ..core.nested import flatten_args, flatten_named

# An iterator may be endless (a `while True` generator, a big DataLoader): take this many samples.
MAX_SAMPLES = 128
ACCEPTED = ("a folder, an input list .txt, a .npz, `random`, an array/tensor, a list of arrays, of input tuples or of "
            "dicts name → array, a generator, or a torch DataLoader")


class SourceKind(str, Enum):
    ARRAY = "array"
    ARRAYS = "arrays"
    TUPLES = "tuples"
    DICTS = "dicts"
    ITERATOR = "iterator"
    DATALOADER = "dataloader"


@dataclass(frozen=True)
class Expected:
    """One model input as calibration sees it."""
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @classmethod
    def of(cls, inputs: Iterable) -> list["Expected"]:
        """From IOSpec (ONNX) or TorchIO (PyTorch): anything with name, static_shape, dtype."""
        return [cls(i.name, tuple(i.static_shape), np.dtype(i.dtype)) for i in inputs]


@dataclass
class Samples:
    samples: list[dict[str, np.ndarray]]
    kind: SourceKind
    source: str
    notes: list[str]


def _is_leaf(x: Any) -> bool:
    if isinstance(x, (str, bytes)):
        return False
    return isinstance(x, np.ndarray) or type(x).__name__ in ("Tensor", "Parameter") or np.isscalar(x)


def _is_dataloader(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.utils.data.DataLoader)


def kind_of(spec: Any) -> SourceKind | None:
    """Which in-memory source `spec` is, or None (a path, `random`, or not a source at all)."""
    if isinstance(spec, (str, bytes)) or hasattr(spec, "__fspath__") or spec is None:
        return None
    if _is_leaf(spec):
        return SourceKind.ARRAY
    if isinstance(spec, dict):
        return SourceKind.DICTS
    if isinstance(spec, (list, tuple)):
        if spec and all(isinstance(s, dict) for s in spec):
            return SourceKind.DICTS
        if spec and all(isinstance(s, (tuple, list)) for s in spec):
            return SourceKind.TUPLES
        return SourceKind.ARRAYS
    if _is_dataloader(spec):
        return SourceKind.DATALOADER
    if isinstance(spec, Iterator) or hasattr(spec, "__iter__"):
        return SourceKind.ITERATOR
    return None


def _to_numpy(x: Any, where: str) -> np.ndarray:
    if hasattr(x, "detach"):
        try:
            return x.detach().cpu().numpy()
        except (TypeError, RuntimeError) as e:  # bfloat16 and other types numpy lacks
            raise CalibrationError(f"{where} is a tensor numpy cannot hold ({x.dtype}): {e}",
                                   "convert it to the model's input dtype first (e.g. x.float())") from None
    arr = np.asarray(x)
    if arr.dtype == object:
        raise CalibrationError(f"{where} is a {type(x).__name__}, not an array or tensor", ACCEPTED)
    return arr


def _names(expected: list[Expected]) -> str:
    return ", ".join(f"{e.name}{list(e.shape)} {e.dtype}" for e in expected)


def _named(item: Any, expected: list[Expected], where: str) -> dict[str, Any]:
    """One item of a source → {input name: value}: a dict by its (flattened) keys, a tuple by position."""
    names = [e.name for e in expected]
    if isinstance(item, dict):
        leaves = [leaf for k, v in item.items() for leaf in flatten_named(v, str(k))]
    elif isinstance(item, (tuple, list)):
        leaves = flatten_args(item, names)
        if len(leaves) != len(names):
            raise CalibrationError(f"{where} holds {len(leaves)} array(s); the model has {len(names)} input(s): {_names(expected)}",
                                   "give one value per input, in input order (as model(*inputs) takes them), "
                                   "or a dict name → array")
        leaves = list(zip(names, (v for _, v in leaves)))
    elif _is_leaf(item):
        if len(names) != 1:
            raise CalibrationError(f"{where} is one array; the model has {len(names)} inputs: {_names(expected)}",
                                   "give a tuple (one value per input, in order) or a dict name → array per sample")
        leaves = [(names[0], item)]
    else:
        raise CalibrationError(f"{where} is a {type(item).__name__}", f"each sample must be an array, a tuple or a dict; "
                               f"calibration accepts {ACCEPTED}")
    got = dict(leaves)
    missing = [n for n in names if n not in got]
    extra = [n for n in got if n not in names]
    if missing or extra:
        what = "; ".join(p for p in (f"lacks input(s) {', '.join(missing)}" if missing else "",
                                     f"has {', '.join(extra)}, not inputs of the model" if extra else "") if p)
        raise CalibrationError(f"{where} {what}", f"name the arrays after the model's inputs: {_names(expected)}")
    return {n: _to_numpy(got[n], f"{where} input {n!r}") for n in names}


def _split(sample: dict[str, np.ndarray], expected: list[Expected], where: str) -> list[dict[str, np.ndarray]]:
    """A sample, or a batch of them split along the leading axis; checked against shapes and dtypes."""
    counts = set()
    for e in expected:
        a = sample[e.name]
        if tuple(a.shape) == e.shape:
            counts.add(None)
        elif a.ndim == len(e.shape) + 1 and tuple(a.shape[1:]) == e.shape:
            counts.add(("stack", a.shape[0]))
        elif e.shape and e.shape[0] == 1 and a.ndim == len(e.shape) and tuple(a.shape[1:]) == e.shape[1:] and a.shape[0] > 1:
            counts.add(("batch", a.shape[0]))
        else:
            raise CalibrationError(f"{where} input {e.name!r} has shape {list(a.shape)}; the model wants {list(e.shape)}",
                                   f"give arrays of shape {list(e.shape)} (a leading batch axis is split into samples)")
    if len(counts) != 1:
        raise CalibrationError(f"{where}: the inputs hold different numbers of samples",
                               "give every input the same batch size")
    how = counts.pop()
    out = [sample] if how is None else [
        {e.name: (sample[e.name][i] if how[0] == "stack" else sample[e.name][i:i + 1]) for e in expected}
        for i in range(how[1])]
    for s in out:
        for e in expected:
            check_dtype(s[e.name], e, where)
    return out


def check_dtype(arr: np.ndarray, e: Expected, where: str) -> None:
    if arr.dtype != e.dtype:
        raise CalibrationError(f"{where} input {e.name!r} has dtype {arr.dtype}; the model wants {e.dtype}",
                               f"convert it (x.astype(np.{e.dtype}) for numpy, x.to(torch.{e.dtype}) for torch)")


def check_finite(samples: list[dict[str, np.ndarray]], source: str) -> None:
    """NaN or inf in calibration makes every range NaN: blame the data, before the quantizer runs."""
    for i, s in enumerate(samples):
        for name, a in s.items():
            if a.dtype.kind != "f" or np.isfinite(a).all():
                continue
            bad = int(a.size - np.isfinite(a).sum())
            what = "is all NaN" if np.isnan(a).all() else f"holds {bad} NaN/inf value(s) of {a.size}"
            raise CalibrationError(f"calibration sample {i} of {source}: input {name!r} {what}; the ranges "
                                   "would be meaningless", "fix the data (e.g. a division by zero in the "
                                   "normalization) or leave that sample out; the model is not at fault")


def _items(spec: Any, kind: SourceKind) -> Iterator[Any]:
    if kind in (SourceKind.ARRAY,) or (kind == SourceKind.DICTS and isinstance(spec, dict)):
        yield spec
        return
    try:
        it = iter(spec)
    except TypeError:
        raise CalibrationError(f"calibration is a {type(spec).__name__}", f"give {ACCEPTED}") from None
    yield from it


def read_source(spec: Any, inputs: Iterable, limit: int = MAX_SAMPLES) -> Samples:
    """An in-memory calibration source → checked samples. `inputs`: IOSpec / TorchIO list."""
    kind = kind_of(spec)
    if kind is None:
        raise CalibrationError(f"calibration is a {type(spec).__name__}", f"give {ACCEPTED}")
    expected = Expected.of(inputs)
    noun = "batch" if kind == SourceKind.DATALOADER else "sample"
    samples: list[dict[str, np.ndarray]] = []
    notes: list[str] = []
    items = 0
    try:
        for i, item in enumerate(_items(spec, kind)):
            items += 1
            where = f"calibration {noun} {i}" if kind != SourceKind.ARRAY else "the calibration array"
            samples += _split(_named(item, expected, where), expected, where)
            if len(samples) >= limit:
                notes.append(f"stopped after {limit} samples (the source may hold more)")
                samples = samples[:limit]
                break
    except CalibrationError:
        raise
    except Exception as e:  # the user's generator or dataset raised: say so, without our frames
        raise CalibrationError(f"the calibration {kind.value} raised {type(e).__name__} at item {items}: {e}",
                               "fix the generator / dataset; it runs once per calibration sample") from None
    if not samples:
        raise CalibrationError(f"the calibration {kind.value} holds no samples",
                               "give at least one sample per input (more give better ranges), or `random`")
    described = f"{len(samples)} sample(s) from {items} {noun}(s) of a {type(spec).__name__}"
    check_finite(samples, described)
    return Samples(samples, kind, described, notes)
