"""LLM (GGUF file or HF folder) → one ExecuTorch `.pte` per SoC whose methods are the static
decoder's decode (`kv_forward`, ar1) and prefill (`prefill_forward`, arN) graphs over one
weight-shared QNN context binary, plus its unshared host twin and the tokenizer.

    modelexport compile SmolLM2.gguf --format pte --target SM8650 [--precision 16a4w_block|16a8w] \
        [--variants ar1,ar32] [--max-seq-len 512] [--override 'lm_head=16a4w_block'] -o OUT

Steps: every check first (format, precision, SoC floors, variants, source); load; calibrate on real
text through the float decoder (`llm_qnn.calibration`, the same samples and tied KV ranges as the
ONNX path); per method torch.export → QnnQuantizer (`quant.llm_pt2e`: the ONNX path's module
overrides, KV encodings tied) → one `.pte` with weight sharing and one without (`lower`); both read
back; the twin run once on the simulator against the float decoder (SQNR of the logits). Not cached.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ...contract import BundleWriter, GraphSpec, TensorSpec, open_bundle
from ...contract.manifest import DecoderShape, LlmSection, PteLlmProgram, SourceModel, Timings, WeightSharing
from ...core.atomic import check_output
from ...core.errors import InputError, VerificationError
from ...core.targets import SoC, get_target, require_feature
from ...core.vocab import BundleKind, Format, GraphKind, Role
from ...llm.pte_methods import constant_methods, method_name
from ...quant.llm_pt2e import LLM_PTE_PRECISIONS, boundary_encodings, check_precision, llm_quant_plan, tie_kv_ranges
from .. import backend
from ..spec import LlmCompileOptions, PartSpec

DEFAULT_VARIANTS = (1, 32)
DEFAULT_MAX_SEQ_LEN = 512
DEFAULT_CALIBRATION_SAMPLES = 8


def _check(parts: list[PartSpec], opts: LlmCompileOptions) -> tuple[PartSpec, str, list[int], int, list[SoC]]:
    """Everything a user can get wrong, before any work."""
    from ..llm_qnn.compile import parse_variants
    if len(parts) != 1:
        raise InputError("one LLM per bundle", "compile each model into its own bundle")
    spec = parts[0]
    precision = spec.precision or LLM_PTE_PRECISIONS[0]
    check_precision(precision)
    variants = parse_variants(opts.variants if opts.variants is not None else DEFAULT_VARIANTS)
    if len(variants) != 2 or 1 not in variants:
        raise InputError(f"--format pte holds one decode (ar1) and one prefill (arN) method; --variants gave "
                         f"{', '.join(f'ar{n}' for n in variants)}",
                         "give --variants ar1,arN (e.g. ar1,ar32), or leave --format out for more variants")
    max_seq_len = int(opts.max_seq_len or DEFAULT_MAX_SEQ_LEN)
    if max_seq_len <= max(variants):
        raise InputError(f"--max-seq-len {max_seq_len} must be larger than the largest variant (ar{max(variants)})")
    socs: list[SoC] = []
    for t in opts.targets or ["SM8650"]:
        s = get_target(t)
        if s not in socs:
            socs.append(s)
    for s in socs:
        require_feature(s, "weight_sharing", "--format pte (the decode and prefill methods share one copy of the "
                                             "weights through QNN weight sharing)")
        from ...quant.precision import get_precision
        p = get_precision(precision)
        if p.feature:
            require_feature(s, p.feature, f"precision {p.name} ({p.description})")
    if spec.calibration == "random":
        raise InputError("LLMs are calibrated on real text, not random data",
                         "give a text file with --calibration (default: lee_background.cor)")
    return spec, precision, variants, max_seq_len, socs


@backend("llm_pte", kinds=("llm",), formats=("pte",), options=LlmCompileOptions, default_precision="16a4w_block",
         precisions=LLM_PTE_PRECISIONS, only_by_format=True,
         description="LLM → one .pte per SoC: decode + prefill methods over one weight-shared QNN binary (ExecuTorch)")
def compile_llm_pte(parts: list[PartSpec], out: str | Path, options: LlmCompileOptions | None = None,
                    force: bool = False, progress: Callable[[str, float, float], None] | None = None) -> Any:
    from ...llm.text import read_text
    from ..llm_qnn.source import check_source
    opts = options or LlmCompileOptions()
    say = progress or (lambda msg, done, total: None)
    t_start = time.perf_counter()
    out = Path(out)
    check_output(out, force)
    spec, precision, variants, max_seq_len, socs = _check(parts, opts)
    plan = llm_quant_plan(precision, opts.overrides, opts.block_size)
    facts = check_source(spec.model, max_seq_len)
    text = read_text(spec.calibration)
    built = _build(facts.path, plan, variants, max_seq_len, socs, text,
                   int(opts.calibration_samples or DEFAULT_CALIBRATION_SAMPLES), say)
    built["timings"]["total_s"] = round(time.perf_counter() - t_start, 3)
    return _write_bundle(out, force, facts, socs, variants, max_seq_len, plan, text, built)


def _build(src: Path, plan, variants: list[int], max_seq_len: int, socs: list[SoC], text, n_samples: int, say) -> dict:
    import tempfile

    import torch

    from ...frontends import find_frontend
    from ...llm.static_decoder import StaticDecoderConfig, build_static_decoder
    from ...llm.text import tokenize
    from ...llm.tokenizers import from_transformers
    from ...quant.pt2e_qnn import quantize
    from ..executorch_qnn.specs import qnn_ready
    from ..llm_qnn.calibration import calibration_samples
    from .lower import lower_methods, read_program
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    say("loading the model", 0, 5)
    llm = find_frontend(str(src)).load(str(src))
    ctx = getattr(llm.config, "max_position_embeddings", None)
    if ctx and max_seq_len > ctx:
        raise InputError(f"--max-seq-len {max_seq_len} is beyond the model's context ({ctx} tokens)",
                         f"use --max-seq-len {ctx} or less")
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
    graphs, inputs, decoders, encodings, quant_info = {}, {}, {}, {}, {}
    t0 = time.perf_counter()
    for n in variants:
        method = method_name(n)
        say(f"quantizing {method} (ar{n}, {plan.precision.name})", 2, 5)
        dec = build_static_decoder(llm.model, StaticDecoderConfig(n, max_seq_len))
        names_in, names_out = dec.input_names(), dec.output_names()
        inputs[method] = dec.example_inputs()
        ep = torch.export.export(dec, inputs[method], strict=True)
        calib = [tuple(torch.from_numpy(s[k]) for k in names_in) for s in samples[n]]
        graphs[method] = quantize(ep.module(), plan, socs[0], calib, before_convert=lambda p: tie_kv_ranges(
            p, dec.spec.n_layers, kv_ranges, names_in, names_out))
        encodings[method] = {k: v for k, v in boundary_encodings(graphs[method], names_in, names_out).items()
                             if k in kv_ranges}
        quant_info[method] = plan.describe()
        decoders[method] = (dec, samples[n][0])
    timings["quantize_s"] = round(time.perf_counter() - t0, 2)
    kv = _check_tied(encodings, decoders)
    spec = decoders[method_name(1)][0].spec
    consts = constant_methods(spec, max_seq_len, max(variants), tok.bos_id, bool(tok.add_bos), list(tok.eos_ids))
    programs: dict[str, dict] = {}
    t0 = time.perf_counter()
    for soc in socs:
        programs[soc.name] = {}
        for shared in (True, False):
            say(f"lowering for {soc.name}{' with weight sharing' if shared else ' (host twin, unshared)'}", 3, 5)
            data = lower_methods(graphs, inputs, soc, shared, consts, plan.uses_block)
            programs[soc.name]["shared" if shared else "twin"] = (data, read_program(data, list(graphs)))
    timings["lower_s"] = round(time.perf_counter() - t0, 2)
    say("running the host twin on the simulator", 4, 5)
    t0 = time.perf_counter()
    numerics = {soc: _twin_sqnr(p["twin"][0], decoders) for soc, p in programs.items()}
    timings["twin_check_s"] = round(time.perf_counter() - t0, 2)
    n_params = sum(p.numel() for p in llm.model.parameters())
    rope = getattr(llm.config, "rope_parameters", None) or {}
    return {"programs": programs, "spec": spec, "consts": consts, "kv": kv, "numerics": numerics, "tok_dir": tok_dir,
            "architecture": llm.architecture, "n_params": int(n_params), "quantization": quant_info,
            "rope_theta": float((rope.get("rope_theta") if isinstance(rope, dict) else None)
                                or getattr(llm.config, "rope_theta", 10000.0)),
            "bos_id": tok.bos_id, "eos_ids": list(tok.eos_ids), "io": {m: (d.input_names(), d.example_inputs(),
                                                                           d.output_names()) for m, (d, _) in decoders.items()},
            "timings": timings}


def _check_tied(encodings: dict[str, dict[str, list[float]]], decoders) -> dict[str, list[float]]:
    """One encoding per layer's key cache and per value cache: input = output, in every method."""
    from ...llm.static_decoder import new_key, new_value, past_key, past_value
    n_layers = next(iter(decoders.values()))[0].spec.n_layers
    out: dict[str, list[float]] = {}
    for i in range(n_layers):
        for names in ((past_key(i), new_key(i)), (past_value(i), new_value(i))):
            seen = {tuple(e[n]) for e in encodings.values() for n in names if n in e}
            if len(seen) != 1:
                raise VerificationError(f"the KV cache {names[0]} carries {len(seen)} encodings across its input, "
                                        f"output and methods ({sorted(seen)}), not one",
                                        "report this: the KV encodings must be tied")
            out[names[0]] = out[names[1]] = list(seen.pop())
    return out


def _twin_sqnr(data: bytes, decoders) -> dict[str, float]:
    """SQNR (dB) of each method's logits on the simulator vs the float decoder, on a calibration sample."""
    import torch

    from ...core.numerics import sqnr_db
    from .session import load_program
    program = load_program(data)
    out = {}
    for method, (dec, sample) in decoders.items():
        feed = [torch.from_numpy(sample[k]) for k in dec.input_names()]
        got = program.load_method(method).execute(feed)
        with torch.inference_mode():
            ref = dec(*feed)
        out[method] = round(float(sqnr_db(ref[0].float().numpy(), got[0].float().numpy())), 2)
    return out


def _tensors(names: list[str], values) -> list[TensorSpec]:
    return [TensorSpec(name=n, shape=list(v.shape), dtype=str(v.dtype).removeprefix("torch.")) for n, v in zip(names, values)]


def _write_bundle(out: Path, force: bool, facts, socs: list[SoC], variants: list[int], max_seq_len: int, plan, text,
                  built: dict):
    spec = built["spec"]
    with BundleWriter(out, force) as w:
        m = w.manifest
        m.kind, m.format = BundleKind.LLM, Format.PTE
        m.targets = [s.name for s in socs]
        m.precision = plan.precision.name
        m.source = SourceModel(path=str(facts.path.resolve()), sha256=facts.sha256,
                               format="gguf" if facts.format == "gguf" else "hf-folder",
                               description=f"{built['architecture']}, {built['n_params']:,} parameters")
        m.options = {"backend": "llm_pte", "variants": [f"ar{n}" for n in variants], "max_seq_len": max_seq_len,
                     "precision": plan.precision.name, "weight_sharing": True, **plan.key()}
        m.calibration = {"llm": {"kind": "text", "representative": True, "text": str(text.path), "sha256": text.sha256}}
        for f in sorted(Path(built["tok_dir"]).iterdir()):
            w.add_file(f, f"tokenizer/{f.name}", role=Role.TOKENIZER if f.name == "tokenizer.json" else Role.TOKENIZER_CONFIG)
        weight_sharing, ptes = {}, {}
        for soc in socs:
            (data, info), (twin_data, twin_info) = built["programs"][soc.name]["shared"], built["programs"][soc.name]["twin"]
            rel = f"{soc.name}/{built['architecture']}_{plan.precision.name}_cl{max_seq_len}.pte"
            w.path(rel, role=Role.PTE).write_bytes(data)
            twin_rel = f"{soc.name}/host/{built['architecture']}_{plan.precision.name}_cl{max_seq_len}_unshared.pte"
            w.path(twin_rel, role=Role.HOST_PTE).write_bytes(twin_data)
            shared_sizes = sorted({g.get("shared_weights_size") or 0 for g in info["graphs"].values()})
            once = len(shared_sizes) == 1 and shared_sizes[0] > 0
            if not once:
                raise VerificationError(f"the {soc.name} .pte's context binary does not share its weights "
                                        f"(shared sizes {shared_sizes})", "report this: QNN did not share the weights")
            m.htp_arch[soc.name] = info["binary"].get("dsp_arch")
            weight_sharing[f"{soc.name}/pte"] = WeightSharing(
                file=rel, graphs=sorted(info["graphs"]), shared_weights_bytes=shared_sizes,
                const_bytes={g: h.get("const_size") for g, h in info["graphs"].items()}, bytes=info["binary_bytes"],
                unshared_twins_bytes=twin_info["binary_bytes"], saved_bytes=twin_info["binary_bytes"] - info["binary_bytes"],
                weights_stored_once=once,
                note="the .pte's embedded context binary read back through libQnnSystem, against the host twin's "
                     "(one context of the same graphs, compiled without sharing: the x86 simulator cannot load shared ones)")
            ptes[soc.name] = PteLlmProgram(
                file=rel, host_twin=twin_rel, methods=info["methods"],
                decoder_methods={method_name(n): n for n in variants}, metadata=built["consts"], bytes=len(data),
                host_twin_bytes=len(twin_data), kv_encodings=built["kv"], numerics=built["numerics"][soc.name])
            for method, (names_in, ex, names_out) in built["io"].items():
                n = ex[0].shape[1]
                h = info["graphs"][method]
                m.graphs.append(GraphSpec(
                    name=method, file=rel, kind=GraphKind.PTE_METHOD, target=soc.name, htp_arch=m.htp_arch[soc.name],
                    inputs=_tensors(names_in, ex), outputs=[TensorSpec(name=o, shape=[], dtype="float32") for o in names_out],
                    part=method, n_tokens=n, part_index=1, n_parts=1, layers=[0, spec.n_layers], qnn_graph_name=method,
                    shared=True, const_bytes=h.get("const_size"), shared_weights_bytes=h.get("shared_weights_size")))
        device = sum(p.bytes for p in ptes.values()) // len(ptes)
        m.parameters = built["n_params"]
        m.llm = LlmSection(
            architecture=built["architecture"], spec=DecoderShape(**{k: getattr(spec, k) for k in DecoderShape.model_fields}),
            variants=variants, max_seq_len=max_seq_len, n_parts=1, parts=[[0, spec.n_layers]],
            weight_bytes_per_token=max(weight_sharing[f"{socs[0].name}/pte"].shared_weights_bytes),
            device_bytes=device, bytes_per_parameter=round(device / built["n_params"], 4), bos_id=built["bos_id"],
            eos_ids=built["eos_ids"], rope_theta=built["rope_theta"], weight_sharing=weight_sharing,
            quantization=built["quantization"], pte=ptes)
        m.timings = Timings.model_validate(built["timings"])
    return open_bundle(out)
