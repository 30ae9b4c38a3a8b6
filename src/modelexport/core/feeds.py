"""The one check of the arrays a user feeds a compiled graph (run, verify, profile, per format):
names, dtypes and shapes against the graph's inputs, before any library sees them — ONNX Runtime
and ExecuTorch would otherwise answer with their own errors (`INVALID_ARGUMENT ...`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping, Sequence

import numpy as np

from .errors import InputError


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...] | None       # None: not recorded, not checked
    dtype: str | None                   # numpy dtype name; None: not checked

    def __str__(self) -> str:
        return f"{self.name}{list(self.shape) if self.shape is not None else ''} {self.dtype or ''}".strip()


def check_feed(feed: Mapping[str, object], specs: Sequence[InputSpec], what: str = "graph") -> dict[str, np.ndarray]:
    """The feed as arrays in the graph's input order, or an InputError saying what differs."""
    by_name = {s.name: s for s in specs}
    missing = [n for n in by_name if n not in feed]
    extra = sorted(set(feed) - set(by_name))
    if missing or extra:
        raise InputError("; ".join(p for p in (("missing input(s) " + ", ".join(missing)) if missing else "",
                                                 ("unknown input(s) " + ", ".join(extra)) if extra else "") if p),
                         f"the {what}'s inputs: " + ", ".join(str(s) for s in specs)
                         + " (give --input NAME=x.npy for each, or one .npz with those names)")
    out = {}
    for s in specs:
        arr = np.asarray(feed[s.name])
        if s.dtype and arr.dtype != np.dtype(s.dtype):
            raise InputError(f"input {s.name!r} has dtype {arr.dtype}; the {what} wants {s.dtype}",
                             f"save it as {s.dtype} (numpy: x.astype('{s.dtype}'))")
        if s.shape is not None and tuple(arr.shape) != tuple(s.shape):
            raise InputError(f"input {s.name!r} has shape {list(arr.shape)}; the {what} wants {list(s.shape)}",
                             "give an array of the compiled shape (`modelexport inspect BUNDLE` lists the inputs)")
        out[s.name] = arr
    return out


def read_input_files(paths: Sequence[str], names: Sequence[str]) -> dict[str, np.ndarray]:
    """`x.npy` (a single-input graph), `NAME=x.npy`, or an `.npz` whose arrays are named after the inputs."""
    feed: dict[str, np.ndarray] = {}
    for spec in paths or []:
        name, sep, path = str(spec).partition("=")
        if not sep:
            name, path = "", str(spec)
        p = Path(path)
        if not p.is_file():
            raise InputError(f"input file {p} does not exist", "give .npy files (NAME=path.npy) or one .npz")
        try:
            if p.suffix == ".npz":
                with np.load(p, allow_pickle=False) as z:
                    for k in z.files:
                        _add(feed, k, z[k], p)
                continue
            arr = np.load(p, allow_pickle=False)
        except Exception as e:   # numpy raises ValueError, OSError, EOFError, BadZipFile... for a bad file
            raise InputError(f"{p} is not a readable numpy file: {' '.join(str(e).split())[:200]}",
                             "save inputs with numpy.save / numpy.savez (no object arrays)") from None
        if not isinstance(arr, np.ndarray):
            raise InputError(f"{p} holds no array", "save inputs with numpy.save / numpy.savez")
        if not name:
            if len(names) != 1:
                raise InputError(f"{p}: the graph has {len(names)} inputs ({', '.join(names)}), so say which one",
                                 "write --input NAME=path.npy")
            name = names[0]
        _add(feed, name, arr, p)
    return feed


def _add(feed: dict[str, np.ndarray], name: str, arr: np.ndarray, source: Path) -> None:
    if name in feed:
        raise InputError(f"input {name!r} is given twice (again in {source})", "give each input once")
    feed[name] = arr
