"""PyTorch → ExecuTorch `.pte` with the QNN delegate (HTP), XNNPACK for what QNN refuses.

Per part (one model) and target: load → torch.export → opt-in rewrites → QnnQuantizer with the
precision (+ per-module overrides, block-wise 4-bit) and calibration → QNN's passes and the
explaining QNN partitioner, then XNNPACK's → to_executorch with delegate segments extracted and
aligned for mmap. The bundle holds the .pte, the float reference (`float.pt2`) and the verify
inputs; the manifest has per method the IO (with the encodings of the embedded QNN graphs, read
back through libQnnSystem.so), the target/HTP arch/QAIRT build the binaries name, the placement
of every node (QNN, XNNPACK or portable, with the reason) and the numerics on the simulator.
Lowering results are cached by content (the exported graph and weights, the options, the
calibration data, the toolchain versions).
"""
from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...contract import GraphSpec, TensorSpec, open_bundle
from ...core.atomic import check_output
from ...contract.manifest import Delegate, PartEntry, PartFiles, QairtInfo, QnnGraph, SourceModel
from ...core.numerics_advice import numerics_failures, numerics_fix
from ...core.vocab import BundleKind, Format, GraphKind, Role
from ...core.cache import Cache, cache_key
from ...core.errors import InputError, ModelExportError, StrictNumericsError, ToolchainError, UnsupportedError
from ...core.targets import SoC, get_target
from ...quant.precision import get_precision
from ...quant.pt2e_qnn import RECIPE, soc_scope
from .. import backend
from ..assembler import BundleAssembler, assemble, graph_io, htp_facts, one_precision, refuse_fallbacks
from ..spec import CompileOptions, PartSpec, TorchCompileOptions, part_name
from .inspect import qnn_binaries, read_pte
from .lower import SEGMENT_ALIGNMENT, delegation_summary, lower, lowering_error, placement, to_pte
from .pipeline import QUANTIZED_NAMESPACE, PrepareOptions, prepare
from .run import PteGraph, PteSession, compare_outputs, eager_outputs
from .specs import qnn_ready

FORMATS = ("pte",)
FALLBACKS = ("xnnpack", "portable")
NUMERICS_SAMPLES = 2
CACHE_NAMESPACE = "pte"


def graph_fingerprint(exported) -> str:
    """sha256 over the exported graph's code and every weight, buffer and constant byte."""
    import torch
    h = hashlib.sha256(exported.graph_module.code.encode())
    h.update(str(exported.call_spec.in_spec).encode())
    named = {**exported.state_dict, **{f"const:{k}": v for k, v in exported.constants.items()}}
    for k in sorted(named):
        v = named[k]
        h.update(k.encode())
        if isinstance(v, torch.Tensor):
            t = v.detach().contiguous().cpu()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def _name_base(spec: PartSpec, loaded) -> str:
    """The user's name, else the source file's stem, else the module's class."""
    if spec.name:
        return spec.name
    if isinstance(loaded.source, str) and not loaded.source.startswith("<"):
        return Path(loaded.source.split(":")[0]).stem
    return type(loaded.module).__name__.lower()


def quantized_key(prep, fingerprint: str, state) -> str | None:
    """The cache key of a part's quantized program: what determines it, without the target
    (pt2e_qnn.soc_scope: the quantizer reads nothing of the SoC here). None for fp16."""
    if not prep.precision.quantized:
        return None
    import executorch
    import torch
    import torchao

    return cache_key(QUANTIZED_NAMESPACE, fingerprint, prep.plan.key(), RECIPE, prep.rewrites,
                     [i.to_dict() for i in prep.inputs], prep.mutable_buffers, prep.calibration.digest(),
                     soc_scope(prep.soc), getattr(executorch, "__version__", "?"), torch.__version__,
                     torchao.__version__, state.qairt_build)


def _lower_entry(prep, soc: SoC, fallback: str, alignment: int, cache: Cache, key: str,
                 report: Callable[[str], None], quant_key: str | None = None) -> tuple[Path, dict, bool]:
    """The cache entry holding model.pte and meta.json (placement, timings) for one target. The
    quantized program it lowers is an entry of its own (`quant_key`), shared by every target."""

    def build(tmp: Path) -> dict:
        t0 = time.perf_counter()
        report(f"quantizing ({prep.precision.name})" if prep.precision.quantized else "preparing (fp16)")
        graph = prep.lowerable(cache if cache.enabled else None, quant_key)
        if prep.quantize_hit:
            report("the quantized program came from the cache")
        t_quant = time.perf_counter() - t0
        report(f"lowering to QNN for {soc.name}" + (" + XNNPACK" if fallback == "xnnpack" else ""))
        t1 = time.perf_counter()
        try:
            low = lower(graph, prep.lower_inputs(soc), fallback=fallback)
            rows = placement(low.edge, low.decisions)
            t2 = time.perf_counter()
            report("writing the .pte (delegate segments aligned for mmap)")
            et_program = to_pte(low.edge, alignment, low.mutable_buffers)
        except ModelExportError:
            raise
        except Exception as e:
            raise lowering_error(e) from None
        (tmp / "model.pte").write_bytes(et_program.buffer)
        t3 = time.perf_counter()
        report("checking the numerics on the HTP simulator")
        numerics = _numerics(tmp / "model.pte", prep, get_precision(prep.precision.name).min_sqnr_db)
        return {"placement": rows, "summary": delegation_summary(rows), "segment_alignment": alignment,
                "quantize_s": round(t_quant, 3), "lower_s": round(t2 - t1, 3),
                "to_executorch_s": round(t3 - t2, 3), "numerics_s": round(time.perf_counter() - t3, 3),
                "numerics": numerics, "quantization": prep.plan.describe(), "mutable_buffers": low.mutable_buffers}

    entry, hit = cache.get_or_create(CACHE_NAMESPACE, key, build)
    return entry, Cache.meta(entry), hit


def check_numerics(built: dict, preps) -> None:
    """--strict-numerics: refuse (exit 7, nothing written) when compile's own check failed."""
    quantized = {name: p.precision.quantized for _, p, name in preps}
    bad, random, quant = [], False, False
    for (name, target), (_, meta, _) in built.items():
        num = meta.get("numerics") or {}
        if num.get("passed") is False:
            bad.append(f"{name} on {target}: " + ", ".join(numerics_failures(num)))
            random |= "random" in str(num.get("inputs", ""))
            quant |= quantized.get(name, False)
    if bad:
        raise StrictNumericsError("--strict-numerics: the compiled graph differs from the float model on compile's "
                                  "own check: " + "; ".join(bad), numerics_fix(quant, random)
                                  + "; or drop --strict-numerics to keep the bundle and check it yourself")


def _numerics(pte_path: Path, prep, threshold: float) -> dict:
    """Compiled (simulator) vs eager float on the first verify samples: manifest.numerics."""
    names_in = [i.name for i in prep.inputs]
    samples = prep.verify_inputs.samples[:NUMERICS_SAMPLES]
    ref_mod = prep.reference()
    # named from the signature, not from a first eager call: a module with a mutable buffer
    # (a state) must see each sample once, as the .pte does
    names_out = [f"output_{i}" for i in range(len(prep.exported.graph_signature.user_outputs))]
    g = PteGraph("", None, pte_path, prep.precision.name,
                 [{"name": io.name, "shape": list(io.static_shape), "dtype": io.dtype} for io in prep.inputs], names_out)
    refs = {n: [] for n in names_out}
    gots = {n: [] for n in names_out}
    run_s = []
    with PteSession(g) as sess:
        for s in samples:
            ref = eager_outputs(ref_mod, s, names_in, names_out)
            got, dt = sess.run(s)
            run_s.append(round(dt, 4))
            for n in names_out:
                refs[n].append(ref[n])
                gots[n].append(got[n].astype(np.float32))
    checks = compare_outputs(refs, gots, threshold)

    def fin(v):
        return None if v is None or not np.isfinite(v) else v
    return {"outputs": [{"name": c.name, "sqnr_db": fin(c.sqnr_db) if np.isfinite(c.sqnr_db) else 999.0,
                         "cosine": c.cosine, "max_abs_error": c.max_abs_error,
                         **({"argmax_agreement": c.argmax_agreement} if c.argmax_agreement is not None else {})}
                        for c in checks],
            "threshold_db": threshold, "samples": len(samples), "passed": all(c.passed for c in checks),
            "inputs": prep.verify_inputs.kind, "reference": "eager PyTorch (float.pt2)", "runtime": "executorch.runtime on the HTP simulator",
            "load_s": round(sess.load_seconds, 4), "run_s": run_s}


@backend("executorch_qnn", kinds=("torch",), formats=FORMATS, options=TorchCompileOptions,
         description="ExecuTorch: QnnQuantizer, QNN delegate (HTP) + XNNPACK fallback, .pte")
def compile_torch(parts: list[PartSpec], out: str | Path, options: TorchCompileOptions | None = None, force: bool = False,
                  progress: Callable[[str, float, float], None] | None = None) -> Any:
    """Compile every PyTorch part for every target into one bundle at `out` → the opened Bundle."""
    opts = options or TorchCompileOptions()
    say = progress or (lambda msg, done, total: None)
    t_start = time.perf_counter()
    out = Path(out)
    check_output(out, force)
    if opts.output_format not in FORMATS:
        raise InputError(f"a PyTorch model compiles to a .pte, not {opts.output_format!r}",
                         "use --format pte (or leave --format out); ONNX models make context binaries")
    fallback = opts.fallback or "xnnpack"
    if fallback not in FALLBACKS:
        raise InputError(f"unknown fallback {fallback!r}", f"choose one of: {', '.join(FALLBACKS)}")
    socs: list[SoC] = list(dict.fromkeys(get_target(t) for t in opts.targets or ["SM8650"]))
    if not parts:
        raise InputError("no model given", "pass model.py:factory, a .pt2, or an nn.Module with example inputs")
    if opts.dynamic_shapes:
        # Measured with executorch 1.5.1: QNN's validator refuses every node with a dynamic Dim
        # (3110), and the program then fails to emit: QNN's export passes leave symbolic sizes in
        # the views around the XNNPACK partitions, which the emitter cannot write.
        raise UnsupportedError("a .pte with the QNN delegate needs static shapes: the HTP runs static graphs, and the "
                               "CPU fallback of a dynamically shaped graph cannot be emitted here",
                               "leave dynamic_shapes out and compile one program per shape you need (e.g. a prefill and "
                               "a decode size); `modelexport audit` takes dynamic shapes to show what QNN refuses")
    steps = len(parts) * (1 + len(socs))
    done = 0
    preps, taken = [], set()
    for spec in parts:
        if spec.input_shapes:
            raise InputError("--input-shape is for ONNX models", "a PyTorch model's shapes are those of its example inputs")
        say(f"loading and exporting {spec.model if isinstance(spec.model, str) else 'the module'}", done, steps)
        prep = prepare(spec.model, None, socs[0].name, spec.precision, spec.calibration,
                       PrepareOptions(opts.overrides, opts.block_size, opts.rewrites, opts.dynamic_shapes))
        for soc in socs[1:]:
            prep.plan.check_target(soc)
        preps.append((spec, prep, part_name(_name_base(spec, prep.loaded), taken)))
        done += 1
    state = qnn_ready()      # after every input check: a wrong input fails before the toolchain loads
    cache = Cache(enabled=opts.use_cache)
    import executorch
    import torch
    built: dict[tuple[str, str], tuple[Path, dict, bool]] = {}
    temp_entries = []
    try:
        for spec, prep, name in preps:
            fingerprint = graph_fingerprint(prep.exported)
            quant_key = quantized_key(prep, fingerprint, state)
            for soc in socs:
                key = cache_key("pte", fingerprint, prep.plan.key(), RECIPE, prep.rewrites, repr(opts.dynamic_shapes),
                                prep.verify_inputs.digest(), [i.to_dict() for i in prep.inputs], prep.mutable_buffers,
                                prep.calibration.digest() if prep.calibration else None, soc.name, fallback, SEGMENT_ALIGNMENT,
                                getattr(executorch, "__version__", "?"), torch.__version__, state.qairt_build, state.mode)

                def report(msg: str, _soc=soc, _name=name) -> None:
                    say(f"{_name}@{_soc.name}: {msg}", done, steps)
                entry, meta, hit = _lower_entry(prep, soc, fallback, SEGMENT_ALIGNMENT, cache, key, report, quant_key)
                if not cache.enabled:
                    temp_entries.append(entry)
                built[(name, soc.name)] = (entry, meta, hit)
                done += 1
        refuse_fallbacks(opts.strict, {key: [(r["name"], r["op_type"]) for r in meta["placement"] if r["backend"] != "HTP"]
                                       for key, (_, meta, _) in built.items()})
        if opts.strict_numerics:
            check_numerics(built, preps)
        say("writing the bundle", done, steps)
        return _write_bundle(out, force, opts, _Run(socs, fallback, state, cache, t_start), preps, built)
    finally:
        for t in temp_entries:
            shutil.rmtree(t, ignore_errors=True)


@dataclass(frozen=True)
class _Run:
    """What the bundle writer records of this compile besides the parts and their programs."""
    socs: list[SoC]
    fallback: str
    state: Any              # specs.qnn_ready(): the adapter mode, the QAIRT build ExecuTorch's QNN pairs with
    cache: Cache
    t_start: float


def _write_bundle(out: Path, force: bool, opts: CompileOptions, run: _Run, preps, built):
    socs, state = run.socs, run.state
    with assemble(out, force, run.t_start) as a:
        first = preps[0][1].loaded
        a.header(BundleKind.MODEL, Format.PTE, socs, one_precision(p.precision.name for _, p, _ in preps),
                 SourceModel(path=first.source, sha256=first.sha256, format="pytorch",
                             description=first.description if len(preps) == 1 else f"{len(preps)} models"))
        a.m.options = {"backend": "executorch_qnn", "fallback": run.fallback, "segment_alignment": SEGMENT_ALIGNMENT,
                       "extract_delegate_segments": True, "strict": opts.strict, "quantization": {},
                       "rewrites": {}, "adapter": state.mode, "pairing": state.pairing}
        timings, numerics = {}, None
        for _, prep, name in preps:
            files = _add_part_files(a, prep, name, built[(name, socs[0].name)][1])
            hits = {}
            for soc in socs:
                entry, meta, hit = built[(name, soc.name)]
                hits[soc.name] = hit
                _add_program(a, prep, name, soc, entry)
                rows = meta["placement"]
                a.place(name, soc.name, {
                    "htp_nodes": sum(1 for r in rows if r["backend"] == "HTP"),
                    "cpu_fallbacks": [{"name": r["name"], "op_type": r["op_type"], "runtime": r["runtime"]}
                                      for r in rows if r["backend"] != "HTP"]})
                timings[f"{name}.{soc.name}"] = {k: meta[k] for k in ("quantize_s", "lower_s", "to_executorch_s", "numerics_s")
                                                 if k in meta}
                if numerics is None:  # the first part and target: compiled (simulator) vs eager float
                    numerics = dict(meta["numerics"], part=name, target=soc.name)
            timings[f"{name}.prepare"] = prep.timings
            a.m.parts.append(PartEntry(name=name, source=prep.loaded.source, sha256=prep.loaded.sha256,
                                       precision=prep.precision.name, inputs=[TensorSpec(**i.to_dict()) for i in prep.inputs],
                                       files=files, cache_hit=hits, rewrites=prep.rewrites))
        a.seal_build(state.qairt_build)
        first_name, first_soc = preps[0][2], socs[0].name
        first_meta = built[(first_name, first_soc)][1]
        a.m.placement = {"nodes": first_meta["placement"], "summary": first_meta["summary"],
                         "of": {"part": first_name, "target": first_soc}, **a.placement}
        a.m.numerics = numerics or {}
        a.record_timings(timings)
        quantized = [p.quantize_hit for _, p, _ in preps if p.quantize_hit is not None]
        a.record_cache(run.cache, [v[2] for v in built.values()], **({"quantize_hit": all(quantized)} if quantized else {}))
        a.m.qairt = QairtInfo(source=state.qairt_source, build=state.qairt_build, pairing=state.pairing)
    return open_bundle(out)


def _add_part_files(a: BundleAssembler, prep, name: str, first_meta: dict) -> PartFiles:
    """The part's float program (float.pt2: verify's reference), its verify inputs, its options."""
    import torch
    torch.export.save(prep.exported, a.w.path(f"{name}/float.pt2", role=Role.FLOAT_MODEL))
    files = PartFiles(float_model=f"{name}/float.pt2")
    files.verify_inputs = a.add_verify_inputs(name, prep.verify_inputs, prep.calibration)
    options = a.m.options
    options["quantization"][name] = first_meta.get("quantization") or prep.plan.describe()
    options["rewrites"][name] = prep.rewrites
    if not prep.precision.quantized:
        options.setdefault("fp16_batch_norms_folded", []).append(name)
    if prep.mutable_buffers:   # written by the program, outside the QNN delegate (lower.py)
        options.setdefault("mutable_buffers", {})[name] = prep.mutable_buffers
    if prep.loaded.input_names:
        options.setdefault("flattened_inputs", {})[name] = prep.loaded.input_names
    return files


def _add_program(a: BundleAssembler, prep, name: str, soc: SoC, entry: Path) -> None:
    """One target's .pte, and a graph per method: its IO, delegates and calls, and the QNN graphs of its
    delegates read back from their context binaries."""
    rel = a.w.add_file(entry / "model.pte", f"{name}/{soc.name}/{name}.pte", role=Role.PTE)
    data = (entry / "model.pte").read_bytes()
    info = read_pte(data)
    for b in info["qnn_binaries"]:
        if b.get("soc_model") is not None and b["soc_model"] != soc.soc_model:
            raise ToolchainError(f"the QNN binary built for {soc.name} names soc_model {b['soc_model']}",
                                 "report this as a bug: the compile spec's SoC was not applied")
        a.m.htp_arch[soc.name] = b.get("dsp_arch") or soc.htp_arch
    qgraphs = [QnnGraph(method=method, graph=g.name, **graph_io(g), **htp_facts(g, "vtcm_mb", "const_bytes"))
               for method, binary in qnn_binaries(data) for g in a.read_back(binary).graphs]
    for meth in info["methods"]:
        ins = [TensorSpec(name=io.name, shape=t["shape"], dtype=t["dtype"]) for io, t in zip(prep.inputs, meth["inputs"])]
        outs = [TensorSpec(name=f"output_{i}", shape=t.get("shape", []), dtype=t.get("dtype", "?"))
                for i, t in enumerate(meth["outputs"])]
        a.m.graphs.append(GraphSpec(
            name=meth["name"], file=rel, kind=GraphKind.PTE_METHOD, target=soc.name, htp_arch=a.m.htp_arch.get(soc.name),
            inputs=ins, outputs=outs, part=name,
            delegates=[Delegate(**{k: d[k] for k in ("backend_id", "location", "offset", "size", "alignment") if k in d})
                       for d in info["delegates"] if d["method"] == meth["name"]],
            delegate_calls=meth["delegate_calls"], kernel_calls=meth["kernel_calls"],
            qnn_graphs=[q for q in qgraphs if q.method == meth["name"]]))
