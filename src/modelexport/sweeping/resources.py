"""What one cell asks of the machine that runs it (CPUs, bytes of memory): a Ray task declares it.

LLMs have an up-front estimate (`compile --dry-run`: llm/job_estimate.py through plan_llm), read
from the config alone. ONNX and PyTorch cells take one CPU (a cell compiles one target; the QNN EP
prepares one graph at a time) and memory from a rule measured on real models: the peak RSS of a
cell's whole process tree (compile + verify, cold cache) against the model's bytes, fitted per
kind and precision class (quantizing calibrates on the model's activations) as base + k × model bytes, the base raised until the line lies above every
measured point (bench/sweep_cell_memory.py → bench/results/sweep_cell_memory.json holds the points
and the fit). Activations are not in the rule: an activation-heavy model sets the base. Model bytes: an ONNX file with
its external data; a `.pt2`'s file; a `model.py:FACTORY` is not built before its cell runs (its
code runs in the cell's own process), so its size is an assumption (TORCH_FACTORY_MB), said so.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

from ..backends.spec import LlmCompileOptions
from .cells import Cell

GB = 2**30
MB = 2**20


@dataclass(frozen=True)
class CellResources:
    num_cpus: int
    memory_bytes: int
    source: str                 # where the figures come from (said in results.json)


@dataclass(frozen=True)
class MemoryRule:
    """Peak bytes of a cell = base + per_model × model bytes (fitted on `measured`)."""
    base_mb: float
    per_model: float
    measured: str

    def bytes_for(self, model_bytes: int) -> int:
        return int(self.base_mb * MB + self.per_model * model_bytes)


# bench/results/sweep_cell_memory.json (2026-11-28, SM8650; float: fp16 cells, quantized: 8a8w cells). Peaks:
# ONNX (0.03-66 MB: mtcnn_pnet, ppocr_cls, ppocr_det, nudenet_320n, minilm_l3) 424-778 MB float, 433-834 quantized,
# ppocr_det (4.5 MB, 320x320 maps) setting both bases; PyTorch (0.05-80 MB: the tests' MLP, ResNet8, a
# shrunk ViT, MobileNetV2, a wide MLP) 512-905 MB float, 545-1066 quantized, the ViT (transformers
# imported) setting both bases.
MEMORY_RULES = {
    ("onnx", False): MemoryRule(512, 4.9, "fp16 cells of 5 real ONNX models, 0.03-66 MB"),
    ("onnx", True): MemoryRule(832, 4.17, "8a8w cells of 5 real ONNX models, 0.03-66 MB"),
    ("torch", False): MemoryRule(640, 4.38, "fp16 cells of 5 PyTorch models, 0.05-80 MB"),
    ("torch", True): MemoryRule(704, 5.82, "8a8w cells of 5 PyTorch models, 0.05-80 MB"),
}
# a model.py factory's parameter bytes, unknown before it is built (the rule then declares this size)
TORCH_FACTORY_MB = 100


@functools.lru_cache(maxsize=64)
def onnx_bytes(path: str) -> int:
    """The file and the external data files its tensors name."""
    import onnx
    p = Path(path)
    model = onnx.load(str(p), load_external_data=False)
    locations = {e.value for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
                 for e in t.external_data if e.key == "location"}
    return p.stat().st_size + sum((p.parent / loc).stat().st_size for loc in locations if (p.parent / loc).is_file())


def _measured(kind: str, model_bytes: Callable[[Cell], tuple[int, str]]) -> Callable[[Cell], CellResources]:
    def need(cell: Cell) -> CellResources:
        from ..quant.precision import PRECISIONS
        rule = MEMORY_RULES[(kind, PRECISIONS[cell.precision.name].quantized)]   # the matrix's names are the table's
        size, what = model_bytes(cell)
        return CellResources(1, rule.bytes_for(size), f"rule measured on {rule.measured} (bench/results/"
                                                      f"sweep_cell_memory.json): {rule.base_mb:g} MB + {rule.per_model:g} x {what}")
    return need


def _onnx_size(cell: Cell) -> tuple[int, str]:
    size = onnx_bytes(cell.model.path)
    return size, f"{size / MB:.1f} MB model"


def _torch_size(cell: Cell) -> tuple[int, str]:
    path = cell.model.path
    if path.lower().endswith(".pt2"):
        size = Path(path).stat().st_size
        return size, f"{size / MB:.1f} MB .pt2"
    return TORCH_FACTORY_MB * MB, f"{TORCH_FACTORY_MB} MB assumed (a model.py factory's size is unknown until it runs)"


def _llm_estimate(cell: Cell) -> CellResources:
    from ..backends.llm_qnn.compile import plan_llm
    known = {f.name for f in fields(LlmCompileOptions)}
    opts = {k: v for k, v in cell.model.options.items() if k in known}
    plan = plan_llm(cell.model.path, cell.precision.name, **opts)
    return CellResources(int(plan["jobs"]), int(plan["estimate"]["peak_bytes"]), "llm/job_estimate.py (compile --dry-run)")


RESOURCES: dict[str, Callable[[Cell], CellResources]] = {
    "onnx": _measured("onnx", _onnx_size),
    "torch": _measured("torch", _torch_size),
    "llm": _llm_estimate,
}


def cell_resources(cell: Cell) -> CellResources:
    """A kind this table does not list (a plugin's) is sized as a PyTorch model."""
    return RESOURCES.get(cell.model.kind, RESOURCES["torch"])(cell)
