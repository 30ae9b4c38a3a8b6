"""The ONNX backend's output formats (--format), each in one place: how the QNN EP is asked to
write it, what one compile job leaves in its cache entry, and how that goes into the bundle.

The compile looks its format up once (`output_format`); a compile job, in a worker process, by
the name it carries. Bundle-side imports stay inside the functions: a worker needs none of them.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...core.errors import InputError, ToolchainError
from ...core.vocab import GraphKind, Role


@dataclass(frozen=True)
class OutputFormat:
    name: str
    per_target: bool      # compiled for each target (the binary names its SoC), or once for all of them
    runs_here: bool       # run / verify can load it on the HTP simulator
    note: str | None      # manifest.dlc_note: what the bundle is for when it cannot run here
    session: Callable[[Path, str], tuple[dict, dict]]   # (entry dir, part) → provider options to add, session config
    collect: Callable[[Path, str, str], dict]           # (entry dir, part, target) → the files written, by role
    add_to_bundle: Callable[..., None]                  # (BundleAssembler, part, soc, entry, meta): files and graphs


# context-binary: an EPContext model referencing the raw binary beside it (embed mode 0)

def _context_session(tmp: Path, part: str) -> tuple[dict, dict]:
    return {}, {"ep.context_enable": "1", "ep.context_file_path": str(tmp / f"{part}_ctx.onnx"),
                "ep.context_embed_mode": "0"}


def _context_collect(tmp: Path, part: str, target: str) -> dict:
    files: dict = {"epcontext": f"{part}_ctx.onnx"}
    bins = sorted(p.name for p in tmp.glob("*.bin"))
    if not (tmp / files["epcontext"]).is_file() or not bins:
        raise ToolchainError(f"the QNN EP produced no context binary for {part} ({target})",
                             "every node may have fallen back to the CPU: run `modelexport audit`")
    files["context_binary"] = bins[0]
    files["context_binaries"] = bins
    return files


def _context_add(a, p, soc, entry: Path, meta: dict) -> None:
    """The EPContext model and binaries under PART/TARGET/, one graph per QNN graph read back."""
    from ...contract import GraphSpec, TensorSpec   # deferred: the pydantic manifest (~90 ms) stays out of compile workers
    from ..assembler import graph_io, htp_facts
    files = meta["files"]
    tdir = f"{p.name}/{soc.name}"
    ctx_rel = a.w.add_file(entry / files["epcontext"], f"{tdir}/{files['epcontext']}", role=Role.EPCONTEXT_MODEL)
    for b in files["context_binaries"]:
        a.w.add_file(entry / b, f"{tdir}/{b}", role=Role.CONTEXT_BINARY)
    bin_rel = f"{tdir}/{files['context_binary']}"
    info = a.read_back(entry / files["context_binary"], soc, arch=True)
    for g in info.graphs:
        a.m.graphs.append(GraphSpec(
            name=g.name, file=bin_rel, kind=GraphKind.CONTEXT_BINARY, target=soc.name, htp_arch=info.dsp_arch,
            **graph_io(g), part=p.name, epcontext_model=ctx_rel, soc_model=info.soc_model,
            **htp_facts(g, "vtcm_mb", "optimization_level", "spill_fill_bytes", "const_bytes"),
            onnx_inputs=[TensorSpec(**i.to_dict()) for i in p.loaded.inputs],
            onnx_outputs=[TensorSpec(**o.to_dict()) for o in p.loaded.outputs]))


# dlc: the QNN IR container the QNN EP dumps through libQnnIr.so, the same for every target

_DLC_DUMP = "dlc"


def _dlc_session(tmp: Path, part: str) -> tuple[dict, dict]:
    dump = tmp / _DLC_DUMP
    dump.mkdir()
    return {"dump_qnn_ir_dlc": "1", "dump_qnn_ir_dlc_dir": str(dump), "qnn_ir_backend_path": "libQnnIr.so"}, {}


def _dlc_collect(tmp: Path, part: str, target: str) -> dict:
    dump = tmp / _DLC_DUMP
    dlcs = sorted(dump.glob("*.dlc"))
    if not dlcs:
        raise ToolchainError(f"the QNN EP wrote no DLC for {part}", "check that libQnnIr.so is in the onnxruntime-qnn wheel")
    files: dict = {}
    for i, d in enumerate(dlcs):
        name = f"{part}.dlc" if len(dlcs) == 1 else f"{part}_{i}.dlc"
        shutil.move(str(d), tmp / name)
        files.setdefault("dlc", name)
        files[f"dlc_{i}"] = name
    shutil.rmtree(dump, ignore_errors=True)
    return files


def _dlc_add(a, p, soc, entry: Path, meta: dict) -> None:
    """The DLCs under PART/, one graph with the ONNX model's IO (a DLC is not read back here)."""
    import onnx

    from ...contract import GraphSpec, TensorSpec   # deferred: the pydantic manifest (~90 ms) stays out of compile workers
    for key, name in meta["files"].items():
        if key.startswith("dlc_"):
            a.w.add_file(entry / name, f"{p.name}/{name}", role=Role.DLC)
    qdq = onnx.load(str(p.work["qdq"] or p.work["float"]), load_external_data=False)
    a.m.graphs.append(GraphSpec(name=p.name, file=f"{p.name}/{meta['files']['dlc']}", kind=GraphKind.DLC,
                                       inputs=[TensorSpec(**i.to_dict()) for i in p.loaded.inputs],
                                       outputs=[TensorSpec(**o.to_dict()) for o in p.loaded.outputs],
                                       part=p.name, nodes=len(qdq.graph.node)))


OUTPUT_FORMATS = {f.name: f for f in (
    OutputFormat("context-binary", per_target=True, runs_here=True, note=None,
                 session=_context_session, collect=_context_collect, add_to_bundle=_context_add),
    OutputFormat("dlc", per_target=False, runs_here=False,
                 note="DLC dumped by the QNN EP through libQnnIr.so: a target-independent QNN IR container "
                      "(for qnn-context-binary-generator / qnn-net-run); run/verify need a context-binary bundle",
                 session=_dlc_session, collect=_dlc_collect, add_to_bundle=_dlc_add),
)}


# The seeds' other spellings of the format names.
FORMAT_ALIASES = {"context_binary": "context-binary", "ctx": "context-binary", "bin": "context-binary"}


def canonical_format(name: str) -> str:
    """A format name or one of its aliases → the name; unknown names are refused by `output_format`."""
    key = str(name).strip().lower()
    return FORMAT_ALIASES.get(key, key)


def output_format(name: str) -> OutputFormat:
    if name not in OUTPUT_FORMATS:
        raise InputError(f"unknown format {name!r}", f"choose one of: {', '.join(OUTPUT_FORMATS)}")
    return OUTPUT_FORMATS[name]


# An output file's suffix → the format it names (`compile-qnn model.onnx model.dlc`). Only suffixes
# that name one format unambiguously: a .onnx output could be a float, QDQ or EPContext model.
SUFFIX_FORMATS = {".bin": "context-binary", ".dlc": "dlc"}
# Suffixes of model files the seeds name that we do not write: an output so named is refused with the
# suffixes above rather than taken for a folder (.cpp is qnn-model-lib-generator's input, not ours).
OTHER_MODEL_SUFFIXES = (".onnx", ".cpp", ".so", ".pte", ".json", ".serialized")


def names_a_file(output: Path) -> bool:
    """An OUTPUT that means a file (format by its suffix), not a bundle folder."""
    suffix = output.suffix.lower()
    return suffix in SUFFIX_FORMATS or suffix in OTHER_MODEL_SUFFIXES


def format_for_output(output: Path, given: str | None) -> tuple[str, str]:
    """(format, why it was chosen) for an output file; `given` is --format / output_format, or None."""
    suffix = output.suffix.lower()
    named = SUFFIX_FORMATS.get(suffix)
    if named is None:
        raise InputError(f"{output.name}: the suffix {suffix or '(none)'} names no output format",
                         f"name the file {', '.join('*' + s + ' (' + f + ')' for s, f in SUFFIX_FORMATS.items())}, "
                         "or give a folder as OUTPUT for the whole bundle")
    if given is not None and given != named:
        raise InputError(f"{output.name} names the {named} format but --format is {given}",
                         f"name the output *{_suffix_of(given)} or leave --format out")
    return named, "from --format" if given else f"from the output's suffix {suffix}"


def _suffix_of(fmt: str) -> str:
    return next((s for s, f in SUFFIX_FORMATS.items() if f == fmt), "")
