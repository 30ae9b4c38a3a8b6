"""The seeds' spellings of an ONNX compile (seed 002), mapped onto `modelexport.compile`'s own names.

    from modelexport.qnn import QNNCompiler
    compiler = QNNCompiler(backend="HTP")
    dlc_path = compiler.compile("model.onnx", output_format="dlc")                     → output_format
    q_dlc = compiler.compile("model.onnx", output_format="dlc", quantization={
        "enabled": True, "calibration_data": loader,                                  → calibration
        "act_bitwidth": 8, "weights_bitwidth": 8,                                       → precision
        "per_channel": True})                                                           → per_channel
    ctx = compiler.compile("model.onnx", output_format="context-binary",
                           target_device="snapdragon_8_gen3")                           → target
    compiler.compile_onnx_to_dlc("model.onnx", "model.dlc", quantization_config, calibration_data)

`compile` returns the artifact's path (the .dlc, or the target's context binary) inside its bundle;
`compiler.last_bundle` is the bundle. Without `output` each call gets its own folder named by format,
precision and target (contract.default_output). `output="x.dlc"` / `"x.bin"` writes that file and
the bundle `x.bundle/` beside it, as `compile-qnn model.onnx x.dlc` does (`plan_output`).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .api import compile as api_compile
from .backends import backend_for_kind, check_offered
from .backends.ort_qnn.formats import OUTPUT_FORMATS, canonical_format, format_for_output, names_a_file
from .contract.default_output import default_output
from .core.atomic import atomic_file, check_output
from .core.errors import InputError, UnsupportedError

DEFAULT_FORMAT = "context-binary"
QUANTIZATION_KEYS = ("enabled", "calibration_data", "act_bitwidth", "weights_bitwidth", "per_channel", "precision")


@dataclass(frozen=True)
class OutputPlan:
    bundle: Path          # the bundle folder the compile writes
    file: Path | None     # the one artifact also written as this file (OUTPUT named *.dlc / *.bin), or None
    format: str
    why: str              # how the format was chosen, said to the user


def plan_output(model: Any, output: str | Path | None, fmt: str | None, precision: str,
                targets: Iterable[str]) -> OutputPlan:
    """Where a seed-style compile writes, and which format: a file OUTPUT's suffix names the format."""
    targets = list(targets)
    given = canonical_format(fmt) if fmt else None
    if given is not None and given not in OUTPUT_FORMATS:   # the same words as compile: another kind's, or unknown
        check_offered(backend_for_kind("onnx"), "onnx", given)
    if output is not None and names_a_file(Path(output)):
        file_out = Path(output)
        chosen, why = format_for_output(file_out, given)
        if len(targets) > 1 and OUTPUT_FORMATS[chosen].per_target:
            raise InputError(f"one {file_out.suffix} file holds one target's binary, {len(targets)} targets were given",
                             "give a folder as OUTPUT for several targets, or one --device")
        return OutputPlan(file_out.with_name(file_out.stem + ".bundle"), file_out, chosen, why)
    chosen = given or DEFAULT_FORMAT
    why = "from --format" if given else "the default; name the output *.dlc or pass --format dlc for a DLC"
    if output is None:
        named = targets if OUTPUT_FORMATS[chosen].per_target else []   # one DLC serves every target
        return OutputPlan(default_output(model, chosen, precision, named), None, chosen, why)
    return OutputPlan(Path(output), None, chosen, why)


def artifact_path(bundle) -> Path:
    """The bundle's one artifact (the .dlc, or the context binary of its one target); the folder if several."""
    files = {g["file"] for g in bundle.data.get("graphs", [])}
    return bundle.file(files.pop()) if len(files) == 1 else Path(bundle.path)


def write_artifact(bundle, plan: OutputPlan, force: bool) -> str | None:
    """Copy the artifact to the OUTPUT file a plan names → what was written, for the summary."""
    if plan.file is None:
        return None
    g = bundle.data["graphs"][0]
    with atomic_file(plan.file, force) as tmp:
        shutil.copyfile(bundle.file(g["file"]), tmp)
    what = f"context binary for {g['target']}" if g.get("target") else "DLC"
    return f"{plan.file} ({what}; run/verify use the bundle {bundle.path})"


def check_backend(backend: str) -> None:
    if str(backend).upper() != "HTP":
        raise UnsupportedError(f"QNN backend {backend!r} is not available here",
                               "use the HTP backend (GPU and CPU QNN backends are not wired up)")


def seed_precision(quantization: dict | None) -> str:
    """The seed's quantization dict → a precision name (precision table, quant.precision)."""
    from .quant import precision_from_bitwidths
    q = dict(quantization or {})
    unknown = sorted(set(q) - set(QUANTIZATION_KEYS))
    if unknown:
        raise InputError(f"quantization: unknown key(s) {', '.join(unknown)}", f"it takes: {', '.join(QUANTIZATION_KEYS)}")
    if q.get("precision"):
        return q["precision"]
    return precision_from_bitwidths(q.get("act_bitwidth"), q.get("weights_bitwidth"), bool(q.get("enabled", bool(q)))).name


class QNNCompiler:
    """Seed 002's compiler class over `modelexport.compile` (see the module docstring)."""

    def __init__(self, backend: str = "HTP", use_cache: bool = True):
        check_backend(backend)
        self.backend = "HTP"
        self.use_cache = use_cache
        self.last_bundle = None

    def compile(self, model: Any, output_format: str | None = None, quantization: dict | None = None,
                target_device: str | Iterable[str] = "SM8650", output: str | Path | None = None,
                force: bool = False, **options: Any) -> str:
        """→ the artifact's path (str). `options` are modelexport.compile's own (vtcm_mb, strict, ...)."""
        precision = seed_precision(quantization)
        q = dict(quantization or {})
        targets = [target_device] if isinstance(target_device, str) else list(target_device)
        plan = plan_output(model, output, output_format, precision, targets)
        if plan.file is not None:
            check_output(plan.file, force)
        bundle = api_compile(model, output=plan.bundle, target=targets, precision=precision,
                             calibration=q.get("calibration_data"), per_channel=q.get("per_channel", True),
                             output_format=plan.format, force=force, use_cache=self.use_cache, **options)
        self.last_bundle = bundle
        if plan.file is not None:
            write_artifact(bundle, plan, force)
            return str(plan.file)
        return str(artifact_path(bundle))

    def compile_onnx_to_dlc(self, onnx_path: str | Path, output_path: str | Path,
                            quantization_config: dict | None = None, calibration_data: Any = None,
                            force: bool = False) -> str:
        """Seed 002's first spelling: writes `output_path` (a .dlc) and its bundle beside it → output_path."""
        q = dict(quantization_config or {})
        if calibration_data is not None:
            q.setdefault("calibration_data", calibration_data)
            q.setdefault("enabled", True)
        return self.compile(onnx_path, output_format="dlc", quantization=q, output=output_path, force=force)
