"""Calibration data: the inputs the quantizer measures ranges on.

Accepted (`--calibration`):
- a folder of `.npy` / `.raw` files, one sample per file (single-input models), or of `.npz`
  files (one sample each, arrays named after the inputs), or of sub-folders, one per sample,
  holding `<input>.npy` / `<input>.raw`;
- an input list `.txt` as QNN tools write it: one line per sample, paths (relative to the list)
  separated by spaces, either in input order or as `name:=path`; `#` lines are ignored;
- one `.npz`: arrays named after the inputs, shaped like the input (one sample) or with one
  more leading axis (several samples);
- `random`: normal noise of the right shapes; recorded in the manifest as not representative;
- in memory (the Python API): arrays, tensors, tuples, dicts, generators, DataLoaders, read by
  `calibration_sources` (one adapter for ONNX and PyTorch).
Every array is checked against the model's inputs (names, shapes, dtypes): a mismatch is a
CalibrationError naming the input.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ..core.errors import CalibrationError
from .media_calibration import MEDIA_EXTS, MediaOptions, is_media, media_sample
from .calibration_sources import ACCEPTED, check_finite, kind_of, read_source

RANDOM = "random"
DEFAULT_RANDOM_SAMPLES = 8


@dataclass
class CalibrationSet:
    samples: list[dict[str, np.ndarray]]
    kind: str                        # folder, input-list, npz, file, random, or a calibration_sources.SourceKind
    source: str
    representative: bool = True
    notes: list[str] = field(default_factory=list)

    def digest(self) -> str:
        """A content hash: the cache key changes whenever any sample byte does."""
        h = hashlib.sha256()
        for s in self.samples:
            for k in sorted(s):
                h.update(k.encode())
                h.update(str(s[k].dtype).encode() + str(s[k].shape).encode())
                h.update(np.ascontiguousarray(s[k]).tobytes())
        return h.hexdigest()

    def describe(self) -> dict[str, Any]:
        d = {"kind": self.kind, "source": self.source, "samples": len(self.samples),
             "representative": self.representative, "sha256": self.digest()}
        if not self.representative:
            d["warning"] = "random data: the quantization ranges are not representative of real inputs"
        if self.notes:
            d["notes"] = self.notes
        return d

    def reader(self):
        """An onnxruntime CalibrationDataReader over the samples."""
        from onnxruntime.quantization import CalibrationDataReader
        samples = self.samples

        class _Reader(CalibrationDataReader):
            def __init__(self):
                self._it = iter(samples)

            def get_next(self):
                return next(self._it, None)

            def rewind(self):
                self._it = iter(samples)
        return _Reader()


def _expect(inputs) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {i.name: (i.static_shape, np.dtype(i.dtype)) for i in inputs}


def _check(name: str, arr: np.ndarray, expected, where: str) -> np.ndarray:
    shape, dtype = expected[name]
    if arr.dtype != dtype:
        raise CalibrationError(f"calibration input {name!r} in {where} has dtype {arr.dtype}; the model wants {dtype}",
                               f"save it as {dtype} (e.g. `np.save(path, x.astype(np.{dtype}))`)")
    if tuple(arr.shape) != shape:
        raise CalibrationError(f"calibration input {name!r} in {where} has shape {list(arr.shape)}; the model wants {list(shape)}",
                               f"save arrays of shape {list(shape)} (or fix the model's shape with --input-shape)")
    return arr


def _names_fix(expected) -> str:
    return "name the arrays/files after the model's inputs: " + ", ".join(expected)


def _read_raw(path: Path, name: str, expected) -> np.ndarray:
    shape, dtype = expected[name]
    data = np.fromfile(path, dtype=dtype)
    if data.size != int(np.prod(shape)):
        raise CalibrationError(f"{path} holds {path.stat().st_size} bytes = {data.size} {dtype} values; input {name!r} "
                               f"needs {int(np.prod(shape))} ({list(shape)})",
                               f"write raw files as {dtype} of shape {list(shape)} (x.astype(np.{dtype}).tofile(path))")
    return data.reshape(shape)


def _read_array(path: Path, name: str, expected) -> np.ndarray:
    if path.suffix.lower() == ".raw":
        return _read_raw(path, name, expected)
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as e:
        raise CalibrationError(f"{path} is not a readable .npy file: {e}", "save it with numpy.save") from None
    return _check(name, arr, expected, str(path))


def _from_npz(path: Path, expected, allow_batch: bool) -> list[dict[str, np.ndarray]]:
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:
        raise CalibrationError(f"{path} is not a readable .npz file: {e}", "save it with numpy.savez") from None
    arrays = {k: z[k] for k in z.files}
    if len(expected) == 1 and list(arrays) == ["arr_0"]:
        arrays = {next(iter(expected)): arrays["arr_0"]}
    missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
    if missing or extra:
        what = (f"lacks input(s) {', '.join(missing)}" if missing else "") + \
               ("; " if missing and extra else "") + (f"has array(s) {', '.join(extra)} that are not model inputs" if extra else "")
        raise CalibrationError(f"{path} {what}", _names_fix(expected))
    batched = {k: allow_batch and v.ndim == len(expected[k][0]) + 1 and tuple(v.shape[1:]) == expected[k][0]
               for k, v in arrays.items()}
    if all(batched.values()):
        n = {v.shape[0] for v in arrays.values()}
        if len(n) != 1:
            raise CalibrationError(f"{path}: the inputs hold different numbers of samples {sorted(n)}", "give every input the same count")
        return [{k: _check(k, v[i], expected, f"{path}[{i}]") for k, v in arrays.items()} for i in range(n.pop())]
    return [{k: _check(k, v, expected, str(path)) for k, v in arrays.items()}]


def _from_input_list(path: Path, expected) -> list[dict[str, np.ndarray]]:
    names = list(expected)
    samples = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        sample: dict[str, np.ndarray] = {}
        for pos, tok in enumerate(parts):
            name, sep, rel = tok.partition(":=")
            if not sep:
                if len(parts) != len(names):
                    raise CalibrationError(f"{path}:{lineno} lists {len(parts)} file(s); the model has {len(names)} input(s) ({', '.join(names)})",
                                           "one path per input, in input order, or write name:=path")
                name, rel = names[pos], tok
            if name not in expected:
                raise CalibrationError(f"{path}:{lineno} names input {name!r}, which the model does not have", _names_fix(expected))
            p = Path(rel) if Path(rel).is_absolute() else path.parent / rel
            if not p.is_file():
                raise CalibrationError(f"{path}:{lineno}: {p} does not exist", "paths in an input list are relative to the list's folder")
            sample[name] = _read_array(p, name, expected)
        missing = sorted(set(names) - set(sample))
        if missing:
            raise CalibrationError(f"{path}:{lineno} gives no data for input(s) {', '.join(missing)}", _names_fix(expected))
        samples.append(sample)
    return samples


def _from_folder(folder: Path, expected, media: MediaOptions | None = None) -> list[dict[str, np.ndarray]]:
    names = list(expected)
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in (".npy", ".raw", ".npz", *MEDIA_EXTS))
    subdirs = sorted(p for p in folder.iterdir() if p.is_dir())
    samples: list[dict[str, np.ndarray]] = []
    for f in files:
        if f.suffix.lower() == ".npz":
            samples += _from_npz(f, expected, allow_batch=False)
        elif is_media(f):
            if len(names) != 1:
                raise CalibrationError(f"{f.name}: a photo or recording feeds a model with one input; this one has "
                                       f"{len(names)} ({', '.join(names)})", _names_fix(expected))
            shape, dtype = expected[names[0]]
            samples.append({names[0]: media_sample(f, names[0], shape, dtype, media or MediaOptions())})
        elif len(names) == 1:
            samples.append({names[0]: _read_array(f, names[0], expected)})
        else:
            raise CalibrationError(f"{f}: with {len(names)} inputs ({', '.join(names)}) a loose .npy/.raw file is ambiguous",
                                   "put one sub-folder per sample holding <input>.npy files, or one .npz per sample")
    for d in subdirs:
        sample = {}
        for name in names:
            found = [d / f"{name}{ext}" for ext in (".npy", ".raw") if (d / f"{name}{ext}").is_file()]
            if not found:
                raise CalibrationError(f"{d} has no {name}.npy or {name}.raw for input {name!r}", _names_fix(expected))
            sample[name] = _read_array(found[0], name, expected)
        samples.append(sample)
    return samples


def random_samples(inputs, n: int = DEFAULT_RANDOM_SAMPLES, seed: int = 0,
                   limits: dict[str, int] | None = None) -> list[dict[str, np.ndarray]]:
    """Random inputs; an integer input that indexes a table (`limits`, from the graph) stays below its size."""
    rng = np.random.default_rng(seed)
    limits = limits or {}
    out = []
    for _ in range(n):
        s = {}
        for name, (shape, dtype) in _expect(inputs).items():
            if np.issubdtype(dtype, np.floating) and name in limits:   # ids given as floats, Cast to an index
                s[name] = rng.integers(0, limits[name], shape).astype(dtype)
            elif np.issubdtype(dtype, np.floating):
                s[name] = rng.standard_normal(shape).astype(dtype)
            elif dtype == np.bool_:
                s[name] = rng.integers(0, 2, shape).astype(dtype)
            elif "mask" in name.lower():   # an integer attention mask: "attend everywhere" (random ints
                s[name] = np.ones(shape, dtype)   # overflow a transformer's additive mask into NaN)
            else:
                s[name] = rng.integers(0, limits.get(name, 100), shape).astype(dtype)
        out.append(s)
    return out


def load_calibration(spec: Any, inputs: Iterable, num_random: int = DEFAULT_RANDOM_SAMPLES,
                     limits: dict[str, int] | None = None, media: MediaOptions | None = None) -> CalibrationSet:
    """Read calibration data for a model with `inputs` (IOSpec list, static shapes); `limits` bound
    random integer inputs that index a table (frontends.onnx_index_inputs)."""
    inputs = list(inputs)
    expected = _expect(inputs)
    if spec is None:
        raise CalibrationError("a quantized precision needs calibration data and none was given",
                               "pass --calibration DIR|list.txt|file.npz with real inputs, or --calibration random "
                               "(quick, but the manifest will say the ranges are not representative)")
    if isinstance(spec, str) and spec.strip().lower() == RANDOM:
        return CalibrationSet(random_samples(inputs, num_random, limits=limits), "random", RANDOM, representative=False)
    if kind_of(spec) is not None:
        got = read_source(spec, inputs)
        return CalibrationSet(got.samples, got.kind.value, got.source, notes=got.notes)
    if not isinstance(spec, (str, Path)):
        raise CalibrationError(f"calibration is a {type(spec).__name__}", f"give {ACCEPTED}")
    path = Path(spec)
    if not path.exists():
        raise CalibrationError(f"calibration data {path} does not exist",
                               "give a folder of .npy/.npz/.raw files (or photos, or .wav files), an input list .txt, a .npz, "
                               "or `random`")
    if path.is_dir():
        samples, kind = _from_folder(path, expected, media), "folder"
        if any(is_media(p) for p in path.iterdir()):
            kind = "media folder"
    elif is_media(path) and len(expected) == 1:
        name = next(iter(expected))
        samples, kind = [{name: media_sample(path, name, *expected[name], media or MediaOptions())}], "media file"
    elif path.suffix.lower() == ".npz":
        samples, kind = _from_npz(path, expected, allow_batch=True), "npz"
    elif path.suffix.lower() in (".txt", ".lst", ".list"):
        samples, kind = _from_input_list(path, expected), "input-list"
    elif path.suffix.lower() in (".npy", ".raw") and len(expected) == 1:
        samples, kind = [{next(iter(expected)): _read_array(path, next(iter(expected)), expected)}], "file"
    else:
        raise CalibrationError(f"{path} is not a calibration format modelexport reads",
                               "give a folder of .npy/.npz/.raw files, an input list .txt, a .npz, or `random`")
    if not samples:
        raise CalibrationError(f"{path} holds no calibration samples", "add at least one sample (more give better ranges): "
                               ".npy/.npz/.raw arrays, or photos (.png/.jpg) for an image input, .wav for an audio input")
    check_finite(samples, str(path))
    return CalibrationSet(samples, kind, str(path))
