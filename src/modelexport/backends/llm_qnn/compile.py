"""LLM (GGUF file or HF folder) → static decoder variants → 16a4w QDQ → one weight-shared QNN
context binary per part for devices, plus an unshared twin per graph for the host simulator.

    modelexport compile SmolLM2.gguf --target SM8650 --precision 16a4w --variants ar1,ar32 \
        --max-seq-len 512 [--calibration text.txt] [--override 'lm_head=16a4w'] -o OUT

The recipe up to the quantized graphs is llm/export/'s (the plan, the calibration, the 4-bit
weights, the graphs); this package lowers them and writes the bundle. `--executorch-program` (or
`--format pte`, backend `llm_pte`) adds, per target, the ExecuTorch program qnn_llama_runner runs,
built from the bundle's own binaries (executorch_runner.py).
Stages, each cached by content (source sha256 + options + ONNX Runtime / QAIRT builds):
1. `llm-qdq` (llm/export/graphs.py): load the model, export every (variant, part) to ONNX, calibrate
   on real text run through the float decoder, quantize (16-bit activations, 4-bit weights).
   Also holds the tokenizer. A hit skips loading the model at all.
2. `llm-ctx-shared`: per target and part, all variants compiled in one child process with
   `ep.share_ep_contexts` → one `_ctx_qnn.bin` (weights once).
3. `ctx`: per target, variant and part, the same QDQ graph compiled alone (the simulator cannot
   load weight-shared binaries; numerics run on these twins).

Graph names (AI Hub's scheme, llm/export/graphs.graph_name): `{type}_ar{N}_cl{C}_{i}_of_{n}`. The QNN
EP names the graphs inside the binary itself (`QNNExecutionProvider_QNNExecutionProvider_<hash>_1_0`);
the manifest maps each documented name to it. Parts of a split decoder are compiled from paths that
make those names sort in part order, which is how Genie orders them (toolchain/qnn_graph_order.py).
"""
from __future__ import annotations

import shutil
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable


from ...core.atomic import check_output
from .. import backend
from ...toolchain.htp_options import compile_provider_options, host_twin_provider_options
from ..spec import LlmCompileOptions, PartSpec, max_seq_len_of, vision_flags_given
from ...core.cache import Cache, cache_key, cache_root
from ...core.errors import InputError, ModelExportError, UnsupportedError
from ...core.files import sha256_onnx
from ...core.targets import SoC
from ...core.vocab import Format
from ...frontends.vlm_folder import is_vlm_folder
from ...llm.export.estimate import fitted_estimate
from ...llm.export.memory import host_part_mb
from ...llm.export.plan import LlmPlan, resolve_plan
from ...llm.export.stage_key import QDQ_NAMESPACE, qdq_keys
from ...llm.job_estimate import check_machine
from ...toolchain.qairt import find_qairt
from ...toolchain.qnn_graph_order import ORDER_SCHEME
from ...quant.llm_graphs import LLM_DEFAULT_PRECISION, LLM_OFFERED
from ...quant.precision import min_sqnr_option, pass_mark
from ..ort_qnn import worker as ort_qnn_worker
from .ctx_compile import ContextCompile
from .ctx_jobs import SHARED_NAMESPACE, compile_shared
from .vlm import compile_vlm
from .geniex import check_request as geniex_request
from .write import LlmRun, QdqEntry, write_bundle


def _refuse_vision_flags(opts: LlmCompileOptions) -> None:
    """A text LLM without --vision-encoder: the vision flags would be silently ignored."""
    for flag in vision_flags_given(opts):   # --vision-encoder itself makes it a VLM compile before this
        raise InputError(f"{flag} is for vision-language models; this model has no vision part",
                         f"leave {flag} out, or add --vision-encoder ENCODER.onnx to give it one")


def _resolve(spec: PartSpec, opts: LlmCompileOptions) -> LlmPlan:
    return resolve_plan(spec, opts, max_seq_len_of)


def plan_llm(model: str | Path, precision: str | None = None, **options) -> dict:
    """`compile --dry-run`: the parts and the host memory and disk estimate, checked against this
    machine (the refusal `compile` would give is reported, not raised). Nothing is loaded or written."""
    known = {f.name for f in fields(LlmCompileOptions)}
    opts = LlmCompileOptions(**{k: v for k, v in options.items() if k in known and v not in (None, [], ())})
    if is_vlm_folder(model) or opts.vision_encoder is not None:
        raise InputError(f"{model}: --dry-run plans text LLMs; this is a vision-language model",
                         "leave --dry-run out to compile it")
    _refuse_vision_flags(opts)
    r = _resolve(PartSpec(model=str(model), precision=precision or LLM_DEFAULT_PRECISION,
                          calibration=options.get("calibration")), opts)
    est, r, jobs_note = fitted_estimate(r, quantized=False)
    if est is None:
        raise InputError(f"{model}: its config names no decoder shape (hidden_size, num_hidden_layers, ...)",
                         "compile it without --dry-run")
    report = {"model": str(model), "architecture": r.facts.architecture, "precision": r.requested,
              "variants": [f"ar{n}" for n in r.variants], "max_seq_len": r.max_seq_len,
              "context_lengths": list(r.lengths), "context_limit_mb": r.limit_mb,
              "host_part_mb": host_part_mb(r.limit_mb), "host_chunk_mb": r.chunk_mb, "jobs": r.jobs, "jobs_note": jobs_note, "weights_held_as": r.facts.weights_dtype}
    try:
        check_machine(est, cache_root(), r.limit_mb, r.jobs)
        report["fits"], report["refusal"] = True, None
    except ModelExportError as e:
        report["fits"], report["refusal"] = False, str(e)
    report["estimate"] = est.to_dict()
    return report


PRECISIONS = LLM_OFFERED


# Block-wise 4-bit weights by default: per-channel 4-bit loses too much (SmolLM2 stops answering).
@backend("llm_qnn", kinds=("llm",), description="LLM → static ar-N decoders, 16a4w QDQ, weight-shared QNN context binaries + Genie config",
         formats=("context-binary",), options=LlmCompileOptions, default_precision=LLM_DEFAULT_PRECISION,
         precisions=PRECISIONS)
def compile_llm(parts: list[PartSpec], out: str | Path, options: LlmCompileOptions | None = None, force: bool = False,
                progress: Callable[[str, float, float], None] | None = None) -> Any:
    opts = options or LlmCompileOptions()
    say = progress or (lambda msg, done, total: None)
    t_start = time.perf_counter()
    out = Path(out)
    check_output(out, force)
    if len(parts) != 1:
        raise InputError("one LLM per bundle", "compile each model into its own bundle")
    spec = parts[0]
    if opts.executorch_program:
        _check_runner_request(spec, opts)
    if (is_vlm_folder(spec.model) or opts.vision_encoder is not None) and (opts.positions or "ids") != "ids":
        raise UnsupportedError("--positions cos-sin is for text LLMs", "leave --positions out")
    if (is_vlm_folder(spec.model) or opts.vision_encoder is not None) and opts.lora:
        raise UnsupportedError("--lora is for text LLMs; this is a vision-language model",
                               "merge the adapter into the model (peft's merge_and_unload) and compile that")
    if (is_vlm_folder(spec.model) or opts.vision_encoder is not None) and opts.context_lengths is not None:
        raise UnsupportedError("--context-lengths is for text LLMs; a vision-language model's decoder has one context",
                               "leave --context-lengths out and give the context with --max-seq-len")
    if is_vlm_folder(spec.model) or opts.vision_encoder is not None:   # a vision part beside the text decoder (vlm.py)
        return compile_vlm(spec, out, opts, force, say, lambda *a: compile_llm([a[0]], *a[1:]))
    _refuse_vision_flags(opts)
    plan = _resolve(spec, opts)
    if opts.geniex:
        geniex_request(opts, list(plan.variants), plan.max_seq_len)
    mark = pass_mark(min_sqnr_option(opts.min_sqnr), plan.requested_precision)   # checked before any weight loads
    qairt = find_qairt()
    cache = Cache(enabled=opts.use_cache)
    timings: dict[str, Any] = {}
    plan, qdq = _quantized_graphs(plan, cache, opts.image_calibration, say, timings)
    jobs = _context_jobs(plan, opts, qdq, qairt, cache)
    run = LlmRun(qairt, cache, timings, t_start, opts.executorch_program, opts.geniex, mark, opts.strict_numerics)
    compiling = ContextCompile(jobs, plan, cache, say, timings)
    try:
        with compiling:
            return write_bundle(out, force, plan, qdq, compiling, run, say)
    finally:
        if not cache.enabled:   # every job's entry is a temporary folder then
            for t in compiling.entries():
                shutil.rmtree(t, ignore_errors=True)
            shutil.rmtree(qdq.entry, ignore_errors=True)


# `--format pte` of an LLM: the same bundle with the ExecuTorch program (`--executorch-program`).
@backend("llm_pte", kinds=("llm",), formats=("pte",), options=LlmCompileOptions, default_precision=LLM_DEFAULT_PRECISION,
         precisions=PRECISIONS, only_by_format=True,
         description="LLM → the context-binary bundle (llm_qnn's) plus, per target, the ExecuTorch .pte "
                     "qnn_llama_runner runs, built from the bundle's own binaries")
def compile_llm_pte(parts: list[PartSpec], out: str | Path, options: LlmCompileOptions | None = None,
                    force: bool = False, progress: Callable[[str, float, float], None] | None = None) -> Any:
    opts = options or LlmCompileOptions()
    if parts:   # the refusals compile_llm would give for --executorch-program, named by this spelling
        _check_runner_request(parts[0], opts, "--format pte")
    return compile_llm(parts, out, replace(opts, output_format=Format.CONTEXT_BINARY, executorch_program=True),
                       force, progress)


def _check_runner_request(spec: PartSpec, opts: LlmCompileOptions, flag: str = "--executorch-program") -> None:
    """qnn_llama_runner feeds token ids to a text decoder: said before any work, naming the `flag` given."""
    if is_vlm_folder(spec.model) or opts.vision_encoder is not None:
        raise UnsupportedError(f"{flag} builds text LLMs for qnn_llama_runner; this is a vision-language "
                               "model", f"leave {flag} out: Genie and ONNX Runtime run the bundle")
    if (opts.inputs or "tokens") != "tokens":
        raise UnsupportedError(f"{flag}: qnn_llama_runner feeds token ids, not --inputs {opts.inputs}",
                               f"leave --inputs out (token ids), or leave {flag} out")
    if opts.context_lengths is not None:
        raise UnsupportedError(f"{flag}: qnn_llama_runner runs one context length (it reads it from the mask's shape)",
                               f"leave --context-lengths out (give the context with --max-seq-len), or leave {flag} out: "
                               "Genie and --backend htp-sim move between the lengths")
    if (opts.positions or "ids") != "ids":
        raise UnsupportedError(f"{flag}: qnn_llama_runner feeds position ids, not --positions {opts.positions}",
                               f"leave --positions out, or leave {flag} out: Genie and ONNX Runtime run cos/sin graphs")
    if opts.lora:
        raise UnsupportedError(f"{flag}: qnn_llama_runner feeds no LoRA inputs", f"leave --lora or {flag} out "
                               "(Genie's and ONNX Runtime's loops run the bundle's graphs; --backend htp-sim applies adapters)")


def _quantized_graphs(plan: LlmPlan, cache: Cache, image_calibration: str | None, say,
                      timings: dict) -> tuple[LlmPlan, QdqEntry]:
    """1. The QDQ graphs (llm/export/graphs.py), from the cache or built; checked against the machine's
    memory first (→ the plan with the workers that fit)."""
    keys = qdq_keys(plan, image_calibration)
    t0 = time.perf_counter()
    say("checking the cache", 0, 4)
    est, plan, jobs_note = fitted_estimate(plan, quantized=cache.get(QDQ_NAMESPACE, keys.joined) is not None)
    if jobs_note:
        say(jobs_note, 0, 4)
    if est is not None:   # refused here, before any weight is loaded, rather than killed half-way
        check_machine(est, cache.root, plan.limit_mb, plan.jobs)
        say(f"plan: {est.n_parts} part{'s' if est.n_parts > 1 else ''}, about {est.peak_bytes / 2**30:.1f} GB of "
            f"memory at the peak and {est.disk_bytes / 2**30:.1f} GB of disk (estimated)", 0, 4)

    def build(tmp: Path) -> dict:
        from ...llm.export.graphs import QdqJob, build_qdq   # torch: not on a cache hit
        return build_qdq(QdqJob(plan, tmp, cache, keys.chunks, lambda m: say(m, 1, 4), image_calibration))
    entry, hit = cache.get_or_create(QDQ_NAMESPACE, keys.joined, build)
    timings["quantize_stage_s"] = round(time.perf_counter() - t0, 3)
    return plan, QdqEntry(entry, hit, Cache.meta(entry), est.to_dict() if est is not None else None)


def _context_jobs(plan: LlmPlan, opts: LlmCompileOptions, qdq: QdqEntry, qairt, cache: Cache) -> list[tuple[Callable, dict]]:
    """2 + 3. Per target: each part's weight-shared binary, a host twin per graph, the embedder's."""
    import onnxruntime   # its version keys the binaries

    graphs, n_parts, qentry = qdq.meta["graphs"], len(qdq.meta["parts"]), qdq.entry
    shas = {g["name"]: sha256_onnx(qentry / g["qdq"]) for g in graphs}
    jobs: list[tuple[Callable, dict]] = []
    for soc in plan.socs:
        popts = compile_provider_options(soc, opts.vtcm_mb, opts.optimization_level)
        for p in range(1, n_parts + 1):
            # the arN graphs share one binary; the full-context graph gets its own (Genie refuses a binary
            # holding a graph without the past_ cache group: "Invalid cache-group prefix detected: past_")
            for full in (False, True):
                members = [g for g in graphs if g["part"] == p and (g["n_tokens"] == plan.max_seq_len) == full]
                if not members:
                    continue
                key = cache_key(SHARED_NAMESPACE, [shas[g["name"]] for g in members], popts, qairt.build_id,
                                onnxruntime.__version__, *([ORDER_SCHEME, p, n_parts] if n_parts > 1 else []))
                jobs.append((compile_shared, {"kind": "shared", "part": p, "n_parts": n_parts, "target": soc.name,
                                              "provider_options": popts, "full_context": full,
                                              "models": [(g["name"], str(qentry / g["qdq"])) for g in members],
                                              "key": key, "cache_root": str(cache.root), "cache_enabled": cache.enabled}))
        for g in graphs:
            model = ort_qnn_worker.ModelFile(qentry / g["qdq"], shas[g["name"]])
            twin = ort_qnn_worker.compile_job_for(g["name"], soc.name, model, host_twin_provider_options(popts),
                                                  "context-binary", qairt.build_id, cache,
                                                  graph_order=(g["part"], n_parts) if n_parts > 1 else None)
            jobs.append((ort_qnn_worker.compile_job, {"kind": "twin", "graph": g["name"], **twin}))
        jobs += _embedder_jobs(qdq.meta.get("embedder"), qentry, soc, popts, qairt, cache)
    return jobs


def _embedder_jobs(embedder: dict | None, qentry: Path, soc: SoC, popts: dict, qairt, cache: Cache) -> list:
    """The embedder part's compile jobs for one target: its graphs in one weight-shared binary, and a
    host twin per graph (role "embedder": _write_bundle keeps them out of the decoder's records)."""
    if not embedder:
        return []
    import onnxruntime   # its version keys the binaries

    gs = embedder["graphs"]
    shas = {g["name"]: sha256_onnx(qentry / g["graph"]) for g in gs}
    key = cache_key(SHARED_NAMESPACE, [shas[g["name"]] for g in gs], popts, qairt.build_id, onnxruntime.__version__)
    jobs: list = [(compile_shared, {"kind": "shared", "role": "embedder", "part": "embedder", "n_parts": 1,
                                    "target": soc.name, "provider_options": popts,
                                    "models": [(g["name"], str(qentry / g["graph"])) for g in gs],
                                    "key": key, "cache_root": str(cache.root), "cache_enabled": cache.enabled})]
    for g in gs:
        model = ort_qnn_worker.ModelFile(qentry / g["graph"], shas[g["name"]])
        twin = ort_qnn_worker.compile_job_for(g["name"], soc.name, model, host_twin_provider_options(popts),
                                              "context-binary", qairt.build_id, cache)
        jobs.append((ort_qnn_worker.compile_job, {"kind": "twin", "role": "embedder", "graph": g["name"], **twin}))
    return jobs
