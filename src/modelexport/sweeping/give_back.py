"""Which layers of a 16a8w candidate `--precision auto` gives back to 8a8w.

The longest run of layers from the graph's end, or from its start, that the CPU still measures
GIVE_BACK_MARGIN_DB above the budget with those layers at 8a8w (quant/sensitivity.Demotions: an
8-bit fake-quant around them, the low half of split weights dropped), whichever saves more cycles:
each layer's cycles in the candidate (split halves included) less its cycles at 8a8w, both read from
the simulator's per-op profile. One run rather than the best layers one by one: every border between
8 and 16 bits is a conversion the HTP pays for, one of a large map as much as a convolution
(PP-OCRv4's detector: 274 M cycles for one; its layers picked one by one cost more than the whole
16a8w graph).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..contract import open_bundle
from ..quant.sensitivity import Demotions
from ..quant.weight_split import LO_SUFFIX, SUM_SUFFIX

GIVE_BACK_MARGIN_DB = 1.0   # the run is chosen to leave this much above the budget on the CPU
GIVE_BACK_TRIES = 3         # each try that fails gives back half the layers of the one before


@dataclass
class Run:
    """Layers to give back, in graph order, and whether they end at the graph's end."""
    layers: list[str]
    from_end: bool

    def half(self) -> Run | None:
        """Half as many, the half away from the layers kept at 16 bits; None when none are left."""
        k = len(self.layers) // 2
        rest = self.layers[len(self.layers) - k:] if self.from_end else self.layers[:k]
        return Run(rest, self.from_end) if rest else None


def layers_to_give_back(bundle_path: Path, node_cycles: dict[str, int], base_cycles: dict[str, int],
                        samples: list[dict], budget_db: float) -> Run | None:
    """The run of the 16a8w bundle's layers to give back to 8a8w, or None (nothing saves cycles, or the
    CPU cannot run the graph: the search's other candidates remain)."""
    b = open_bundle(bundle_path)
    pm = b.manifest.parts[0]
    try:
        est = Demotions(b.file(pm.files.float_model), b.file(pm.files.quantized_model), samples)
        return longest_run(est, savings(node_cycles, base_cycles), budget_db + GIVE_BACK_MARGIN_DB)
    except Exception:          # noqa: BLE001 - onnxruntime's own errors are not RuntimeErrors
        return None


def savings(node_cycles: dict[str, int], base_cycles: dict[str, int]) -> dict[str, float]:
    """{layer: the cycles giving it back to 8a8w saves} (its split halves counted with it)."""
    parts: dict[str, float] = {}
    for name, cyc in node_cycles.items():
        layer = name.removesuffix(LO_SUFFIX).removesuffix(SUM_SUFFIX)
        parts[layer] = parts.get(layer, 0) + cyc
    return {n: cyc - base_cycles[n] for n, cyc in parts.items() if n in base_cycles}


def longest_run(est: Demotions, saving: dict[str, float], floor_db: float) -> Run | None:
    """Of the longest run from the graph's end and the longest from its start that the CPU measures at
    `floor_db` or more (bisection on the run's length), the one that saves more cycles."""
    layers = est.layers()
    best: tuple[float, Run | None] = (0.0, None)
    for from_end in (True, False):
        run_of = (lambda k: layers[len(layers) - k:]) if from_end else (lambda k: layers[:k])
        lo, hi, done = 0, len(layers), []        # run_of(lo) meets the floor; find the largest k that does
        while lo < hi:
            mid = (lo + hi + 1) // 2
            db, demoted = est.db(run_of(mid))
            if db >= floor_db:
                lo, done = mid, demoted
            else:
                hi = mid - 1
        gain = sum(saving.get(n, 0.0) for n in done)
        if gain > best[0]:
            best = (gain, Run(done, from_end))
    return best[1]
