"""ONNX → QNN context binaries through ONNX Runtime's QNN EP, for one or more targets.

Per part (one ONNX model): fix shapes → (quantized precisions) qnn_preprocess_model,
get_qnn_qdq_config, quantize with the calibration data → per target: an EPContext model plus
its raw context binary (embed mode 0), or a DLC through libQnnIr.so. Quantization is shared by
all targets; targets compile concurrently in a process pool. Both stages are cached by content.
The target, HTP arch and VTCM written into each binary are read back through libQnnSystem.so and
checked against what was asked.
"""
from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...contract import BundleWriter, GraphSpec, TensorSpec, open_bundle
from ...core.atomic import check_output
from ...contract.manifest import CacheInfo, Encoding, PartEntry, PartFiles, QairtInfo, SourceModel, Timings
from ...core.vocab import BundleKind, Format, GraphKind, Role
from ...core.cache import Cache, cache_key
from ...core.errors import InputError, StrictFallbackError, ToolchainError
from ...frontends.onnx_model import LoadedOnnx, load_onnx
from ...quant import ONNX_PRECISIONS, Precision, get_precision, load_calibration
from ...quant.calibration import CalibrationSet, random_samples
from ...core.targets import SoC, get_target, require_feature
from ...toolchain.ort_qnn import CPU_EP_NAME
from .. import backend
from ...toolchain.htp_options import check_knobs, compile_provider_options
from . import worker as ort_qnn_worker
from ..spec import CompileOptions, PartSpec

FORMATS = ("context-binary", "dlc")
VERIFY_SAMPLES = 4
_IO_OPS = ("QuantizeLinear", "DequantizeLinear")
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
# QNN dtype → numpy name and bits
_QNN_DTYPES = {"UFIXED_POINT_8": ("uint8", 8), "SFIXED_POINT_8": ("int8", 8), "UFIXED_POINT_16": ("uint16", 16),
               "SFIXED_POINT_16": ("int16", 16), "UFIXED_POINT_4": ("uint4", 4), "SFIXED_POINT_4": ("int4", 4),
               "SFIXED_POINT_32": ("int32", 32), "UFIXED_POINT_32": ("uint32", 32), "FLOAT_16": ("float16", 16),
               "FLOAT_32": ("float32", 32), "INT_32": ("int32", 32), "UINT_8": ("uint8", 8), "BOOL_8": ("bool", 8),
               "INT_64": ("int64", 64), "UINT_32": ("uint32", 32), "INT_8": ("int8", 8), "UINT_16": ("uint16", 16)}


@dataclass
class _Part:
    spec: PartSpec
    name: str
    loaded: LoadedOnnx
    precision: Precision
    calibration: CalibrationSet | None
    verify_inputs: CalibrationSet
    work: dict[str, Any] = field(default_factory=dict)


def _part_name(spec: PartSpec, loaded: LoadedOnnx, taken: set[str]) -> str:
    base = spec.name or loaded.name or "model"
    base = "".join(c if c in _NAME_OK else "_" for c in base) or "model"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _prepare_parts(specs: list[PartSpec], opts: CompileOptions, socs: list[SoC]) -> list[_Part]:
    """Everything that can be wrong with the inputs is found here, before any heavy work."""
    parts, taken = [], set()
    for spec in specs:
        prec = get_precision(spec.precision, ONNX_PRECISIONS)
        if prec.feature:
            for soc in socs:
                require_feature(soc, prec.feature, f"precision {prec.name}")
        loaded = load_onnx(spec.model, spec.input_shapes)
        name = _part_name(spec, loaded, taken)
        calib = None
        if prec.quantized:
            calib = load_calibration(spec.calibration, loaded.inputs, opts.random_samples)
            verify = calib
        elif spec.calibration is not None:
            verify = load_calibration(spec.calibration, loaded.inputs, opts.random_samples)
        else:
            verify = CalibrationSet(random_samples(loaded.inputs, 2, seed=1), "random", "random", representative=False)
        parts.append(_Part(spec, name, loaded, prec, calib, verify))
    return parts


def _quantize_stage(part: _Part, opts: CompileOptions, cache: Cache) -> tuple[Path, Path | None, dict, bool]:
    """(float model path, qdq path or None, quantization info, cache hit) via the 'qdq' cache."""
    import onnxruntime
    float_bytes = part.loaded.to_bytes()
    key = cache_key("qdq", float_bytes, part.precision.to_dict(), opts.per_channel,
                    part.calibration.digest() if part.calibration else None, onnxruntime.__version__,
                    *([["onnx-overrides-v2", *opts.overrides]] if opts.overrides else []))

    def build(tmp: Path) -> dict:
        (tmp / "model.onnx").write_bytes(float_bytes)
        if not part.precision.quantized:
            return {"quantized": False}
        from ...quant.onnx_qdq import quantize_onnx
        t0 = time.perf_counter()
        info = quantize_onnx(tmp / "model.onnx", tmp / "model.qdq.onnx", part.precision, part.calibration, opts.per_channel,
                             overrides=list(opts.overrides) or None)
        pre = Path(info.pop("preprocessed_model"))
        if pre.name != "model.onnx" and pre.exists():
            pre.unlink()
        return {"quantized": True, "quantization": info, "seconds": round(time.perf_counter() - t0, 3)}

    entry, hit = cache.get_or_create("qdq", key, build)
    meta = Cache.meta(entry)
    qdq = entry / "model.qdq.onnx" if meta.get("quantized") else None
    part.work["qdq_entry"] = entry
    return entry / "model.onnx", qdq, meta, hit


def _sha_file(p: Path) -> str:
    from ...contract.manifest import sha256_file
    return sha256_file(p)


def _run_jobs(jobs: list[dict], workers: int, on_done: Callable[[dict], None]) -> list[dict]:
    results: list[dict] = [None] * len(jobs)  # type: ignore[list-item]
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            results[i] = ort_qnn_worker.compile_job(job)
            on_done(results[i])
        return results
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(ort_qnn_worker.compile_job, job): i for i, job in enumerate(jobs)}
        from concurrent.futures import as_completed
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            on_done(results[futures[fut]])
    return results


def _raise_error(err: dict) -> None:
    import modelexport.core.errors as E
    cls = getattr(E, err["type"], E.ModelExportError)
    raise cls(err["problem"], err.get("fix"))


def _fallbacks(placement: dict[str, list[list[str]]], graph_inputs: set[str], graph_outputs: set[str]) -> list[tuple[str, str]]:
    """CPU nodes other than the graph-boundary (de)quantization ONNX Runtime keeps there by design."""
    out = []
    for name, op in placement.get(CPU_EP_NAME, []):
        if op in _IO_OPS and (name.endswith("_QuantizeLinear") or name.endswith("_DequantizeLinear")):
            base = name.rsplit("_", 1)[0]
            if base in graph_inputs or base in graph_outputs:
                continue
        out.append((name, op))
    return out


def _node_rows(job, result, by_part) -> list[dict]:
    """Per-node placement of the first part and target, in the shape report.html reads."""
    from types import SimpleNamespace

    from ...frontends.module_paths import onnx_module_path
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


def _encoding(q) -> Encoding | None:
    if q is None:
        return None
    if q.scale is not None:
        return Encoding(dtype=q.encoding, scale=q.scale, zero_point=q.zero_point, bits=q.bitwidth)
    if q.scales is not None:
        return Encoding(dtype=q.encoding, scale=q.scales, zero_point=q.zero_points, axis=q.axis, bits=q.bitwidth,
                        block_size=(q.block_size[0] if q.block_size else None))
    return Encoding(dtype=q.encoding)


def _tensor(t) -> TensorSpec:
    dtype, bits = _QNN_DTYPES.get(t.dtype, (t.dtype, None))
    enc = _encoding(t.quantization)
    if enc is not None:
        enc.dtype = dtype
        enc.bits = enc.bits or bits
    return TensorSpec(name=t.name, shape=list(t.shape), dtype=dtype, encoding=enc)


def read_back(bin_path: Path, soc: SoC) -> Any:
    """The binary's own account of itself; refuses one built for another SoC than asked."""
    from ...toolchain.qnn_context import read_context_binary
    from ...toolchain.native_io import native_stdout_to_stderr
    with native_stdout_to_stderr():
        info = read_context_binary(bin_path)
    if info.soc_model is not None and info.soc_model != soc.soc_model:
        raise ToolchainError(f"the context binary built for {soc.name} names soc_model {info.soc_model}, not {soc.soc_model}",
                             "report this as a bug: the QNN EP ignored the soc_model option")
    return info


@backend("ort_qnn", kinds=("onnx",), description="ONNX Runtime QNN EP: QDQ quantization, EPContext models and context binaries")
def compile_onnx(parts: list[PartSpec], out: str | Path, options: CompileOptions | None = None, force: bool = False,
                 progress: Callable[[str, float, float], None] | None = None) -> Any:
    """Compile every part for every target into one bundle at `out`; returns the opened Bundle."""
    opts = options or CompileOptions()
    report = progress or (lambda msg, done, total: None)
    t_start = time.perf_counter()
    out = Path(out)
    check_output(out, force)                     # before any work: an existing output needs --force
    if opts.output_format not in FORMATS:
        raise InputError(f"unknown format {opts.output_format!r}", f"choose one of: {', '.join(FORMATS)}")
    if not opts.targets:
        raise InputError("no target given", "pass --target SM8650 (see `modelexport targets`)")
    socs: list[SoC] = []
    for t in opts.targets:
        soc = get_target(t)
        if soc not in socs:
            socs.append(soc)
    check_knobs(socs, opts.vtcm_mb, opts.optimization_level)
    if not parts:
        raise InputError("no model given", "pass one or more .onnx files")
    prepared = _prepare_parts(parts, opts, socs)
    if opts.overrides:                           # --override 'REGEX=PRECISION': checked before any heavy work
        from ...quant.onnx_overrides import parse_onnx_overrides
        for p in prepared:
            parse_onnx_overrides(opts.overrides, p.precision)
    from ...toolchain.qairt import find_qairt
    import onnxruntime
    qairt = find_qairt()
    cache = Cache(enabled=opts.use_cache)
    n_steps = len(prepared) + len(prepared) * (1 if opts.output_format == "dlc" else len(socs))
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
    # 2. one compile job per part and target (one per part for a DLC: it is not target-specific)
    jobs = []
    for p in prepared:
        model_path = p.work["qdq"] or p.work["float"]
        model_sha = _sha_file(model_path)
        for soc in (socs[:1] if opts.output_format == "dlc" else socs):
            popts = compile_provider_options(soc, opts.vtcm_mb, opts.optimization_level)
            key = cache_key("ctx", model_sha, popts, opts.output_format, qairt.build_id, onnxruntime.__version__, p.name)
            jobs.append({"part": p.name, "target": soc.name, "model_path": str(model_path), "provider_options": popts,
                         "format": opts.output_format, "key": key, "cache_root": str(cache.root),
                         "cache_enabled": cache.enabled})
    pending = [j for j in jobs if not cache.get("ctx", j["key"])]
    workers = min(len(pending), opts.jobs or os.cpu_count() or 1)
    report(f"compiling {len(jobs)} graph(s) for {', '.join(s.name for s in socs)}"
           + (f" ({workers} in parallel)" if workers > 1 else ""), done, n_steps)
    t0 = time.perf_counter()

    def on_done(res: dict) -> None:
        nonlocal done
        done += 1
        report(f"compiled {res.get('meta', {}).get('part', '?')} for {res.get('meta', {}).get('target', '?')}", done, n_steps)
    results = _run_jobs(jobs, workers, on_done)
    timings["compile_s"] = round(time.perf_counter() - t0, 3)
    temp_entries = []
    try:
        for r in results:
            if "error" in r:
                _raise_error(r["error"])
            if not cache.enabled:
                temp_entries.append(Path(r["entry"]))
        return _write_bundle(out, force, prepared, socs, jobs, results, opts, qairt, cache, timings, t_start)
    finally:
        for t in temp_entries:
            shutil.rmtree(t, ignore_errors=True)
        if not cache.enabled:
            for p in prepared:
                if p.work.get("qdq_entry"):
                    shutil.rmtree(p.work["qdq_entry"], ignore_errors=True)


def _write_bundle(out, force, prepared, socs, jobs, results, opts, qairt, cache, timings, t_start):
    import onnx
    by_part = {p.name: p for p in prepared}
    # strictness and placement, before anything is written
    placement: dict[str, dict] = {}
    strict_failures = []
    for job, r in zip(jobs, results):
        p = by_part[job["part"]]
        ins = {i.name for i in p.loaded.inputs}
        outs = {o.name for o in p.loaded.outputs}
        meta = r["meta"]
        fb = _fallbacks(meta["placement"], ins, outs)
        on_htp = len(meta["placement"].get("QNNExecutionProvider", []))
        placement.setdefault(p.name, {})[job["target"]] = {
            "htp_nodes": on_htp, "cpu_fallbacks": [{"name": n, "op_type": o} for n, o in fb],
            "cpu_io_quantization": len(meta["placement"].get(CPU_EP_NAME, [])) - len(fb)}
        if fb:
            strict_failures.append(f"{p.name} on {job['target']}: " + ", ".join(f"{n} ({o})" for n, o in fb[:8])
                                   + (" ..." if len(fb) > 8 else ""))
    if opts.strict and strict_failures:
        raise StrictFallbackError("--strict: nodes fell back to the CPU: " + "; ".join(strict_failures),
                               "run `modelexport audit MODEL --target ...` for the reasons and fixes, or drop --strict")
    with BundleWriter(out, force) as w:
        m = w.manifest
        m.kind = BundleKind.MODEL
        m.format = Format(opts.output_format)
        m.targets = [s.name for s in socs]
        precisions = {p.precision.name for p in prepared}
        m.precision = precisions.pop() if len(precisions) == 1 else "mixed"
        first = prepared[0].loaded
        m.source = SourceModel(path=str(first.path) if first.path else None, sha256=first.sha256, format="onnx",
                               description=None if len(prepared) == 1 else f"{len(prepared)} models: " + ", ".join(by_part))
        m.options = {"optimization_level": opts.optimization_level, "vtcm_mb": opts.vtcm_mb, "per_channel": opts.per_channel,
                     "strict": opts.strict, "embed_mode": 0, "offload_graph_io_quantization": 1,
                     "provider_options": {}, "backend": "ort_qnn"}
        for p in prepared:
            rel = p.name
            files = PartFiles(float_model=w.add_file(p.work["float"], f"{rel}/model.onnx", role=Role.FLOAT_MODEL))
            if p.work["qdq"]:
                files.quantized_model = w.add_file(p.work["qdq"], f"{rel}/model.qdq.onnx", role=Role.QUANTIZED_MODEL)
            samples = p.verify_inputs.samples[:VERIFY_SAMPLES]
            vpath = w.path(f"{rel}/verify_inputs.npz", role=Role.VERIFY_INPUTS)
            with open(vpath, "wb") as f:
                np.savez(f, **{f"{k}__{i}": v for i, s in enumerate(samples) for k, v in s.items()})
            files.verify_inputs = f"{rel}/verify_inputs.npz"
            m.calibration[p.name] = (p.calibration.describe() if p.calibration else {"kind": "none", "note": "fp16 needs no calibration"}) \
                | {"verify_inputs": {"samples": len(samples), "kind": p.verify_inputs.kind, "representative": p.verify_inputs.representative}}
            m.parts.append(PartEntry(
                name=p.name, source=str(p.loaded.path) if p.loaded.path else None, sha256=p.loaded.sha256,
                precision=p.precision.name, inputs=[TensorSpec(**i.to_dict()) for i in p.loaded.inputs],
                outputs=[TensorSpec(**o.to_dict()) for o in p.loaded.outputs], fixed_shapes=p.loaded.fixed_shapes,
                quantization=p.work["qmeta"].get("quantization"), files=files,
                cache_hit={"quantize": p.work["quant_cache_hit"]}))
        build_ids = set()
        for job, r in zip(jobs, results):
            entry, meta = Path(r["entry"]), r["meta"]
            p, soc = by_part[job["part"]], get_target(job["target"])
            m.options["provider_options"][job["target"]] = meta["provider_options"]
            m.part(p.name).cache_hit[job["target"]] = r["hit"]
            timings[f"{p.name}.{job['target']}.compile_s"] = meta["compile_seconds"]
            if opts.output_format == "dlc":
                for key, name in meta["files"].items():
                    if key.startswith("dlc_"):
                        rel = w.add_file(entry / name, f"{p.name}/{name}", role=Role.DLC)
                qdq = onnx.load(str(p.work["qdq"] or p.work["float"]), load_external_data=False)
                m.graphs.append(GraphSpec(name=p.name, file=f"{p.name}/{meta['files']['dlc']}", kind=GraphKind.DLC,
                                          inputs=[TensorSpec(**i.to_dict()) for i in p.loaded.inputs],
                                          outputs=[TensorSpec(**o.to_dict()) for o in p.loaded.outputs],
                                          part=p.name, nodes=len(qdq.graph.node)))
                continue
            tdir = f"{p.name}/{soc.name}"
            ctx_rel = w.add_file(entry / meta["files"]["epcontext"], f"{tdir}/{meta['files']['epcontext']}", role=Role.EPCONTEXT_MODEL)
            for b in meta["files"]["context_binaries"]:
                w.add_file(entry / b, f"{tdir}/{b}", role=Role.CONTEXT_BINARY)
            bin_rel = f"{tdir}/{meta['files']['context_binary']}"
            info = read_back(entry / meta["files"]["context_binary"], soc)
            build_ids.add(info.build_id)
            m.htp_arch[soc.name] = info.dsp_arch
            for g in info.graphs:
                htp = g.htp
                m.graphs.append(GraphSpec(
                    name=g.name, file=bin_rel, kind=GraphKind.CONTEXT_BINARY, target=soc.name, htp_arch=info.dsp_arch,
                    inputs=[_tensor(t) for t in g.inputs], outputs=[_tensor(t) for t in g.outputs],
                    part=p.name, epcontext_model=ctx_rel, soc_model=info.soc_model,
                    vtcm_mb=htp.vtcm_mb if htp else None,
                    optimization_level=htp.optimization_level if htp else None,
                    spill_fill_bytes=htp.spill_fill_buffer_size if htp else None,
                    const_bytes=htp.const_size if htp else None,
                    onnx_inputs=[TensorSpec(**i.to_dict()) for i in p.loaded.inputs],
                    onnx_outputs=[TensorSpec(**o.to_dict()) for o in p.loaded.outputs]))
        if len(build_ids) > 1:
            raise ToolchainError(f"binaries of one bundle name different QAIRT builds {sorted(build_ids)}",
                                 "clear the cache (MODELEXPORT_CACHE_DIR) and compile again")
        m.qairt_build = build_ids.pop() if build_ids else qairt.build_id
        m.placement = placement | {"nodes": _node_rows(jobs[0], results[0], by_part)}
        timings["total_s"] = round(time.perf_counter() - t_start, 3)
        m.timings = Timings.model_validate(timings)
        m.cache = CacheInfo(enabled=cache.enabled, root=str(cache.root) if cache.enabled else None,
                            hits=sum(1 for r in results if r["hit"]) + sum(1 for p in prepared if p.work["quant_cache_hit"]),
                            misses=sum(1 for r in results if not r["hit"]) + sum(1 for p in prepared if not p.work["quant_cache_hit"]))
        m.qairt = QairtInfo(source=qairt.source, version=qairt.version, core_api=qairt.core_api, htp_api=qairt.htp_api)
        if opts.output_format == "dlc":
            m.dlc_note = ("DLC dumped by the QNN EP through libQnnIr.so: a target-independent QNN IR container "
                          "(for qnn-context-binary-generator / qnn-net-run); run/verify need a context-binary bundle")
    return open_bundle(out)
