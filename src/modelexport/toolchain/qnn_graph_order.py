"""The order of the graphs the QNN EP writes, as Genie sees it.

Genie orders the graphs of one (AR-n, CL) variant by their names: `<prefix>_<i>_of_<n>` first, any
other name after them, in the order of the names (measured with libGenie 1.21 on the simulator:
its log says "does not follow the expected split naming ... it will be ordered after all graphs
that do", and the order does not follow `ctx-bins`). The QNN EP (onnxruntime-qnn 2.7.0 with
onnxruntime 1.32) names every graph itself, `QNNExecutionProvider_QNNExecutionProvider_<h>_1_0`:
no session option, EP option, ONNX graph name, node name or file name sets it
(`ep.context_node_name_prefix` is read and unused). `<h>` is ONNX Runtime's model hash: MurmurHash3
x86_128 (seed 0) of the model path string the session was given, its first two words as a uint64
(`ModelMetadefIdGenerator`), printed in decimal.

So a graph gets its place by the path it is compiled from: `ordered_model_path` gives part i of n a
path (a folder of links beside the real files) whose hash lies in the i-th of n equal slices of the
20-digit decimals, so text order and number order of the names are the part order. The compile
checks the names it reads back from the binary against `qnn_graph_name` (a changed naming fails
the build, it never reorders silently).
"""
from __future__ import annotations

import os
from pathlib import Path

ORDER_SCHEME = "ep-name-hash-1"   # in the cache keys of binaries compiled in order
EP_GRAPH_NAME = "QNNExecutionProvider_QNNExecutionProvider_{hash}_1_0"
_LOW, _HIGH = 10**19, 2**64          # 20-digit decimals: same length, so text order = number order
_MASK = 0xFFFFFFFF
_C1, _C2, _C3, _C4 = 0x239B961B, 0xAB0E9789, 0x38B34AE5, 0xA1E38B93
_MAX_TRIES = 1_000_000


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


# MurmurHash3_x86_128's four lanes: (multiplier in, rotation, multiplier out, lane rotation, add)
_LANES = ((_C1, 15, _C2, 19, 0x561CCD1B), (_C2, 16, _C3, 17, 0x0BCAA747),
          (_C3, 17, _C4, 15, 0x96CD1C35), (_C4, 18, _C1, 13, 0x32AC3B17))


def murmur3_x86_128(data: bytes, seed: int = 0) -> tuple[int, int, int, int]:
    """Austin Appleby's MurmurHash3_x86_128, as ONNX Runtime's core/framework/murmurhash3.cc."""
    h = [seed] * 4
    n_blocks = len(data) // 16
    for b in range(n_blocks):
        ks = [int.from_bytes(data[16 * b + 4 * j:16 * b + 4 * j + 4], "little") for j in range(4)]
        for j, (c_in, r, c_out, r_lane, add) in enumerate(_LANES):
            h[j] ^= (_rotl((ks[j] * c_in) & _MASK, r) * c_out) & _MASK
            h[j] = ((_rotl(h[j], r_lane) + h[(j + 1) % 4]) * 5 + add) & _MASK
    tail = data[16 * n_blocks:]
    ks = [0, 0, 0, 0]
    for i, byte in enumerate(tail):
        ks[i // 4] ^= byte << (8 * (i % 4))
    for j, (c_in, r, c_out, _, _) in enumerate(_LANES):
        if len(tail) > 4 * j:
            h[j] ^= (_rotl((ks[j] * c_in) & _MASK, r) * c_out) & _MASK
    h = [x ^ len(data) for x in h]
    h[0] = sum(h) & _MASK
    h[1:] = [(x + h[0]) & _MASK for x in h[1:]]
    h = [_fmix(x) for x in h]
    h[0] = sum(h) & _MASK
    h[1:] = [(x + h[0]) & _MASK for x in h[1:]]
    return h[0], h[1], h[2], h[3]


def qnn_graph_name(model_path: str | Path) -> str:
    """The name the QNN EP gives the graph of a model loaded from `model_path` (the string as given)."""
    h = murmur3_x86_128(str(model_path).encode())
    return EP_GRAPH_NAME.format(hash=h[0] | (h[1] << 32))


def _hash_of(name: str) -> int:
    return int(name.split("_")[-3])


def ordered_model_path(model_path: Path, index: int, count: int, workdir: Path) -> Path:
    """A path to `model_path` (through a folder of links to it and the files beside it, in
    `workdir`) from which the QNN EP names the graph so that graph `index` (1-based) of `count`
    sorts at its place by name."""
    width = (_HIGH - _LOW) // count
    low, high = _LOW + (index - 1) * width, _LOW + index * width
    model_path = Path(model_path).resolve()
    for k in range(_MAX_TRIES):
        alias = Path(workdir) / f"order_{index}_of_{count}_{k}" / model_path.name
        if low <= _hash_of(qnn_graph_name(alias)) < high:
            _link_folder(model_path, alias.parent)
            return alias
    raise RuntimeError(f"no path for graph {index} of {count} in {_MAX_TRIES} tries")   # ~4.5% hit per try at 10 parts


def _link_folder(model_path: Path, folder: Path) -> None:
    """`folder` holding symlinks to the model and its external data files (relative names resolve)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in model_path.parent.glob(model_path.name + "*"):
        link = folder / f.name
        if not link.exists():
            os.symlink(f, link)


def in_part_order(names: list[str]) -> bool:
    """Whether graphs named `names` (parts in order) sort in that order, as text and as numbers."""
    return names == sorted(names) and [_hash_of(n) for n in names] == sorted(_hash_of(n) for n in names)
