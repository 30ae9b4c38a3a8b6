"""How many context binaries the x86 HTP simulator holds in one process.

The simulator maps every loaded context into one device address space of about 3 GB; the context
that crosses it fails with QNN_COMMON_ERROR_MEM_ALLOC (err 1002), in Genie and in ONNX Runtime
alike. Measured with QAIRT 2.51 (onnxruntime-qnn 2.7.0):
- Genie's dialog over a Llama-3.2-3B-shaped bundle's 20 host twins (3.77 GB of binaries) loaded 16
  of them (3.01 GB) and failed on the 17th; each variant's 10 twins alone (1.88 GB) loaded.
- SmolLM2's 138 MB ar32 twin loaded 22 times in one process at QNN optimization level 1 and 20
  times at level 3 (a level-3 context takes more room).
A phone's HTP has no such limit on the weight-shared binaries: this is the host's check only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..core.errors import InputError

# the binaries' bytes one process may load: below the ~2.8 GB where the level-3 contexts failed
SIMULATOR_CONTEXT_BYTES = 2_500_000_000


def binary_bytes(paths: Iterable[Path]) -> int:
    return sum(Path(p).stat().st_size for p in paths)


def fits_on_simulator(paths: Iterable[Path]) -> bool:
    """Whether the simulator can hold these context binaries in one process."""
    return binary_bytes(paths) <= SIMULATOR_CONTEXT_BYTES


def simulator_limit_note(total_bytes: int) -> str:
    return (f"{total_bytes / 1e9:.2f} GB of host twins exceed what the x86 HTP simulator holds in one process "
            f"(about 3 GB; modelexport loads at most {SIMULATOR_CONTEXT_BYTES / 1e9:.1f} GB at once)")


def variants_that_fit(by_variant: dict[int, list[Path]]) -> list[int]:
    """The decoder variants (tokens per call → their binaries) one process loads: all of them when
    the simulator holds them together, else the one with the most tokens per call that fits alone
    (a generation loop prefills and decodes with it)."""
    every = [p for ps in by_variant.values() for p in ps]
    if fits_on_simulator(every):
        return sorted(by_variant)
    for n in sorted(by_variant, reverse=True):
        if fits_on_simulator(by_variant[n]):
            return [n]
    raise InputError(f"{simulator_limit_note(binary_bytes(every))}, and so does each variant's alone: the bundle "
                     "cannot run on this host", "run it on a device (the weight-shared binaries have no such limit); "
                     "on this host, `modelexport eval BUNDLE --stages fake-quant` checks its numerics")
