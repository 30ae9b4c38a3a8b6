"""The bundle formats, one row each: what compiles a format, and what runs, checks and reads what it wrote.

A row is keyed by the manifest's (format, kind): an LLM's context binaries are not a model's. Its
entry points are "module:function" strings imported on first use (`BundleFormat.entry`), so this table
sits at the bottom of the package without importing any format, and a command imports only the entry it calls.
`runtime/` and `api` look a bundle's format up here and nowhere else; `core.plugins` imports the
formats' compile and inspect modules from here, `core.compile_flags` the rows' words for `--format`'s help.
A new format is one package under `backends/`, its row in FORMATS, and its word in `core.vocab.Format`
(the manifest's typed vocabulary, which refuses a word it does not know).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

from .vocab import BundleKind, Format


# the fields of a row that name a function ("inspect" names a module)
ENTRY_POINTS = ("compile", "audit", "run", "verify", "profile", "per_layer", "stages", "forwards", "session",
                "self_check")


@dataclass(frozen=True)
class BundleFormat:
    """One bundle format's entry points, each "module:function" ("" where the format has none)."""
    format: str
    kind: str
    backend: str                         # the name its compile registers with `@backend`
    compile: str                         # (parts, out, options, force, progress) -> Bundle
    inspect: str = ""                    # a module: its `@inspector` readers register when it is imported
    audit: str = ""                      # (model, target=, precision=, input_shapes=, calibration=, log_path=, **options)
    audit_options: tuple[str, ...] = ()  # the audit's own keywords beyond those
    run: str = ""                        # (bundle, inputs, random, part, target, perf_profile, repeat) -> RunResult
    verify: str = ""                     # (bundle, inputs, part, target, min_sqnr, max_samples) -> VerifyReport
    profile: str = ""                    # (bundle, runs, level, part, target, inputs, trace, keep_dir) -> ProfileReport
    per_layer: str = ""                  # (bundle, inputs, part, target, threshold_db, min_sqnr, max_samples)
    #                                      -> (VerifyReport, [PerLayerReport], source of the numbers)
    stages: str = ""                     # LLMs (eval): bundle -> the compiled stages it runs
    forwards: str = ""                   # LLMs (eval): (bundle, stage) -> ({N: Forward}, spec, max_seq_len)
    session: str = ""                    # LLMs (generate --backend htp-sim): (bundle, stage) -> DecoderSession
    self_check: str = ""                 # compile's own numerics of a compiled part (today its compile calls
    #                                      it directly; the other formats' come with "Compiled means correct")
    help: str = ""                       # its words in `compile --format`'s help (core.compile_flags)

    def entry(self, name: str) -> Callable[..., Any] | None:
        """The entry point `name` (one of ENTRY_POINTS), imported now; None where the format has none."""
        if name not in ENTRY_POINTS:
            raise AttributeError(f"a bundle format has no entry point {name!r}")
        ref = getattr(self, name)
        return resolve(ref) if ref else None


@cache
def resolve(ref: str) -> Callable[..., Any]:
    """`package.module:function` → the function (its module imported on first use)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


_ORT = "modelexport.backends.ort_qnn."
_ET = "modelexport.backends.executorch_qnn."
_LLM = "modelexport.backends.llm_qnn."

FORMATS: tuple[BundleFormat, ...] = (
    BundleFormat(Format.CONTEXT_BINARY, BundleKind.MODEL, "ort_qnn", _ORT + "compile:compile_onnx",
                 inspect=_ORT + "inspect", audit=_ORT + "audit:audit_onnx", audit_options=("input_values", "timeout"),
                 run=_ORT + "run:run_bundle", verify=_ORT + "verify:verify_bundle",
                 profile="modelexport.profiling.ort_profile:profile_ort", per_layer=_ORT + "per_layer:ort_per_layer",
                 self_check=_ORT + "self_check:check_part",
                 help="context-binary (EPContext .onnx + raw QNN context binary per target) for ONNX models"),
    BundleFormat(Format.DLC, BundleKind.MODEL, "ort_qnn", _ORT + "compile:compile_onnx",
                 run=_ORT + "run:run_bundle", verify=_ORT + "verify:verify_bundle",
                 profile="modelexport.profiling.ort_profile:profile_ort",
                 help="dlc (QNN IR container dumped by the QNN EP through libQnnIr.so; target-independent; run/verify "
                      "need context-binary) for ONNX models"),
    BundleFormat(Format.PTE, BundleKind.MODEL, "executorch_qnn", _ET + "compile:compile_torch",
                 inspect=_ET + "inspect", audit=_ET + "audit:audit_torch",
                 audit_options=("example_inputs", "overrides", "block_size", "rewrites", "dynamic_shapes"),
                 run=_ET + "run:run_pte", verify=_ET + "run:verify_pte",
                 profile="modelexport.profiling.pte_profile:profile_pte",
                 help="pte (ExecuTorch program with the QNN delegate) for PyTorch models"),
    BundleFormat(Format.CONTEXT_BINARY, BundleKind.LLM, "llm_qnn", _LLM + "compile:compile_llm",
                 run=_ORT + "run:run_bundle", verify=_LLM + "vision_verify:verify_vision_part",
                 profile="modelexport.profiling.ort_profile:profile_ort", per_layer=_LLM + "per_layer:llm_per_layer_verify",
                 stages=_LLM + "session:compiled_stages", forwards=_LLM + "session:open_forwards",
                 session=_LLM + "session:open_graph_session",
                 help="for LLMs, pte is the context-binary bundle with qnn_llama_runner's program (as "
                      "--executorch-program)"),
)

_BY_KEY = {(row.format, row.kind): row for row in FORMATS}


def bundle_format(fmt: str | None, kind: str | None) -> BundleFormat | None:
    """The row of a manifest's (format, kind); a manifest without a format is a context-binary one's,
    without a kind a model's. None for a pair no format writes."""
    return _BY_KEY.get((fmt or Format.CONTEXT_BINARY, kind or BundleKind.MODEL))


# (format, kind) pairs an older modelexport wrote and no row runs: (what such a bundle is, the fix). Their
# manifests still parse (inspect reads them); the commands that run a bundle refuse them.
RETIRED = {(Format.PTE, BundleKind.LLM): (
    "an LLM .pte bundle (the whole decoder lowered by ExecuTorch's to_edge), which this modelexport does not run",
    "compile the model again with --format pte: it writes a context-binary bundle with the ExecuTorch program "
    "qnn_llama_runner runs")}


def retired(fmt: str | None, kind: str | None) -> tuple[str, str] | None:
    """(what such a bundle is, the fix) for a RETIRED (format, kind); None for any other. The callers raise
    it as an InputError (this table sits below core.errors, which reads compile's flags)."""
    return RETIRED.get((fmt or Format.CONTEXT_BINARY, kind or BundleKind.MODEL))


def modules(entry: str) -> tuple[str, ...]:
    """The modules the formats name for `entry` ("compile", "inspect"), once each, in the table's order."""
    refs = (getattr(row, entry).partition(":")[0] for row in FORMATS)
    return tuple(dict.fromkeys(r for r in refs if r))
