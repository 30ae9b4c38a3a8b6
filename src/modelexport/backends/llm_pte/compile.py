"""`compile LLM --format pte`: one `.pte` per SoC, decode (`kv_forward`, ar1) and prefill (`prefill_forward`,
arN) methods over one weight-shared QNN context binary, its unshared host twin, the tokenizer. Checks first;
calibration, variants and 4-bit weights the LLM recipe's (llm/export/: its rounding, `--rounding`,
`--max-ppl-ratio`), as the context-binary path's; quantization `quant.llm_pt2e`. Not cached."""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...contract import open_bundle
from ...contract.manifest import DecoderShape, LlmSection
from ...core.atomic import check_output
from ...core.errors import InputError, UnsupportedError
from ...core.targets import SoC, get_target
from ...core.vocab import BundleKind, Format, Role
from ...frontends.vlm_folder import is_vlm_folder
from ...llm.export.plan import DEFAULT_CALIBRATION_SAMPLES, DEFAULT_VARIANTS, FULL, parse_variants, quality_options
from ...llm.export.source import check_source
from ...llm.export.weights import WeightRequest, plan_weights
from ...llm.model.input_modes import DEFAULT_INPUT_MODE, get_input_mode
from ...llm.model.pte_methods import check_tied, constant_methods, method_graphs, method_name, pte_records
from ...llm.run.pte_numerics import manifest_numerics
from ...llm.run.text import read_text
from ...llm.weight_quality import four_bit_linears, plan_weights as round_weights
from ...quant.block_weights import load_rounded
from ...quant.llm_pt2e import (LLM_PTE_PRECISIONS, MAX_ROPE_GATHER, check_pte_request, llm_quant_plan, quantize_methods,
                               save_converted)
from .. import backend
from ..assembler import BundleAssembler, assemble, llm_source
from ..spec import LlmCompileOptions, PartSpec, max_seq_len_of, vision_flags_given


# One graph per method (ExecuTorch's Qualcomm LLM flow's names). The weight-shared program and its host
# twin differ only in the QNN compile spec (weight sharing on or off): the export, QNN passes, to_edge and
# its transform passes (three quarters of a lowering's time, measured on SmolLM2 cut to 2-4 layers) are
# spec-free, so they run once and only partitioning + QnnBackend preprocess run per spec. Block weights
# need linear as conv2d (QNN refuses block-quantized FullyConnected).
LOWERINGS = {"shared": True, "twin": False}     # {program: QNN weight sharing}


def lower_methods(graphs: dict[str, Any], inputs: dict[str, tuple], soc: SoC, constants: dict[str, Any],
                  block_wise: bool, timings: dict[str, float] | None = None) -> dict[str, bytes]:
    """{"shared": the weight-shared program, "twin": the unshared host twin}, `.pte` bytes each."""
    import copy

    from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner
    from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerContext
    from executorch.exir import ExecutorchBackendConfig

    from ...toolchain.native_io import capture_native_output
    from ..executorch_qnn.lower import SEGMENT_ALIGNMENT, lowering_error
    from ..executorch_qnn.specs import compile_specs
    clock = timings if timings is not None else {}
    out: dict[str, bytes] = {}
    try:
        with capture_native_output() as log:
            t0, c0 = time.perf_counter(), time.process_time()
            edge = edge_program(graphs, inputs, compile_specs(soc, use_fp16=False), constants, block_wise)
            clock["to_edge_s"] = round(time.perf_counter() - t0, 2)
            clock["to_edge_cpu_s"] = round(time.process_time() - c0, 2)
            for i, (name, shared) in enumerate(LOWERINGS.items()):
                t0 = time.perf_counter()
                specs = compile_specs(soc, use_fp16=False, weight_sharing=shared)
                # to_backend may take constants out of the programs it lowers: the last lowering gets the original
                source = edge if i == len(LOWERINGS) - 1 else copy.deepcopy(edge)
                with QnnManagerContext({m: specs for m in graphs}):
                    lowered = source.to_backend({m: QnnPartitioner(specs) for m in graphs})
                program = lowered.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True,
                                                                        segment_alignment=SEGMENT_ALIGNMENT))
                out[name] = program.buffer
                clock[f"lower_{name}_s"] = round(time.perf_counter() - t0, 2)
    except Exception as e:
        e.native_log = log  # type: ignore[attr-defined]
        raise lowering_error(e) from None
    return out


def edge_program(graphs: dict[str, Any], inputs: dict[str, tuple], specs: list, constants: dict[str, Any],
                 block_wise: bool):
    """ExecuTorch's `to_edge_transform_and_lower_to_qnn` up to (not including) partitioning: each method
    exported, QNN's export passes, to_edge keeping the ops QNN wants whole, QNN's to-edge passes.
    Its cost is per node and per pass: some 34 whole-graph re-traces per method through fake tensors
    (3 decompositions, ExecuTorch's edge passes, QNN's), ~450 recompiles of the graph's Python source,
    linear in layers (bench/experiments/llm_pte_stages.py --profile). Two parts add nothing to the program and are cut
    (`EDGE_CUTS`): the re-export is non-strict (the graph is already an exported, quantized aten graph:
    dynamo has nothing to capture; a third of the export's time), and `from_node` provenance is dropped
    between phases too (each pass deep-copies every node's chain, one link longer per pass)."""
    import torch
    from executorch.backends.qualcomm._passes.qnn_pass_manager import get_qnn_pass_manager_cls
    from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner
    from executorch.backends.qualcomm.serialization.qc_schema_serialize import flatbuffer_to_option
    from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerContext
    from executorch.backends.qualcomm.utils.utils import qnn_edge_config
    # private in 1.5.1: the first half of to_edge_transform_and_lower (requirements pin executorch)
    from executorch.exir.program._program import _gen_edge_manager_for_partitioners, lift_constant_tensor_pass
    backend_type = flatbuffer_to_option(specs[0].value).backend_options.backend_type
    cut = EDGE_CUTS["on"]
    aten, passes = {}, {}
    for method, gm in graphs.items():
        _drop_provenance(gm)
        ep = torch.export.export(gm, inputs[method], strict=not cut)
        pm = get_qnn_pass_manager_cls(backend_type)()
        aten[method] = pm.transform_for_export_pipeline(ep)
        if cut:
            _drop_provenance(aten[method].graph_module)
        passes[method] = pm.get_to_edge_transform_passes(ep, compiler_specs=specs, convert_linear_to_conv2d=block_wise)
    with QnnManagerContext({m: specs for m in graphs}):
        edge = _gen_edge_manager_for_partitioners({m: [QnnPartitioner(specs)] for m in graphs}, aten,
                                                  qnn_edge_config(), constants)
        if cut:
            for method in edge.methods:
                _drop_provenance(edge.exported_program(method).graph_module)
        edge = edge.transform(passes)
    for method in edge.methods:
        lift_constant_tensor_pass(edge.exported_program(method))
    return edge


EDGE_CUTS = {"on": True}    # bench/experiments/llm_pte_stages.py --mode after-no-edge-cuts: the code before them


def _drop_provenance(gm) -> None:
    """Each FX pass deep-copies every node's `from_node` provenance chain, which grows by one link per
    pass (quantization's passes included): on SmolLM2 a fifth of the lowering went to those copies."""
    for node in gm.graph.nodes:
        node.meta.pop("from_node", None)


def read_program(data: bytes, methods: list[str]) -> dict:
    from ...llm.model.pte_methods import check_program
    from ..executorch_qnn.inspect import read_pte
    return check_program(read_pte(data), methods)


def _check(parts: list[PartSpec], opts: LlmCompileOptions) -> tuple[PartSpec, str, list[int], int, list[SoC]]:
    """Everything a user can get wrong, before any work."""
    spec = parts[0]
    precision = spec.precision or LLM_PTE_PRECISIONS[0]
    variants = parse_variants(opts.variants if opts.variants is not None else DEFAULT_VARIANTS)
    if get_input_mode(opts.inputs).name != DEFAULT_INPUT_MODE or FULL in variants or opts.embedder_precision:
        raise UnsupportedError("the .pte path builds token-input arN methods only (no --inputs embeddings/both, "
                               "no full-context variant, no embedder part)",
                               "leave --format pte out: the context-binary path (the default) builds them")
    vision = vision_flags_given(opts)
    if vision or is_vlm_folder(spec.model):
        raise UnsupportedError("the .pte path builds text LLMs only: no vision part"
                               + (f" ({', '.join(vision)} given)" if vision else f" ({spec.model} is a vision-language folder)"),
                               "leave --format pte out: the context-binary path (the default) builds vision-language bundles")
    max_seq_len = max_seq_len_of(opts.max_seq_len)
    socs = list(dict.fromkeys(get_target(t) for t in opts.targets or ["SM8650"]))
    check_pte_request(precision, variants, max_seq_len, socs, len(parts), spec.calibration)
    return spec, precision, variants, max_seq_len, socs


@backend("llm_pte", kinds=("llm",), formats=("pte",), options=LlmCompileOptions, default_precision="16a4w_block",
         precisions=LLM_PTE_PRECISIONS, only_by_format=True,
         description="LLM → one .pte per SoC: decode + prefill methods over one weight-shared QNN binary (ExecuTorch)")
def compile_llm_pte(parts: list[PartSpec], out: str | Path, options: LlmCompileOptions | None = None,
                    force: bool = False, progress: Callable[[str, float, float], None] | None = None) -> Any:
    opts = options or LlmCompileOptions()
    say = progress or (lambda msg, done, total: None)
    t_start = time.perf_counter()
    out = Path(out)
    check_output(out, force)
    spec, precision, variants, max_seq_len, socs = _check(parts, opts)
    plan = llm_quant_plan(precision, opts.overrides, opts.block_size)
    facts = check_source(spec.model, max_seq_len)
    text = read_text(spec.calibration)
    quality = quality_options(opts, precision, facts.shape or {})
    built = _build(facts.path, plan, variants, max_seq_len, socs, text,
                   int(opts.calibration_samples or DEFAULT_CALIBRATION_SAMPLES), say, quality, opts)
    try:
        return _write_bundle(out, force, t_start, _Request(facts, text, socs, variants, max_seq_len), built)
    finally:    # the tokenizer and fake-quant graphs were staged outside the bundle
        for d in (built["tok_dir"], built["fake_quant_dir"]):
            shutil.rmtree(d, ignore_errors=True)


def _build(src: Path, plan, variants: list[int], max_seq_len: int, socs: list[SoC], text, n_samples: int, say,
           quality: dict | None = None, opts: LlmCompileOptions | None = None) -> dict:
    import tempfile

    from ...frontends import find_frontend
    from ...llm.run.openers import require_context
    from ...llm.model.static_decoder import StaticDecoderConfig, build_static_decoder, split_rope_lookups
    from ...llm.run.text import tokenize
    from ...llm.run.tokenizers import from_transformers
    from ..executorch_qnn.specs import qnn_ready
    from ...llm.export.calibrate import calibration_samples   # torch
    from .session import load_program
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    say("loading the model", 0, 5)
    require_context(src, max_seq_len)
    llm = find_frontend(str(src)).load(str(src))
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    tok_dir = Path(tempfile.mkdtemp(prefix="llm_pte_tok_"))
    tok.save(tok_dir)
    qnn_ready()
    timings["load_s"] = round(time.perf_counter() - t0, 2)
    say(f"calibrating on {text.path.name} through the float decoder", 1, 5)
    t0 = time.perf_counter()
    kv_ranges: dict[str, list[float]] = {}
    samples = calibration_samples(llm.model, tokenize(tok, text.text, max_seq_len * (n_samples + 2)), variants,
                                  max_seq_len, n_samples, kv_ranges)
    timings["calibration_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    rounded, rounding, plan = _round_weights(llm.model, tok, text, max_seq_len, plan, quality, opts, say)
    timings["weight_plan_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    say(f"quantizing {len(variants)} methods ({plan.precision.name})", 2, 5)
    decs = {method_name(n): build_static_decoder(llm.model, StaticDecoderConfig(n, max_seq_len)) for n in variants}
    for d in decs.values():
        split_rope_lookups(d, MAX_ROPE_GATHER)
    pinned: dict[str, dict] = {}
    graphs, inputs, encodings = quantize_methods(decs, {method_name(n): samples[n] for n in variants}, kv_ranges,
                                                 plan, socs[0], rounded, pinned)
    del rounded
    decoders = {m: (d, samples[d.cfg.n_tokens][0]) for m, d in decs.items()}
    quant_info = {m: {**plan.describe(), **({"rounded_weights": pinned[m]} if m in pinned else {})} for m in decs}
    timings["quantize_s"] = round(time.perf_counter() - t0, 2)
    kv = check_tied(encodings, next(iter(decoders.values()))[0].spec.n_layers)
    spec = decoders[method_name(1)][0].spec
    consts = constant_methods(spec, max_seq_len, max(variants), tok.bos_id, bool(tok.add_bos), list(tok.eos_ids))
    programs: dict[str, dict] = {}
    t0 = time.perf_counter()
    for soc in socs:
        say(f"lowering for {soc.name} (weight-shared program and unshared host twin)", 3, 5)
        steps: dict[str, float] = {}
        built = lower_methods(graphs, inputs, soc, consts, plan.uses_block, steps)
        timings.update({f"{soc.name}.{k}": v for k, v in steps.items()})
        programs[soc.name] = {name: (data, read_program(data, list(graphs))) for name, data in built.items()}
    timings["lower_s"] = round(time.perf_counter() - t0, 2)
    say("the host twin on the simulator and the fake-quant graphs vs float", 4, 5)
    t0 = time.perf_counter()
    numerics = {soc: _numerics(load_program(p["twin"][0]), graphs, decoders) for soc, p in programs.items()}
    timings["twin_check_s"] = round(time.perf_counter() - t0, 2)
    fq_dir = Path(tempfile.mkdtemp(prefix="llm_pte_fq_"))
    for method, gm in graphs.items():
        save_converted(gm, inputs[method], fq_dir / f"{method}.pt2")
    n_params = sum(p.numel() for p in llm.model.parameters())
    rope = getattr(llm.config, "rope_parameters", None) or {}
    return {"programs": programs, "spec": spec, "consts": consts, "kv": kv, "numerics": numerics, "tok_dir": tok_dir,
            "fake_quant_dir": fq_dir, "threshold_db": plan.precision.min_sqnr_db,
            "architecture": llm.architecture, "n_params": int(n_params), "quantization": quant_info,
            "rope_theta": float((rope.get("rope_theta") if isinstance(rope, dict) else None)
                                or getattr(llm.config, "rope_theta", 10000.0)),
            "weight_rounding": rounding, "plan": plan, "bos_id": tok.bos_id, "eos_ids": list(tok.eos_ids), "io": {m: (d.input_names(), d.example_inputs(),
                                                                           d.output_names()) for m, (d, _) in decoders.items()},
            "timings": timings}


def _round_weights(model, tok, text, max_seq_len: int, plan, quality, opts, say):
    """The ONNX path's 4-bit weights (its rounding, chosen as it chooses it: `llm.export.weights.plan_weights`)
    → ({HF module name: BlockWeight}, {"rounding", "recipe"} for the manifest, the plan with any recipe's
    overrides), or
    ({}, None, plan) when the precision has no 4-bit weights. Nearest is computed here too (the ONNX
    path's workers compute it themselves, from the same `quantize_blocks`)."""
    import tempfile

    if not quality:
        return {}, None, plan
    tmp = Path(tempfile.mkdtemp(prefix="llm_pte_rounding_"))
    try:
        weights = plan_weights(model, tok, text, WeightRequest(plan.precision.name, plan.overrides, plan.block_size,
                                                               max_seq_len, quality), tmp, lambda m: say(m, 2, 5))
        if weights.extra_overrides:       # --max-ppl-ratio's recipe
            plan = llm_quant_plan(plan.precision.name, list(weights.extra_overrides) + list(opts.overrides or []),
                                  plan.block_size)
        names = four_bit_linears(model, plan.precision.weight_bits, plan.overrides)
        path = weights.graph_file
        if path is None:            # nearest: what the ONNX path's workers compute from the float weights
            path = round_weights(model, [], min(max_seq_len, 1024), names, "nearest", plan.block_size, tmp / "nearest",
                                 None, lambda m: say(m, 2, 5)).rounded_path
        record = {"rounding": weights.rounding, "recipe": weights.recipe}
        return load_rounded(path, {n: n for n in names}), record, plan
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _numerics(twin_program, graphs: dict, decoders: dict) -> dict:
    """{method: {"A vs B": agreement}} of float, fake-quant and the twin on each method's first calibration sample."""
    from ...llm.run.pte_numerics import compare_stages
    from ...llm.run.pte_session import PteForward
    forwards = {m: {"float": dec, "fake-quant": graphs[m], "htp-sim": PteForward(twin_program, m)}
                for m, (dec, _) in decoders.items()}
    return compare_stages(forwards, {m: [s] for m, (_, s) in decoders.items()},
                          {m: dec.input_names() for m, (dec, _) in decoders.items()})


@dataclass(frozen=True)
class _Request:
    """What was asked (checked by `_check`), as the bundle records it."""
    facts: Any              # llm.export.source.check_source: the GGUF file or HF folder
    text: Any               # the calibration text (llm.run.text.read_text)
    socs: list[SoC]
    variants: list[int]
    max_seq_len: int


def _write_bundle(out: Path, force: bool, t_start: float, req: _Request, built: dict):
    spec, plan, max_seq_len = built["spec"], built["plan"], req.max_seq_len
    with assemble(out, force, t_start) as a:
        a.header(BundleKind.LLM, Format.PTE, req.socs, plan.precision.name,
                 llm_source(req.facts, built["architecture"], built["n_params"]))
        a.m.options = {"backend": "llm_pte", "variants": [f"ar{n}" for n in req.variants], "max_seq_len": max_seq_len,
                       "precision": plan.precision.name, "weight_sharing": True, **plan.key(),
                       "rope_gather": MAX_ROPE_GATHER,
                       "rounding": ((built["weight_rounding"] or {}).get("rounding") or {}).get("method")}
        a.m.calibration = {"llm": {"kind": "text", "representative": True, "text": str(req.text.path),
                                   "sha256": req.text.sha256}}
        a.add_tokenizer(Path(built["tok_dir"]))
        fake_quant = {}
        for method in built["io"]:
            fake_quant[method] = f"qdq/{method}.pt2"
            a.w.add_file(Path(built["fake_quant_dir"]) / f"{method}.pt2", fake_quant[method], role=Role.QUANTIZED_MODEL)
        weight_sharing, ptes = {}, {}
        for soc in req.socs:
            weight_sharing[f"{soc.name}/pte"], ptes[soc.name] = _add_programs(a, soc, req, built, fake_quant)
        device = sum(p.bytes for p in ptes.values()) // len(ptes)
        a.m.parameters = built["n_params"]
        a.m.llm = LlmSection(
            architecture=built["architecture"], spec=DecoderShape(**{k: getattr(spec, k) for k in DecoderShape.model_fields}),
            variants=req.variants, max_seq_len=max_seq_len, n_parts=1, parts=[[0, spec.n_layers]],
            weight_bytes_per_token=max(weight_sharing[f"{req.socs[0].name}/pte"].shared_weights_bytes),
            device_bytes=device, bytes_per_parameter=round(device / built["n_params"], 4), bos_id=built["bos_id"],
            eos_ids=built["eos_ids"], rope_theta=built["rope_theta"], weight_sharing=weight_sharing,
            quantization=built["quantization"], pte=ptes,
            weight_rounding=(built["weight_rounding"] or {}).get("rounding"),
            quality_recipe=(built["weight_rounding"] or {}).get("recipe"))
        a.m.numerics = manifest_numerics(built["numerics"][req.socs[0].name], built["threshold_db"], req.socs[0].name,
                                         "first calibration sample per method")
        a.record_timings(built["timings"])
    return open_bundle(out)


def _add_programs(a: BundleAssembler, soc: SoC, req: _Request, built: dict, fake_quant: dict) -> tuple:
    """One SoC's weight-shared .pte and its unshared host twin, a graph per method → (the weight-sharing
    record, the .pte record), both read back from the programs (llm.model.pte_methods)."""
    plan, max_seq_len = built["plan"], req.max_seq_len
    (data, info), (twin_data, twin_info) = built["programs"][soc.name]["shared"], built["programs"][soc.name]["twin"]
    rel = f"{soc.name}/{built['architecture']}_{plan.precision.name}_cl{max_seq_len}.pte"
    a.w.path(rel, role=Role.PTE).write_bytes(data)
    twin_rel = f"{soc.name}/host/{built['architecture']}_{plan.precision.name}_cl{max_seq_len}_unshared.pte"
    a.w.path(twin_rel, role=Role.HOST_PTE).write_bytes(twin_data)
    records = pte_records(rel, twin_rel, info, twin_info, len(data), len(twin_data),
                          {method_name(n): n for n in req.variants}, built["consts"], built["kv"],
                          built["numerics"][soc.name], fake_quant)
    a.m.htp_arch[soc.name] = info["binary"].get("dsp_arch")
    a.m.graphs += method_graphs(built["io"], info, rel, soc.name, a.m.htp_arch[soc.name], built["spec"].n_layers)
    return records
