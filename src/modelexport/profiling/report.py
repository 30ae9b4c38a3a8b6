"""What `modelexport profile` reports, whichever format ran: rows per op, totals, the simulator note.

One profiler per bundle format: `ort_profile` (EPContext models) and `pte_profile` (ExecuTorch .pte).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.arguments import at_least
from ..core.errors import InputError, ToolchainError
from ..toolchain.qairt import find_qairt

LEVELS = ("basic", "detailed")
NOTE = ("simulator times rank ops within one model; they are not phone latencies "
        "(libQnnHtp.so on x86 is the HTP simulator)")


@dataclass
class ProfileRow:
    name: str
    op_type: str
    module_path: str | None
    backend: str                 # "HTP", "CPU fallback", "CPU (graph io)", "HTP graph" (basic level)
    time_us: float               # median over the measured runs (HTP ops: cycle share × graph wall time)
    cycles: int | None = None    # median QNN cycles as reported (detailed level, HTP ops)
    share: float = 0.0           # of the summed time of all rows
    source: str = ""             # where the number comes from
    runs_us: list[float] = field(default_factory=list)


@dataclass
class ProfileReport:
    bundle: str
    part: str
    target: str
    level: str
    runs: int
    rows: list[ProfileRow]
    totals: dict[str, Any]
    qnn_columns: list[str]
    files: dict[str, str]
    note: str = NOTE
    warnings: list[str] = field(default_factory=list)

    @property
    def cpu_fallbacks(self) -> list[ProfileRow]:
        return [r for r in self.rows if r.backend == "CPU fallback"]

    def to_dict(self) -> dict[str, Any]:
        return {"bundle": self.bundle, "part": self.part, "target": self.target, "level": self.level, "runs": self.runs,
                "note": self.note, "warnings": self.warnings, "totals": self.totals, "qnn_csv_columns": self.qnn_columns,
                "files": self.files, "cpu_fallbacks": [r.name for r in self.cpu_fallbacks],
                "ops": [asdict(r) for r in self.rows]}


def check_build(bundle) -> None:
    """Profiles are only meaningful on the QAIRT build that compiled the binary."""
    built, have = bundle.manifest.qairt_build, find_qairt().build_id
    if built and built != have:
        raise ToolchainError(f"{bundle.path} was compiled by QAIRT {built}, but the QNN libraries here are {have}",
                             f"recompile the bundle here (modelexport compile ... --force), or point QNN_SDK_ROOT at QAIRT {built}")


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def check_arguments(level: str, runs: int) -> None:
    if level not in LEVELS:
        raise InputError(f"unknown --level {level!r}", "choose basic (per-graph totals) or detailed (per QNN node cycles)")
    at_least("--runs", runs, 1, "5")
