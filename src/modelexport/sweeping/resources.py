"""What one cell asks of the machine that runs it (CPUs, bytes of memory): a Ray task declares it.

LLMs have an up-front estimate (`compile --dry-run`: llm/job_estimate.py through plan_llm), read
from the config alone. ONNX and PyTorch models have none in this repo, so a declared default per
kind stands in: one CPU (a cell compiles one target; the QNN EP prepares one graph at a time) and
a memory figure per kind (ONNX: a worker with ONNX Runtime and the QNN EP, ~0.6 GB, plus the model;
PyTorch: torch + ExecuTorch, ~1.5 GB, plus the model), rounded up. They are declared, not measured per
model: a large ONNX or PyTorch model may need more than Ray reserves for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .cells import Cell

GB = 2**30


@dataclass(frozen=True)
class CellResources:
    num_cpus: int
    memory_bytes: int
    source: str                 # where the figures come from (said in results.json)


def _declared(num_cpus: int, memory_gb: float) -> Callable[[Cell], CellResources]:
    return lambda cell: CellResources(num_cpus, int(memory_gb * GB), "declared default")


def _llm_estimate(cell: Cell) -> CellResources:
    from dataclasses import fields

    from ..backends.llm_qnn.compile import plan_llm
    from ..backends.spec import LlmCompileOptions
    known = {f.name for f in fields(LlmCompileOptions)}
    opts = {k: v for k, v in cell.model.options.items() if k in known}
    plan = plan_llm(cell.model.path, cell.precision.name, **opts)
    return CellResources(int(plan["jobs"]), int(plan["estimate"]["peak_bytes"]), "llm/job_estimate.py (compile --dry-run)")


RESOURCES: dict[str, Callable[[Cell], CellResources]] = {
    "onnx": _declared(1, 1.0),
    "torch": _declared(1, 2.0),
    "llm": _llm_estimate,
}


def cell_resources(cell: Cell) -> CellResources:
    return RESOURCES.get(cell.model.kind, _declared(1, 2.0))(cell)
