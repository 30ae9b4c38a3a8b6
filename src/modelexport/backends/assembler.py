"""What every bundle writer does alike: `BundleAssembler`, one bundle being written. The three writers
(`ort_qnn`, `executorch_qnn`, `llm_qnn`) keep only what is their own (their files, options,
graph fields and sections); the assembler owns the rest, the one way:

- the header: kind, format, targets, precision ("mixed" over parts of several), the source;
- the inputs a later step reads: each part's verify samples and calibration record, an LLM's tokenizer,
  QDQ ONNX graphs with their external data;
- the read-back: every QNN context binary read through libQnnSystem (refused when built for another SoC),
  its QAIRT build collected (one build per bundle: `seal_build`), its HTP arch recorded per target, and
  a graph's IO and HTP facts in the manifest's terms (`graph_io`, `htp_facts`);
- the placement: per part and target, and `--strict`'s refusal of CPU fallbacks (`refuse_fallbacks`);
- the timings (`total_s` from the compile's start), the cache record, the QAIRT record.

    with assemble(out, force, t_start) as a:
        a.header(BundleKind.MODEL, Format.PTE, socs, one_precision(...), SourceModel(...))
        ...
        a.record_timings(timings)
    return open_bundle(out)
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..contract.bundle import BundleWriter
from ..contract.manifest import CacheInfo, QairtInfo, SourceModel, Timings
from ..core.cache import Cache
from ..core.errors import StrictFallbackError, ToolchainError
from ..core.targets import SoC
from ..core.vocab import BundleKind, Format, Role
from .context_binary import read_back, tensor_spec

VERIFY_SAMPLES = 4      # the samples of a part's verify inputs the bundle keeps (`verify` compares on them)

# A graph's HTP facts read back from its binary: the manifest's name → libQnnSystem's
HTP_FIELDS = {"vtcm_mb": "vtcm_mb", "optimization_level": "optimization_level",
              "spill_fill_bytes": "spill_fill_buffer_size", "const_bytes": "const_size",
              "shared_weights_bytes": "shared_weights_size"}


@contextmanager
def assemble(out: str | Path, force: bool, t_start: float) -> Iterator[BundleAssembler]:
    """The bundle at `out`, written into a temporary folder and renamed into place when the block
    ends (contract.bundle.BundleWriter): nothing is left behind on an error."""
    with BundleWriter(out, force) as w:
        yield BundleAssembler(w, t_start)


class BundleAssembler:
    """`w`: the BundleWriter (its folder, the files by role); `m`: the manifest being filled."""

    def __init__(self, writer: BundleWriter, t_start: float):
        self.w = writer
        self.m = writer.manifest
        self.t_start = t_start
        self.build_ids: set[str | None] = set()
        self.placement: dict[str, Any] = {}

    def header(self, kind: BundleKind, fmt: Format, socs: list[SoC], precision: str | None,
               source: SourceModel) -> None:
        m = self.m
        m.kind, m.format = kind, fmt
        m.targets = [s.name for s in socs]
        m.precision = precision
        m.source = source

    # ---- the inputs later steps read

    def add_verify_inputs(self, part: str, verify: Any, calibration: Any) -> str:
        """PART/verify_inputs.npz (the first VERIFY_SAMPLES of `verify`, a CalibrationSet) and the part's
        calibration record: what the quantizer saw (none for a float precision) and these samples."""
        samples = verify.samples[:VERIFY_SAMPLES]
        rel = f"{part}/verify_inputs.npz"
        with open(self.w.path(rel, role=Role.VERIFY_INPUTS), "wb") as f:
            np.savez(f, **{f"{k}__{i}": v for i, s in enumerate(samples) for k, v in s.items()})
        self.m.calibration[part] = (calibration.describe() if calibration else
                                    {"kind": "none", "note": "fp16 needs no calibration"}) | {
            "verify_inputs": {"samples": len(samples), "kind": verify.kind, "representative": verify.representative}}
        return rel

    def add_tokenizer(self, folder: Path) -> None:
        """An LLM's tokenizer files under tokenizer/."""
        for f in sorted(Path(folder).iterdir()):
            self.w.add_file(f, f"tokenizer/{f.name}",
                            role=Role.TOKENIZER if f.name == "tokenizer.json" else Role.TOKENIZER_CONFIG)

    def add_onnx(self, folder: Path, name: str, dest: str) -> str | None:
        """NAME.onnx and its external data from `folder` under DEST/ → the .onnx's path in the bundle."""
        rel = None
        for f in sorted(Path(folder).glob(name + ".onnx*")):
            added = self.w.add_file(f, f"{dest}/{f.name}",
                                    role=Role.QUANTIZED_MODEL if f.suffix == ".onnx" else Role.QUANTIZED_MODEL_DATA)
            if f.suffix == ".onnx":
                rel = added
        return rel

    # ---- read-back

    def read_back(self, source: Path | bytes, soc: SoC | None = None, *, arch: bool = False) -> Any:
        """A QNN context binary's own account of itself (libQnnSystem), refused when it names another SoC
        than `soc`; its QAIRT build joins the bundle's; `arch`: its HTP arch is the target's."""
        info = read_back(source, soc)
        self.build_ids.add(info.build_id)
        if arch and soc is not None:
            self.m.htp_arch[soc.name] = info.dsp_arch
        return info

    def seal_build(self, default: str | None) -> None:
        """manifest.qairt_build: the one QAIRT build every binary read back names (`default` when none
        was read back); binaries of different builds are refused."""
        if len(self.build_ids) > 1:
            raise ToolchainError(f"binaries of one bundle name different QAIRT builds {sorted(self.build_ids)}",
                                 "clear the cache (MODELEXPORT_CACHE_DIR) and compile again")
        self.m.qairt_build = next(iter(self.build_ids)) if self.build_ids else default

    # ---- placement

    def place(self, part: str, target: str, record: dict) -> None:
        """Where a part's nodes run on a target (the format's own record), in `placement`."""
        self.placement.setdefault(part, {})[target] = record

    # ---- how the bundle was made

    def record_timings(self, timings: dict, first: dict | None = None) -> None:
        """manifest.timings: `first` (stages recorded before this run, e.g. by a cached stage), then
        `timings`, then `total_s` from the compile's start to now (also set in `timings`)."""
        timings["total_s"] = round(time.perf_counter() - self.t_start, 3)
        self.m.timings = Timings.model_validate({**(first or {}), **timings})

    def record_cache(self, cache: Cache, hits: Iterable[Any] | None = None, *, root: bool = True, **more: Any) -> None:
        """manifest.cache: whether the stage cache was on, where (`root`), `hits` → how many of the stage
        entries were reused and how many built, and the format's own counts (`more`)."""
        counts = {}
        if hits is not None:
            found = [bool(h) for h in hits]
            counts = {"hits": sum(found), "misses": len(found) - sum(found)}
        where = {"root": str(cache.root) if cache.enabled else None} if root else {}
        self.m.cache = CacheInfo(enabled=cache.enabled, **where, **counts, **more)

    def record_qairt(self, qairt: Any) -> None:
        """manifest.qairt: the QAIRT the compile used (toolchain.qairt.find_qairt)."""
        self.m.qairt = QairtInfo(source=qairt.source, version=qairt.version, core_api=qairt.core_api,
                                 htp_api=qairt.htp_api)


def one_precision(names: Iterable[str]) -> str:
    """The bundle's precision: its parts' one precision, or "mixed" (then per part)."""
    distinct = set(names)
    return distinct.pop() if len(distinct) == 1 else "mixed"


def llm_source(facts: Any, architecture: str, n_params: int) -> SourceModel:
    """An LLM bundle's source: the GGUF file or HF folder (llm.export.source facts)."""
    return SourceModel(path=str(facts.path.resolve()), sha256=facts.sha256,
                       format="gguf" if facts.format == "gguf" else "hf-folder",
                       description=f"{architecture}, {n_params:,} parameters")


def refuse_fallbacks(strict: bool, off_htp: dict[tuple[str, str], list[tuple[str, str]]]) -> None:
    """--strict: nodes that run off the HTP ((part, target) → [(node, op)]) fail the compile before
    anything is written (exit 3)."""
    failures = [f"{part} on {target}: " + ", ".join(f"{n} ({o})" for n, o in nodes[:8]) + (" ..." if len(nodes) > 8 else "")
                for (part, target), nodes in off_htp.items() if nodes]
    if strict and failures:
        raise StrictFallbackError("--strict: nodes fell back to the CPU: " + "; ".join(failures),
                                  "run `modelexport audit MODEL --target ...` for the reasons and fixes, or drop --strict")


def graph_io(graph: Any) -> dict:
    """A read-back graph's inputs and outputs (with their encodings) as TensorSpecs; none for no graph."""
    return {"inputs": [tensor_spec(t) for t in graph.inputs] if graph else [],
            "outputs": [tensor_spec(t) for t in graph.outputs] if graph else []}


def htp_facts(graph: Any, *fields: str) -> dict:
    """The named HTP facts (HTP_FIELDS) of a read-back graph; None each for no graph or no HTP section."""
    htp = graph.htp if graph else None
    return {f: getattr(htp, HTP_FIELDS[f]) if htp else None for f in fields}
