"""The Python API, with the CLI's names: audit, compile, sweep, run, verify, inspect (the seeds' QNNCompiler: qnn.py).

`compile` dispatches on what it is given: a frontend (registry in modelexport.frontends) loads
it and says its kind, and the backend registered for that kind (modelexport.backends) compiles
it. A torch-module frontend plus an ExecuTorch backend registering kind "torch" is all it takes
for `modelexport.compile(nn_module, ...)` to work too.
"""
from __future__ import annotations

import functools
import inspect as _signature
from pathlib import Path
from typing import Any, Callable, Iterable

from .backends import BACKENDS, backend_for_kind, check_offered
from .backends.spec import PartSpec, build_options
from .contract.bundle import Bundle
from .contract.bundle_memo import BundleMemo
from .contract.default_output import default_output
from .core.arguments import at_least
from .core.atomic import check_output
from .core.errors import InputError, ModelExportError, UnsupportedError
from .core.formats import FORMATS, BundleFormat
from .core.targets import SoC, get_target
from .frontends import FRONTENDS, find_frontend
from .inspection import inspect_path


def _public(fn):
    """A user's wrong keyword or argument count is an InputError naming what the function takes, not a TypeError."""
    sig = _signature.signature(fn)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise InputError(f"modelexport.{fn.__name__}: {e}",
                             f"it takes: {', '.join(n for n in sig.parameters if n not in ('more', 'options'))}") from None
        try:
            return fn(*args, **kwargs)
        except ModelExportError as e:      # its fix in the Python API's words (input_shapes={...})
            e.in_words_of("api")
            raise
    return checked


def _auditor(kind: str) -> BundleFormat:
    """The format whose audit takes `kind` models (core/formats.py: a row naming an `audit`)."""
    rows = {k: row for row in FORMATS if row.audit for k in BACKENDS.get(row.backend).kinds}
    if kind not in rows:
        raise InputError(f"unknown auditor {kind!r}", f"choose one of: {', '.join(sorted(rows))}")
    return rows[kind]


@_public
def audit(model: Any, example_inputs: Any = None, target: str = "SM8650", precision: str = "fp16", input_shapes=None,
          calibration=None, log_path: str | Path | None = None, input_values=None, **options: Any):
    """Which nodes the target's HTP takes and why the rest fall back → AuditReport.

    `example_inputs` (a tuple of tensors) goes with an nn.Module; `input_values` ({name: value}) fixes
    ONNX inputs to constants (folds control flow on them); `options` are the backend's own
    (PyTorch: overrides=, block_size=, rewrites=, dynamic_shapes=; ONNX: timeout= seconds).
    When QNN refuses to build the graph as a whole, the report has `refused` (QNN's words) and
    `blockers` (the node(s) responsible, with reason and fix); the CLI then exits 2."""
    kind = find_frontend(model).kind
    if example_inputs is not None:
        options["example_inputs"] = example_inputs
    if input_values:
        options["input_values"] = input_values
    row = _auditor(kind)
    check_offered(backend_for_kind(kind), kind, None, [precision] + _override_precisions(options.get("overrides")))
    unknown = sorted(set(options) - set(row.audit_options))
    if unknown:
        raise InputError(f"option(s) {', '.join(unknown)} do not apply to auditing {kind} models",
                         f"{kind} audits take: target, precision, input_shapes, calibration, log_path")
    return row.entry("audit")(model, target=get_target(target), precision=_precision_value(precision),
                              input_shapes=input_shapes, calibration=calibration, log_path=log_path, **options)


_DEFAULT_TARGET = "SM8650"


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _target_list(target) -> list:
    """Targets as given: repeated, a list, or comma-separated (`SM8650,SM8750`)."""
    out = []
    for x in _as_list(target):
        parts = [p.strip() for p in x.split(",")] if isinstance(x, str) and "," in x else [x]
        out += [p for p in parts if p != ""] if len(parts) > 1 else parts    # "" alone is refused as a target
    return out


def _is_model_like(x: Any) -> bool:
    """A second positional argument of compile that is a model (not a module's example inputs)."""
    if isinstance(x, (str, Path, PartSpec)):
        return True
    return any(fe.accepts(x) for _, fe in FRONTENDS)


@_public
def compile(model: Any, *more: Any, output: str | Path | None = None, target: str | Iterable[str] | None = None,
            precision: str | None = None, calibration: Any = None, input_shapes: Any = None, force: bool = False,
            backend: str | None = None, progress: Callable[[str, float, float], None] | None = None,
            example_inputs: Any = None, input_values: Any = None, **options: Any):
    """Compile one or more models (or a pipeline .yaml) for one or more targets into one bundle → Bundle.

    A PyTorch model is an nn.Module with its example inputs (`compile(module, (x,), target=...)`),
    `model.py:factory` or a `.pt2`; it compiles to a .pte (ExecuTorch, QNN delegate). `output`
    defaults to `<name>[_<format>][_<precision>][_<target>]_bundle` in the working directory, naming
    what was chosen (modelexport.contract.default_output); `target` to a pipeline's `targets:`, else
    SM8650. `input_values` ({name: value} or ["name=value"]) fixes ONNX inputs to constants: control
    flow on them is folded (recorded in the manifest).

    `options` are the format's own, with the CLI's names (modelexport.backends.spec): every format takes
    output_format, vtcm_mb, optimization_level, per_channel, strict, use_cache, jobs, overrides;
    ONNX models also strict_numerics, min_sqnr, image_mean, image_std, calibration_method (minmax | percentile)
    and, with precision="auto", max_drop and
    eval_fn (metric(predict) -> float, or "FILE.py:FUNCTION");
    PyTorch models also block_size, rewrites, fallback, dynamic_shapes, strict_numerics; LLMs (GGUF / HF folder) also
    block_size, variants, max_seq_len, context_lengths, context_limit_mb, host_chunk_mb, calibration_samples, rounding, max_ppl_ratio,
    inputs (tokens | embeddings | both), embedder_precision, lora, strict_numerics, min_sqnr (the logits' pass mark); vision-language models also vision_precision,
    image_size, and with a text LLM vision_encoder (your encoder .onnx), image_token, image_mean, image_std.
    An option another
    format takes, or none does, is an InputError."""
    if more and example_inputs is None and not _is_model_like(more[0]):
        example_inputs, more = more[0], more[1:]
    if output is None:
        chosen = [t for t in _target_list(target) if t != _DEFAULT_TARGET]
        output = default_output(model, options.get("output_format"), precision, chosen)
    out = Path(output)
    memo = _bundle_memo([model, *more], example_inputs, calibration,
                        dict(options, target=target, precision=precision, input_shapes=input_shapes, backend=backend,
                             **({"input_values": _jsonable(input_values)} if input_values else {})))
    restored = memo.restore(out, force) if memo else None
    if restored is not None:
        return Bundle.from_trusted(restored)
    bundle = _compile_now(model, more, example_inputs, out, calibration, force, progress, target, precision,
                          input_shapes, backend, options, input_values)
    if memo is not None:
        memo.store(bundle.path)
    return bundle


def _jsonable(values: Any) -> Any:
    """--input-value specs as plain data for the bundle memo's key."""
    if isinstance(values, dict):
        return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in values.items()}
    return [str(v) for v in values]


def _bundle_memo(models: list[Any], example_inputs: Any, calibration: Any, options: dict[str, Any]):
    """The whole-bundle memo for file inputs (modelexport.contract.bundle_memo), or None."""
    if example_inputs is not None or options.get("dynamic_shapes") is not None:
        return None
    return BundleMemo.for_compile(models, calibration, options)


def _override_precisions(overrides) -> list[str]:
    """The PRECISION of each 'REGEX=PRECISION' (a malformed one is left to the override parser)."""
    return [str(o).rpartition("=")[2].strip() for o in _as_list(overrides) if "=" in str(o)]


def _compile_now(model, more, example_inputs, output: Path, calibration, force: bool, progress, target, precision,
                 input_shapes, backend, options: dict[str, Any], input_values: Any = None):
    from .pipeline import is_pipeline, load_pipeline   # deferred: yaml (~9 ms); a cached compile and the other verbs never read a pipeline
    if example_inputs is not None:
        from .frontends.torch_frontend import load_torch   # deferred: ~7 ms, for nn.Module inputs only
        model = load_torch(model, example_inputs)
    targets = _target_list(target)
    parts: list[PartSpec] = []
    for m in (model, *more):
        if isinstance(m, PartSpec):
            parts.append(m)
        elif is_pipeline(m):
            p_parts, p_targets = load_pipeline(m, precision or "8a8w")
            parts += p_parts
            targets = targets or p_targets
        else:
            parts.append(PartSpec(model=m, precision=precision, calibration=calibration, input_shapes=input_shapes,
                                  input_values=input_values))
    if not parts:
        raise InputError("no model given", "pass a .onnx file (or several, or a pipeline .yaml)")
    kinds = {find_frontend(p.model).kind for p in parts}
    if len(kinds) != 1:
        raise InputError(f"one bundle cannot mix model kinds ({', '.join(sorted(kinds))})", "compile them into separate bundles")
    at_least("--jobs", options.get("jobs"), 1, "2")
    kind = kinds.pop()
    if input_values and kind != "onnx":
        raise InputError("--input-value applies to ONNX models", "leave it out for this model")
    be = backend_for_kind(kind, backend, options.get("output_format"))
    _check_auto(parts, kind)
    check_offered(be, kind, options.get("output_format"),
                  [p.precision for p in parts if p.precision != "auto"] + _override_precisions(options.get("overrides")))
    for p in parts:
        p.precision = _precision_value(be.default_precision if p.precision is None else p.precision)
    opts = build_options(be.options, {**options, "targets": _target_values(targets or [_DEFAULT_TARGET]),
                                      "output_format": options.get("output_format") or be.default_format})
    if not any(p.precision == "auto" for p in parts) and (options.get("max_drop") is not None or options.get("eval_fn")):
        raise InputError("--max-drop and --eval-fn are the budget of --precision auto's search",
                         "add --precision auto, or leave them out")
    if any(p.precision == "auto" for p in parts):
        from .sweeping.auto_precision import search_precision
        return search_precision(parts, output, opts, force, be.compile, progress)
    return be.compile(parts, output, opts, force=force, progress=progress)


def _precision_value(name):
    """A part's precision parsed, once, into its row of the precision table (a `Precision`, which is
    also its name); `auto` stays the search's word."""
    if name == "auto" or not name:
        return name
    from .quant.precision import get_precision   # deferred: modelexport.quant loads numpy
    return get_precision(name)


def _target_values(targets: list) -> list[SoC]:
    """The targets parsed, once, into their rows of the SoC table (a `SoC`, which is also its name)."""
    return [get_target(t) for t in targets]


def _check_auto(parts, kind: str) -> None:
    """--precision auto searches ONNX models (backends/ort_qnn/auto_precision.py)."""
    if any(p.precision == "auto" for p in parts) and kind != "onnx":
        raise UnsupportedError(f"--precision auto searches ONNX models' precisions; this is a {kind} model",
                               "give a precision (see `modelexport compile --help`), or export the model to ONNX and "
                               "compile that with --precision auto")


@_public
def sweep(matrix: str | Path, output: str | Path, force: bool = False, workers: int | None = None,
          ray: str | None = None, progress: Callable[[str, float, float], None] | None = None) -> dict:
    """Compile every model × target × precision of a matrix file into OUT/<model>/<target>/<precision>/
    → the results (also written to OUT/results.json, results.csv and report.html).

    Each cell is this module's `compile` for one target and precision, run in a spawned process
    (at most `workers`, default the number of cores) or, with `ray` (an address or "auto"; a
    process already connected to Ray uses its connection), as a Ray task declaring its CPUs and
    memory. A re-run reuses complete cells and runs the missing ones; `force` compiles all again.
    The matrix format: `modelexport sweep --help`, or modelexport.sweeping.matrix."""
    from .sweeping.run import run_sweep   # deferred: pydantic, jinja2, multiprocessing (~190 ms), for sweep only
    return run_sweep(matrix, output, compile, force=force, workers=workers, ray=ray, progress=progress)


@_public
def run(bundle: str | Path, inputs=None, random: bool = False, part: str | None = None, target: str | None = None,
        perf_profile: str | None = None, repeat: int = 1):
    """Run a bundle's compiled graph on the HTP simulator → RunResult (outputs, timings)."""
    from .runtime.runners import runner_for   # deferred: ~35 ms that audit and compile never need
    at_least("--repeat", repeat, 1, "5")
    return runner_for(bundle).run(bundle, inputs, random, part, target, perf_profile, repeat)


@_public
def verify(bundle: str | Path, inputs=None, part: str | None = None, target: str | None = None,
           min_sqnr: float | None = None, max_samples: int | None = None):
    """Float model on CPU vs compiled graph on the simulator → VerifyReport (SQNR, cosine, max abs error)."""
    from .runtime.runners import check_verify_arguments, runner_for   # deferred: ~35 ms that audit and compile never need
    check_verify_arguments(min_sqnr, max_samples)
    return runner_for(bundle).verify(bundle, inputs, part, target, min_sqnr, max_samples)


@_public
def profile(bundle: str | Path, runs: int = 5, level: str = "basic", inputs=None, part: str | None = None,
            target: str | None = None, trace: str | Path | None = None, keep: str | Path | None = None,
            force: bool = False):
    """Per-op times of the compiled graph on the HTP simulator (`modelexport profile`) → ProfileReport;
    level "detailed" gives cycles per QNN node."""
    from .runtime.runners import profile_bundle   # deferred: ~35 ms that audit and compile never need
    if trace is not None:
        check_output(trace, force)
    return profile_bundle(bundle, runs, level, part, target, inputs, trace, keep)


@_public
def inspect(path: str | Path) -> dict:
    return inspect_path(path)
