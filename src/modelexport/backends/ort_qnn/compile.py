"""ONNX → QNN context binaries through ONNX Runtime's QNN EP, for one or more targets.

Per part (one ONNX model): fix shapes → (quantized precisions) qnn_preprocess_model,
get_qnn_qdq_config, quantize with the calibration data → per target: an EPContext model plus
its raw context binary (embed mode 0), or a DLC through libQnnIr.so (formats.py). Quantization is
shared by all targets; targets compile concurrently in a process pool. Both stages are cached by
content.
The target, HTP arch and VTCM written into each binary are read back through libQnnSystem.so and
checked against what was asked.
"""
from __future__ import annotations

import os
import shutil
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from ...contract import open_bundle

from ...core.atomic import check_output
from ...contract.manifest import PartEntry, PartFiles, SourceModel, TensorSpec
from ...core.vocab import BundleKind, Format, Role
from ...core.cache import Cache, cache_key, code_fingerprint
from ...core.errors import InputError, StrictNumericsError, ToolchainError
from ...core.files import sha256_onnx
from ...core.numerics_advice import numerics_fix_for, numerics_line
from ...frontends.module_paths import onnx_module_path
from ...frontends.onnx_index_inputs import index_limits
from ...frontends.onnx_model import LoadedOnnx
from ...frontends.vision_encoder_onnx import parse_triple
from ...passes.onnx.log_power_scale import log_power_scale
from ...passes.onnx.metadata_props import attach
from ...quant import ONNX_PRECISIONS, Precision, get_precision, load_calibration
from ...quant.calibration import CalibrationSet, random_samples
from ...quant.onnx_overrides import parse_onnx_overrides
from ...quant.precision import min_sqnr_option
from ...quant.onnx_qdq import RANGE_METHODS, check_split, quantize_onnx
from ...quant.media_calibration import MediaOptions
from ...core.targets import SoC, get_target, require_feature
from ...toolchain.ort_qnn import CPU_EP_NAME
from ...toolchain.ort_qnn_log import is_graph_refusal
from ...toolchain.qairt import find_qairt
from .. import backend
from ..assembler import BundleAssembler, assemble, one_precision, refuse_fallbacks
from ...toolchain.htp_options import check_knobs, compile_provider_options
from ...toolchain.worker_pool import raise_first_error, run_jobs
from . import worker as ort_qnn_worker
from .audit import audit_onnx
from .formats import OUTPUT_FORMATS, OutputFormat, output_format
from .repair import load_repaired, precision_repairs
from .self_check import check_part
from ..spec import OnnxCompileOptions, PartSpec, part_name

_IO_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class _Part:
    spec: PartSpec
    name: str
    loaded: LoadedOnnx
    precision: Precision
    calibration: CalibrationSet | None
    verify_inputs: CalibrationSet
    work: dict[str, Any] = field(default_factory=dict)


def _prepare_parts(specs: list[PartSpec], opts: OnnxCompileOptions, socs: list[SoC]) -> list[_Part]:
    """Everything that can be wrong with the inputs is found here, before any heavy work."""
    parts, taken = [], set()
    for spec in specs:
        prec = get_precision(spec.precision, ONNX_PRECISIONS)
        if prec.feature:
            for soc in socs:
                require_feature(soc, prec.feature, f"precision {prec.name}")
        loaded = load_repaired(spec.model, spec.input_shapes, spec.input_values, **precision_repairs(prec))
        name = part_name(spec.name or loaded.name or "model", taken)
        calib = None
        limits, media = index_limits(loaded.model), media_options(opts)
        if prec.quantized:
            calib = load_calibration(spec.calibration, loaded.inputs, opts.random_samples, limits, media)
            verify = calib
        elif spec.calibration is not None:
            verify = load_calibration(spec.calibration, loaded.inputs, opts.random_samples, limits, media)
        else:
            verify = CalibrationSet(random_samples(loaded.inputs, 2, seed=1, limits=limits), "random", "random",
                                    representative=False)
        # fp16: a Log's power spectrum moved into float16's range, by the ranges of the user's samples
        if not prec.quantized and verify.representative and (scaled := log_power_scale(loaded.model, verify.samples)):
            loaded.repairs = [*loaded.repairs, {"name": "log-power-scale", **scaled}]
        parts.append(_Part(spec, name, loaded, prec, calib, verify))
    return parts


def media_options(opts) -> MediaOptions:
    """--image-mean / --image-std / --image-bgr for a calibration folder of photos (0..1 RGB pixels by default)."""
    return MediaOptions(parse_triple(getattr(opts, "image_mean", None), "--image-mean", (0.0, 0.0, 0.0)),
                        parse_triple(getattr(opts, "image_std", None), "--image-std", (1.0, 1.0, 1.0)),
                        bool(getattr(opts, "image_bgr", False)))


def _range_method(opts) -> str:
    """--calibration-method; the VLM's vision part passes plain CompileOptions (min-max)."""
    return getattr(opts, "calibration_method", "minmax")


def _check_quantization_options(prepared: list[_Part], opts: OnnxCompileOptions) -> None:
    """--override 'REGEX=PRECISION' and --split-weights against each part's precision, before any heavy work."""
    for p in prepared:
        if opts.overrides:
            parse_onnx_overrides(opts.overrides, p.precision)
        if _split_weights(opts):
            check_split(p.precision)


def _split_weights(opts) -> bool:
    """--split-weights; the VLM's vision part passes plain CompileOptions (no split)."""
    return bool(getattr(opts, "split_weights", False))


def _quantize_stage(part: _Part, opts: OnnxCompileOptions, cache: Cache) -> tuple[Path, Path | None, dict, bool]:
    """(float model path, qdq path or None, quantization info, cache hit) via the 'qdq' cache."""
    import onnxruntime
    method = _range_method(opts)
    float_bytes = part.loaded.to_bytes()
    key = cache_key("qdq", float_bytes, part.precision.to_dict(), opts.per_channel,
                    part.calibration.digest() if part.calibration else None, onnxruntime.__version__, code_fingerprint(),
                    *([["onnx-overrides-v2", *opts.overrides]] if opts.overrides else []),
                    *([["ranges", method]] if method != "minmax" else []),
                    *([["split-weights"]] if _split_weights(opts) else []),
                    *([["metadata", part.loaded.detached_metadata]] if part.loaded.detached_metadata else []))

    def build(tmp: Path) -> dict:
        (tmp / "model.onnx").write_bytes(float_bytes)
        try:
            return _quantize_into(tmp)
        finally:
            _reattach_metadata(tmp, part.loaded.detached_metadata)

    def _quantize_into(tmp: Path) -> dict:
        if not part.precision.quantized:
            return {"quantized": False}
        t0 = time.perf_counter()
        info = quantize_onnx(tmp / "model.onnx", tmp / "model.qdq.onnx", part.precision, part.calibration, opts.per_channel,
                             overrides=list(opts.overrides) or None, method=method, split_weights=_split_weights(opts))
        pre = Path(info.pop("preprocessed_model"))
        if pre.name != "model.onnx" and pre.exists():
            pre.unlink()
        return {"quantized": True, "quantization": info, "seconds": round(time.perf_counter() - t0, 3)}

    entry, hit = cache.get_or_create("qdq", key, build)
    meta = Cache.meta(entry)
    qdq = entry / "model.qdq.onnx" if meta.get("quantized") else None
    part.work["qdq_entry"] = entry
    return entry / "model.onnx", qdq, meta, hit


def _reattach_metadata(folder: Path, props: list[tuple[str, str]]) -> None:
    """The metadata the `metadata-props` repair detached, back on the written float and QDQ models."""
    if not props:
        return
    import onnx
    for f in (folder / "model.onnx", folder / "model.qdq.onnx"):
        if f.exists():
            m = onnx.load(str(f), load_external_data=False)
            attach(m, props)
            onnx.save(m, str(f))


def _sha_file(p: Path) -> str:
    return sha256_onnx(p)


def _fallbacks(placement: dict[str, list[list[str]]], graph_inputs: set[str], graph_outputs: set[str]) -> list[tuple[str, str]]:
    """CPU nodes other than the graph-boundary (de)quantization ONNX Runtime keeps there by design."""
    out = []
    boundary_left = len(graph_inputs) + len(graph_outputs)   # at most one Q or DQ per boundary tensor
    for name, op in placement.get(CPU_EP_NAME, []):
        if op in _IO_OPS and boundary_left > 0:
            # the quantizer names them <tensor>_QuantizeLinear, or <tensor>_q / _dq (MTCNN's onet);
            # ONNX Runtime's layout transformer may replace one by a copy named <Op>_token_<n>
            # (a conv's output DequantizeLinear moved past the NHWC transpose)
            named = name.endswith(("_QuantizeLinear", "_DequantizeLinear", "_q", "_dq")) and \
                name.rsplit("_", 1)[0] in graph_inputs | graph_outputs
            if named or _ORT_COPY.fullmatch(name):
                boundary_left -= 1
                continue
        out.append((name, op))
    return out


_ORT_COPY = re.compile(r"(QuantizeLinear|DequantizeLinear)_token_\d+")


def _node_rows(job, result, by_part) -> list[dict]:
    """Per-node placement of the first part and target, in the shape report.html reads."""
    p = by_part[job["part"]]
    ins = {i.name for i in p.loaded.inputs}
    outs = {o.name for o in p.loaded.outputs}
    where = result["meta"]["placement"]
    fallbacks = set(_fallbacks(where, ins, outs))
    rows = []
    for ep, nodes in where.items():
        for name, op in nodes:
            name, op = str(name), str(op)
            backend = "HTP" if ep == "QNNExecutionProvider" else ("CPU" if (name, op) in fallbacks else "io")
            row = {"name": name, "op_type": op, "backend": backend,
                   "module_path": onnx_module_path(SimpleNamespace(name=name, metadata_props=[]))}
            if backend == "CPU":
                row["reason"] = "placed on the CPU EP by the QNN EP"
                row["fix"] = "run `modelexport audit MODEL --target ...` for the validator's reason and a fix"
            elif backend == "io":
                row["reason"] = "graph-boundary (de)quantization, kept on the CPU by design"
            rows.append(row)
    return rows


# A model this large (with its external data) prepares in a child process: about 2 s of start-up
# against a graph preparation of tens of seconds; the HTP's preparation of a 45 MB diffusion UNet at
# 16a16w passed 21 GB.
IN_PROCESS_MAX_BYTES = 16 << 20
OUT_OF_MEMORY_FIX = ("compile with -O 1 (a lighter graph preparation: check its speed with `modelexport profile`), "
                     "a smaller --input-shape where the model allows one, or another --precision; otherwise on a "
                     "host with more memory")


def _model_bytes(path: Path) -> int:
    """The model file and its external data files (named after it, beside it)."""
    return sum(f.stat().st_size for f in path.parent.glob(path.name + "*") if f.is_file())


@backend("ort_qnn", kinds=("onnx",), description="ONNX Runtime QNN EP: QDQ quantization, EPContext models and context binaries",
         formats=tuple(OUTPUT_FORMATS), precisions=ONNX_PRECISIONS, options=OnnxCompileOptions)
def compile_onnx(parts: list[PartSpec], out: str | Path, options: OnnxCompileOptions | None = None, force: bool = False,
                 progress: Callable[[str, float, float], None] | None = None) -> Any:
    """Compile every part for every target into one bundle at `out`; returns the opened Bundle."""
    opts = options or OnnxCompileOptions()
    report = progress or (lambda msg, done, total: None)
    t_start = time.perf_counter()
    out = Path(out)
    check_output(out, force)                     # before any work: an existing output needs --force
    fmt = output_format(opts.output_format)
    if not opts.targets:
        raise InputError("no target given", "pass --target SM8650 (see `modelexport targets`)")
    socs: list[SoC] = list(dict.fromkeys(get_target(t) for t in opts.targets))
    check_knobs(socs, opts.vtcm_mb, opts.optimization_level)
    if _range_method(opts) not in RANGE_METHODS:
        raise InputError(f"--calibration-method {_range_method(opts)!r} is not one this compile offers",
                         f"choose one of: {', '.join(RANGE_METHODS)}")
    if not parts:
        raise InputError("no model given", "pass one or more .onnx files")
    prepared = _prepare_parts(parts, opts, socs)
    _check_quantization_options(prepared, opts)
    qairt = find_qairt()
    cache = Cache(enabled=opts.use_cache)
    compile_for = socs if fmt.per_target else socs[:1]
    n_steps = len(prepared) + len(prepared) * len(compile_for)
    done = 0
    timings: dict[str, Any] = {}
    # 1. quantization, shared by all targets
    for p in prepared:
        report(f"{'quantizing' if p.precision.quantized else 'preparing'} {p.name} ({p.precision.name})", done, n_steps)
        t0 = time.perf_counter()
        p.work["float"], p.work["qdq"], p.work["qmeta"], hit = _quantize_stage(p, opts, cache)
        timings[f"{p.name}.quantize_s"] = round(time.perf_counter() - t0, 3)
        p.work["quant_cache_hit"] = hit
        done += 1
    # 2. one compile job per part and target (per part only for a format that is the same for all targets)
    jobs = []
    for p in prepared:
        model_path = p.work["qdq"] or p.work["float"]
        model = ort_qnn_worker.ModelFile(model_path, _sha_file(model_path))
        for soc in compile_for:
            popts = compile_provider_options(soc, opts.vtcm_mb, opts.optimization_level)
            jobs.append(ort_qnn_worker.compile_job_for(p.name, soc.name, model, popts, opts.output_format,
                                                       qairt.build_id, cache))
    pending = [j for j in jobs if not cache.get(ort_qnn_worker.CACHE_NAMESPACE, j["key"])]
    workers = min(len(pending), opts.jobs or os.cpu_count() or 1)
    report(f"compiling {len(jobs)} graph(s) for {', '.join(s.name for s in socs)}"
           + (f" ({workers} in parallel)" if workers > 1 else ""), done, n_steps)
    t0 = time.perf_counter()

    def on_done(res) -> None:
        nonlocal done
        done += 1
        meta = res["meta"] if isinstance(res, dict) else None
        report(f"compiled {meta.get('part', '?')} for {meta.get('target', '?')}" if meta is not None
               else "a graph did not compile (the error follows)", done, n_steps)
    # one small job or one worker: in this process, without a child's start-up. A large graph always
    # prepares in a child, so that running out of memory there is an error the user reads, not "Killed".
    small = all(_model_bytes(Path(j["model_path"])) < IN_PROCESS_MAX_BYTES for j in pending)
    outcomes = run_jobs("the QNN EP compile", [(ort_qnn_worker.compile_job, j) for j in jobs], workers, on_done,
                        in_process=not pending or (small and (workers <= 1 or len(jobs) <= 1)),
                        memory_fix=OUT_OF_MEMORY_FIX)
    timings["compile_s"] = round(time.perf_counter() - t0, 3)
    temp_entries = [Path(r["entry"]) for r in outcomes if isinstance(r, dict) and not cache.enabled]
    try:
        results = raise_first_error(_name_refused_nodes(outcomes, jobs, prepared, opts))
        numerics = _self_check(prepared, jobs, results, report, timings, _pass_mark(opts)) \
            if fmt.runs_here and getattr(opts, "self_check", True) else []
        if getattr(opts, "strict_numerics", False):   # the VLM's vision part passes plain CompileOptions
            _refuse_bad_numerics(numerics, by_name={p.name: p for p in prepared})
        return _write_bundle(out, force, opts, _Run(socs, fmt, qairt, cache, timings, t_start), prepared, jobs,
                             results, numerics)
    finally:
        for t in temp_entries:
            shutil.rmtree(t, ignore_errors=True)
        if not cache.enabled:
            for p in prepared:
                if p.work.get("qdq_entry"):
                    shutil.rmtree(p.work["qdq_entry"], ignore_errors=True)


def _name_refused_nodes(outcomes: list, jobs: list[dict], prepared: list[_Part], opts) -> list:
    """A graph QNN refused to build (`Failed to compose Qnn graph`): the audit names the node from the EP's
    log, and its message replaces the EP's bare one."""
    by_part = {p.name: p for p in prepared}
    out = []
    for job, r in zip(jobs, outcomes):
        if isinstance(r, ToolchainError) and is_graph_refusal(r.problem):
            p = by_part[job["part"]]
            try:
                rep = audit_onnx(p.loaded.model, job["target"], p.precision.name,
                                 calibration=[dict(s) for s in p.calibration.samples] if p.calibration else None)
            except Exception:     # best effort: the EP's own message stands
                rep = None
            blocked = [n for n in (rep.nodes if rep else []) if n.backend == "blocks"]
            if blocked:
                r = ToolchainError(f"QNN refused to build {p.name} for {job['target']} at " + "; ".join(
                    f"{n.name} ({n.op_type}): {n.reason}" for n in blocked[:3]), blocked[0].fix)
        out.append(r)
    return out


def _pass_mark(opts) -> float | None:
    """--min-sqnr DB as compile's own pass mark (None: each precision's)."""
    return min_sqnr_option(getattr(opts, "min_sqnr", None))


def _self_check(prepared, jobs, results, report, timings, threshold: float | None) -> list[dict]:
    """Compile's own numerics: every compiled graph on the simulator against the float model."""
    by_part = {p.name: p for p in prepared}
    t0 = time.perf_counter()
    out = []
    for job, r in zip(jobs, results):
        report(f"checking {job['part']}@{job['target']} on the HTP simulator against the float model", len(out), len(jobs))
        out.append(check_part(by_part[job["part"]], Path(r["entry"]) / r["meta"]["files"]["epcontext"], job["target"],
                              job["provider_options"], threshold))
    timings["numerics_s"] = round(time.perf_counter() - t0, 3)
    return out


def _refuse_bad_numerics(numerics: list[dict], by_name: dict) -> None:
    """--strict-numerics: exit 7 and write nothing when a graph is below its pass mark."""
    bad = [n for n in numerics if not n["passed"]]
    if bad:
        raise StrictNumericsError("--strict-numerics: the compiled graph differs from the float model on compile's own "
                                  "check: " + "; ".join(numerics_line(n) for n in bad),
                                  numerics_fix_for(bad[0], by_name[bad[0]["part"]].precision.quantized)
                                  + "; or drop --strict-numerics to keep the bundle and check it yourself")


@dataclass(frozen=True)
class _Run:
    """What the bundle writer records of this compile besides the parts and the graphs."""
    socs: list[SoC]
    fmt: OutputFormat
    qairt: Any
    cache: Cache
    timings: dict
    t_start: float


def _placement(prepared: list[_Part], jobs: list[dict], results: list, strict: bool) -> dict[str, dict]:
    """Per part and target: nodes on the HTP, CPU fallbacks, the boundary (de)quantization ONNX Runtime
    keeps on the CPU; --strict refuses a fallback here, before anything is written."""
    by_part = {p.name: p for p in prepared}
    placement: dict[str, dict] = {}
    off_htp = {}
    for job, r in zip(jobs, results):
        p = by_part[job["part"]]
        where = r["meta"]["placement"]
        fb = _fallbacks(where, {i.name for i in p.loaded.inputs}, {o.name for o in p.loaded.outputs})
        placement.setdefault(p.name, {})[job["target"]] = {
            "htp_nodes": len(where.get("QNNExecutionProvider", [])),
            "cpu_fallbacks": [{"name": n, "op_type": o} for n, o in fb],
            "cpu_io_quantization": len(where.get(CPU_EP_NAME, [])) - len(fb)}
        off_htp[(p.name, job["target"])] = fb
    refuse_fallbacks(strict, off_htp)
    return placement


def _add_part(a: BundleAssembler, p: _Part) -> None:
    """A part's float and QDQ models, its verify inputs and its entry (its graphs come per target)."""
    files = PartFiles(float_model=a.w.add_file(p.work["float"], f"{p.name}/model.onnx", role=Role.FLOAT_MODEL))
    if p.work["qdq"]:
        files.quantized_model = a.w.add_file(p.work["qdq"], f"{p.name}/model.qdq.onnx", role=Role.QUANTIZED_MODEL)
    files.verify_inputs = a.add_verify_inputs(p.name, p.verify_inputs, p.calibration)
    a.m.parts.append(PartEntry(
        name=p.name, source=str(p.loaded.path) if p.loaded.path else None, sha256=p.loaded.sha256,
        precision=p.precision.name, inputs=[TensorSpec(**i.to_dict()) for i in p.loaded.inputs],
        outputs=[TensorSpec(**o.to_dict()) for o in p.loaded.outputs], fixed_shapes=p.loaded.fixed_shapes,
        repairs=p.loaded.repairs or None, quantization=p.work["qmeta"].get("quantization"), files=files,
        cache_hit={"quantize": p.work["quant_cache_hit"]}))


def _numerics_record(numerics: list[dict], fmt: OutputFormat) -> dict:
    """manifest.numerics: the first failing graph (else the first), and a line per graph."""
    if not numerics:
        return {"not_checked": f"a {fmt.name} cannot run on this host's HTP simulator"}
    first = next((n for n in numerics if not n["passed"]), numerics[0])
    return first | {"graphs": [{"part": n["part"], "target": n["target"], "passed": n["passed"]} for n in numerics]}


def _write_bundle(out, force, opts, run: _Run, prepared: list[_Part], jobs: list[dict], results: list,
                  numerics: list[dict]):
    by_part = {p.name: p for p in prepared}
    placement = _placement(prepared, jobs, results, opts.strict)
    with assemble(out, force, run.t_start) as a:
        first = prepared[0].loaded
        a.header(BundleKind.MODEL, Format(run.fmt.name), run.socs, one_precision(p.precision.name for p in prepared),
                 SourceModel(path=str(first.path) if first.path else None, sha256=first.sha256, format="onnx",
                             description=None if len(prepared) == 1 else f"{len(prepared)} models: " + ", ".join(by_part)))
        a.m.options = {"optimization_level": opts.optimization_level, "vtcm_mb": opts.vtcm_mb,
                       "per_channel": opts.per_channel, "strict": opts.strict, "embed_mode": 0,
                       "offload_graph_io_quantization": 1, "provider_options": {}, "backend": "ort_qnn"}
        for p in prepared:
            _add_part(a, p)
        for job, r in zip(jobs, results):
            p, meta = by_part[job["part"]], r["meta"]
            a.m.options["provider_options"][job["target"]] = meta["provider_options"]
            a.m.part(p.name).cache_hit[job["target"]] = r["hit"]
            run.timings[f"{p.name}.{job['target']}.compile_s"] = meta["compile_seconds"]
            run.fmt.add_to_bundle(a, p, get_target(job["target"]), Path(r["entry"]), meta)
        a.seal_build(run.qairt.build_id)
        a.m.placement = placement | {"nodes": _node_rows(jobs[0], results[0], by_part)}
        a.record_timings(run.timings)
        a.record_cache(run.cache, [r["hit"] for r in results] + [p.work["quant_cache_hit"] for p in prepared])
        a.record_qairt(run.qairt)
        a.m.numerics = _numerics_record(numerics, run.fmt)
        if run.fmt.note:              # the one format that cannot run here says what it is for
            a.m.dlc_note = run.fmt.note
    return open_bundle(out)
