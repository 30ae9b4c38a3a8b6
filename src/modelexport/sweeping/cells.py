"""The cells of a sweep and how one is run: the same `compile` the CLI and the API run, into a
temporary folder renamed into place when complete.

A cell is one model × target × precision, written to OUT/<model>/<target>/<precision>/. It runs in
a worker (a spawned process or a Ray task): compile into OUT/<model>/<target>/.<precision>.partial-*,
then, when the compile recorded no numerics and the bundle runs here, the format's own `verify`
(compiled graph on the HTP simulator vs the float model, recorded in the manifest as `modelexport
verify` records it), then the rename. A killed cell leaves only its `.partial-*` folder, which the
next run discards; a bundle whose manifest opens and matches its files is complete and not redone.
"""
from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ..contract.bundle import is_bundle, open_bundle
from ..core.atomic import replace_path, sibling_temp
from ..core.errors import ModelExportError, clip
from ..core.vocab import BundleKind, Format
from ..runtime.runners import runner_for
from ..toolchain.library_loggers import quiet_library_loggers
from .matrix import Matrix, ModelEntry, PrecisionEntry

# Formats whose compile records no numerics but whose `verify` runs on this host.
VERIFIED_AFTER_COMPILE = frozenset({Format.CONTEXT_BINARY})
# The LLM path's quality budget is an LLM option; other kinds compile without it.
QUALITY_BUDGET_KINDS = frozenset({"llm"})


@dataclass(frozen=True)
class Cell:
    model: ModelEntry
    target: str
    precision: PrecisionEntry

    @property
    def key(self) -> str:
        return f"{self.model.name}/{self.target}/{self.precision.name}"

    def folder(self, out: Path) -> Path:
        return out / self.model.name / self.target / self.precision.name

    def job(self, out: Path, force: bool, compile_fn: Callable[..., Any]) -> dict[str, Any]:
        """What a worker needs: plain data and the compile function (pickled by reference)."""
        return {"cell": self.key, "model": asdict(self.model), "target": self.target,
                "precision": asdict(self.precision), "bundle": str(self.folder(out)), "force": force,
                "compile": compile_fn}


def plan_cells(matrix: Matrix) -> list[Cell]:
    """Model-major, then precision, then target: the cells of one quantization are neighbours, so
    the stage cache hands the first one's quantized model to the others."""
    return [Cell(m, t, p) for m in matrix.models for p in matrix.precisions for t in matrix.targets]


def is_complete(folder: Path) -> bool:
    """A bundle whose manifest is valid and whose files match it."""
    if not is_bundle(folder):
        return False
    try:
        open_bundle(folder, verify=True)
        return True
    except ModelExportError:
        return False


def discard_partials(out: Path) -> list[Path]:
    """The temporary folders of cells a killed run left behind (the caller holds the sweep's lock)."""
    found = [p for p in out.glob("*/*/.*.partial-*")]
    for p in found:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return found


def discard_partials_of(bundle: Path) -> None:
    """The temporary folder of one cell whose worker died (the cell runs nowhere else now)."""
    for p in bundle.parent.glob(f".{bundle.name}.partial-*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _compile_args(job: dict[str, Any]) -> dict[str, Any]:
    m, prec = job["model"], job["precision"]
    options = dict(m["options"])
    if prec.get("max_ppl_ratio") is not None and m["kind"] in QUALITY_BUDGET_KINDS:
        options["max_ppl_ratio"] = prec["max_ppl_ratio"]
    return {"target": [job["target"]], "precision": prec["name"], "calibration": m["calibration"],
            "input_shapes": m["input_shapes"], "input_values": m["input_values"],
            **({"overrides": list(m["overrides"])} if m["overrides"] else {}), **options}


def _verify_into(bundle_dir: Path) -> str | None:
    """Numerics for a bundle whose compile recorded none: the format's verify, recorded in its
    manifest. Returns why none were measured, or None."""
    m = open_bundle(bundle_dir, verify=False).manifest
    if m.numerics or m.kind != BundleKind.MODEL or m.format not in VERIFIED_AFTER_COMPILE:
        return None
    try:
        runner_for(bundle_dir).verify(bundle_dir, None, None, None, None, None)
    except ModelExportError as e:
        return clip(e.problem, 300)
    return None


def run_cell(job: dict[str, Any]) -> dict[str, Any]:
    """One cell, in a worker: compile (+ verify) into a temporary folder, then rename it into place.
    Every outcome comes back as data; a ModelExportError is the cell's failure, with its one-line
    reason, and anything else (a bug) is reported with its traceback, so the other cells go on."""
    quiet_library_loggers()          # as the CLI's own process does
    t0 = time.perf_counter()
    final = Path(job["bundle"])
    tmp = sibling_temp(final)
    out: dict[str, Any] = {"cell": job["cell"]}
    try:
        tmp.mkdir(parents=True)
        built = tmp / "bundle"
        job["compile"](job["model"]["path"], output=built, force=False, **_compile_args(job))
        note = _verify_into(built)
        if note:
            out["numerics_note"] = note
        replace_path(built, final)
        out["status"] = "compiled"
    except ModelExportError as e:
        out.update(status="failed", reason=clip(e.problem, 400), fix=e.in_words_of("sweep").fix, error=type(e).__name__,
                   exit_code=e.exit_code)
    except Exception as e:      # noqa: BLE001 - a bug in one cell must not end the others
        out.update(status="failed", reason=clip(f"internal error: {type(e).__name__}: {e}", 400), error="bug",
                   traceback=traceback.format_exc(limit=-8))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["cell_s"] = round(time.perf_counter() - t0, 3)
    return out
