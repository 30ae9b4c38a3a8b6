"""The llm_qnn bundle, written through the shared `BundleAssembler` (backends/assembler.py) from what
`compile_llm` built: the QDQ graphs and the tokenizer (the `llm-qdq` entry), per target the decoder's
weight-shared binaries and every graph's unshared host twin, the embedder part. What is this format's own:
the binaries' names, the checks that a shared binary holds every graph once and its weights once, the
EPContext models pointed at the renamed binaries, the Genie configs (checked by libGenie, a dialog
created on the host twins), the LLM section."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...contract import GraphSpec, open_bundle
from ...contract.manifest import (GRAPH_NAMING, DecoderShape, EmbedderPart, GenieCheck, HostTwin, LlmSection,
                                  LoraAdapterEntry, LoraInputs,
                                  LogitsAgreement, MemoryEstimate, WeightSharing)
from ...core.cache import Cache
from ...core.errors import ModelExportError, StrictNumericsError, VerificationError
from ...core.numerics_advice import numerics_fix_for, numerics_line
from ...core.targets import get_target
from ...core.vocab import BundleKind, Format, GraphKind, Role
from ...llm.export.lora_source import CONFIG, GENIE_BASE, WEIGHTS, adapter_arrays, zero_arrays
from ...llm.export.memory import host_part_mb
from ...llm.export.plan import LlmPlan
from ...llm.model.input_modes import ROPE_TABLE, get_input_mode
from ...toolchain.genie import validate_genie_config
from ...toolchain.host_cores import one_host_core
from ...toolchain.qnn_graph_order import in_part_order
from ...toolchain.worker_pool import run_jobs
from ..assembler import BundleAssembler, assemble, graph_io, htp_facts, llm_source
from .embedder import embedder_check
from .genie import genie_config, genie_rope, lora_block, lora_files, lut_embedding
from .geniex import write_folder as write_geniex
from .genie_dialog import check_dialogs

GENIE_BOTH_NOTE = ("--inputs both: the decoder takes input_ids and inputs_embeds, and Genie's dialog writes one "
                   "input layer (inputs_embeds when the graph has it, else input_ids), never both: input_ids would "
                   "hold whatever its buffer holds, so no dialog was created; generate / eval run the bundle with "
                   "--backend htp-sim, and --inputs embeddings makes a bundle Genie runs")


@dataclass(frozen=True)
class QdqEntry:
    """The `llm-qdq` stage's cache entry: its folder, whether it was a hit, its record (graphs.record)."""
    entry: Path
    hit: bool
    meta: dict
    host_estimate: dict | None


@dataclass(frozen=True)
class LlmRun:
    """What the bundle writer records of this run."""
    qairt: Any
    cache: Cache
    timings: dict
    t_start: float
    executorch_program: bool = False     # --executorch-program
    geniex: bool = False                 # --geniex
    pass_mark_db: float = 5.0            # compile's own check: the logits against float (--min-sqnr, else the precision's)
    strict_numerics: bool = False        # --strict-numerics: below the mark, exit 7 and write nothing


@dataclass(frozen=True)
class _Staged:
    """The bundle being written, as the readers of a written one see it."""
    path: Path
    manifest: Any

    def file(self, rel: str) -> Path:
        return self.path / rel


def write_bundle(out: Path, force: bool, plan: LlmPlan, qdq: QdqEntry, compiling, run: LlmRun, say):
    """The bundle at `out` from the context-binary jobs `compiling` runs (ctx_compile.ContextCompile) →
    the opened Bundle. Compile's numerics check runs as soon as the host twins are in, while the
    workers still compile the weight-shared binaries."""
    with assemble(out, force, run.t_start) as a:
        _describe(a, plan, qdq)
        early = compiling.twins()           # (twin jobs, results) while the shared binaries compile, or None
        twins = _add_twins(a, *early) if early else {}
        runs: dict = {}        # each target's check run on the simulator: the ExecuTorch check replays it
        view = _twin_view(a, plan, qdq, twins) if early else None
        numerics = _beside_compile(view, qdq, run, say, runs, compiling) if view else None
        jobs, results = compiling.results()
        say("checking the binaries and writing the bundle", 3.5, 4)
        twins = twins or _add_twins(a, jobs, results)
        weight_sharing, ctx_bins = _add_decoder(a, plan, qdq.meta, jobs, results, twins)
        embedder = _add_embedder(a, qdq, jobs, results, twins, plan.max_seq_len, say)
        a.seal_build(run.qairt.build_id)
        a.m.placement = a.placement
        lora = _add_lora(a, qdq.meta.get("lora"), plan)
        genie = _genie_checks(a, plan, qdq.meta, ctx_bins, embedder, say, lora)
        a.m.parameters = qdq.meta["n_params"]
        a.m.llm = _llm_section(plan, qdq.meta, weight_sharing, genie, embedder.get("part"))
        a.m.llm.lora = lora
        a.m.numerics = numerics or _self_check(_Staged(a.w.dir, a.m), qdq, run, say, runs)
        _refuse_below_mark(a.m.numerics, run)
        if run.executorch_program:
            from .executorch_runner import write_programs   # deferred: numpy, and torch + executorch in its build
            say("building and checking the ExecuTorch program for qnn_llama_runner", 3.9, 4)
            staged = _Staged(a.w.dir, a.m)
            a.m.llm.executorch = {soc.name: write_programs(staged, soc.name, a.w.path, _tokenizer(a), runs.get(soc.name))
                                  for soc in plan.socs}
        if run.geniex:
            configs = {soc.name: json.loads((a.w.dir / genie[soc.name].file).read_text()) for soc in plan.socs}
            a.m.llm.geniex = {soc.name: write_geniex(a, soc.name, configs[soc.name], _tokenizer(a)) for soc in plan.socs}
        a.record_timings(run.timings, first=qdq.meta["timings"])
        a.record_cache(run.cache, root=False, quantize_hit=qdq.hit, resumed_graphs=qdq.meta.get("resumed_graphs") or None,
                       compile_hits=sum(1 for r in results if r.get("hit")), compile_jobs=len(results))
        a.record_qairt(run.qairt)
    return open_bundle(out)


def _beside_compile(view: _Staged, qdq: QdqEntry, run: LlmRun, say, runs: dict, compiling) -> dict:
    """Compile's numerics check on the host twins alone, while the workers compile the weight-shared
    binaries (`compiling`, ctx_compile.ContextCompile), held on one host core until the compile ends:
    the simulator's second thread mostly waits, and the other core goes to the compile."""
    t0 = time.perf_counter()
    with one_host_core(last=True) as held:
        compiling.when_done(held.release)
        numerics = _self_check(view, qdq, run, say, runs, " beside the compile")
    t1 = time.perf_counter()      # how much of it the compile hid:
    run.timings["beside_compile_s"] = round(max(0.0, (t1 if compiling.running() else min(t1, compiling.ended_at)) - t0), 2)
    return numerics


def _tokenizer(a: BundleAssembler) -> Path:
    return next(a.w.dir / rel for rel, role in a.w.roles.items() if role == Role.TOKENIZER)


def _self_check(staged: _Staged, qdq: QdqEntry, run: LlmRun, say, runs: dict, where: str = "") -> dict:
    """Compile's own numerics (self_check.py) → manifest.numerics."""
    from .self_check import check_bundle   # deferred: torch (the generation loop's runner); not on --help
    t0 = time.perf_counter()
    num = check_bundle(staged, qdq.entry, run.pass_mark_db, lambda msg: say(msg + where, 3.85, 4), runs)
    run.timings["numerics_s"] = round(time.perf_counter() - t0, 2)
    return num


def _refuse_below_mark(num: dict, run: LlmRun) -> None:
    """--strict-numerics: below the pass mark, exit 7 and write nothing."""
    if run.strict_numerics and num.get("passed") is False:
        raise StrictNumericsError("--strict-numerics: the compiled graphs differ from the float model on compile's own "
                                  "check: " + numerics_line(num),
                                  numerics_fix_for(num, True) + "; or drop --strict-numerics to keep the bundle and "
                                  "check it yourself")


def _twin_view(a: BundleAssembler, plan: LlmPlan, qdq: QdqEntry, twins: dict) -> _Staged | None:
    """The bundle as the numerics check reads it, from the host twins alone (before the weight-shared
    binaries are in); None with an embedder part, whose graphs come with its shared binary."""
    if qdq.meta.get("embedder"):
        return None
    graphs = [GraphSpec(name=g["name"], kind=GraphKind.CONTEXT_BINARY, target=soc.name, part=g["name"],
                        n_tokens=g["n_tokens"], context_len=g.get("context_len"), part_index=g["part"],
                        n_parts=g["n_parts"], layers=g["layers"], host_twin=twins[(soc.name, g["name"])],
                        quantized_model=g["qdq"])
              for soc in plan.socs for g in qdq.meta["graphs"]]
    llm = _llm_section(plan, qdq.meta, {}, {}, None)   # no binaries, no Genie check yet: the check reads neither
    return _Staged(a.w.dir, a.m.model_copy(update={"graphs": graphs, "llm": llm}))


def _describe(a: BundleAssembler, plan: LlmPlan, qdq: QdqEntry) -> None:
    """The header, the options, the calibration record, the tokenizer and the QDQ graphs."""
    qmeta, max_seq_len, limit_mb, variants = qdq.meta, plan.max_seq_len, plan.limit_mb, list(plan.variants)
    a.header(BundleKind.LLM, Format.CONTEXT_BINARY, plan.socs, plan.requested,
             llm_source(plan.facts, qmeta["architecture"], qmeta["n_params"]))
    a.m.options = {"backend": "llm_qnn", "variants": [f"ar{n}" if n != max_seq_len else "full" for n in variants],
                   "max_seq_len": max_seq_len, "precision": plan.requested,
                   "overrides": [f"{o.pattern}={o.precision.name}" for o in plan.overrides],
                   "optimization_level": None, "embed_mode": 0, "weight_sharing": len(variants) > 1,
                   "context_limit_mb": limit_mb, "n_parts": len(qmeta["parts"]), "host_part_mb": host_part_mb(limit_mb),
                   "host_chunks": qmeta.get("host_chunks"), "host_estimate": qdq.host_estimate}
    a.m.calibration = {"llm": {"kind": "text", "representative": True, **qmeta["calibration"]}}
    a.add_tokenizer(qdq.entry / "tokenizer")
    if (qdq.entry / ROPE_TABLE).exists():   # --positions cos-sin: what ONNX Runtime's and our loops feed
        a.w.add_file(qdq.entry / ROPE_TABLE, ROPE_TABLE, role=Role.ROPE_TABLE)
    for g in qmeta["graphs"]:
        a.add_onnx(qdq.entry / "qdq", g["name"], "qdq")


def _add_twins(a: BundleAssembler, jobs: list, results: list) -> dict[tuple[str, str], HostTwin]:
    """Every graph's unshared host twin (the simulator cannot load weight-shared binaries), read back;
    the QNN EP's placement of each graph per target."""
    twins: dict[tuple[str, str], HostTwin] = {}
    for (_, job), r in zip(jobs, results):
        if job["kind"] != "twin":
            continue
        entry, meta = Path(r["entry"]), r["meta"]
        tdir = f"{job['target']}/host"
        ctx_rel = a.w.add_file(entry / meta["files"]["epcontext"], f"{tdir}/{job['graph']}_ctx.onnx",
                               role=Role.HOST_EPCONTEXT_MODEL)
        bin_name = meta["files"]["context_binary"]
        bin_rel = a.w.add_file(entry / bin_name, f"{tdir}/{bin_name}", role=Role.HOST_CONTEXT_BINARY)
        g0 = a.read_back(entry / bin_name, get_target(job["target"])).graphs[0]
        twins[(job["target"], job["graph"])] = HostTwin(
            epcontext_model=ctx_rel, context_binary=bin_rel, qnn_graph_name=g0.name,
            bytes=(entry / bin_name).stat().st_size, **htp_facts(g0, "const_bytes", "optimization_level"))
        pl = meta["placement"]
        a.place(job["graph"], job["target"], {
            "htp_nodes": len(pl.get("QNNExecutionProvider", [])),
            "cpu_nodes": [n for n, _ in pl.get("CPUExecutionProvider", [])],
            "note": "CPU nodes are the graph-boundary QuantizeLinear/DequantizeLinear of the float IO"})
    return twins


def _add_decoder(a: BundleAssembler, plan: LlmPlan, qmeta: dict, jobs: list, results: list,
                 twins: dict) -> tuple[dict[str, WeightSharing], dict[str, list[str]]]:
    """The decoder's weight-shared binaries, per target and part (the full-context graph's apart), read back
    and checked, a GraphSpec per graph → (weight sharing per binary, per target the binaries Genie runs)."""
    weight_sharing: dict[str, WeightSharing] = {}
    ctx_bins: dict[str, list[str]] = {}
    n_parts = len(qmeta["parts"])
    graphs = {g["name"]: g for g in qmeta["graphs"]}
    for (_, job), r in zip(jobs, results):
        if job["kind"] != "shared" or job.get("role") == "embedder":
            continue
        entry, meta = Path(r["entry"]), r["meta"]
        p, full = job["part"], job.get("full_context", False)
        bin_name = f"{qmeta['architecture']}_{plan.requested}{'_full' if full else ''}_cl{plan.max_seq_len}_{p}_of_{n_parts}.bin"
        bin_rel = a.w.add_file(entry / meta["context_binary"], f"{job['target']}/{bin_name}", role=Role.CONTEXT_BINARY)
        if not full:   # Genie runs the arN graphs only
            ctx_bins.setdefault(job["target"], []).append(bin_name)
        info = a.read_back(entry / meta["context_binary"], get_target(job["target"]), arch=True)
        names = [name for name, _ in job["models"]]
        weight_sharing[f"{job['target']}/{p}{'/full' if full else ''}"] = _weight_sharing(
            info, names, p, bin_rel, entry / meta["context_binary"], [twins[(job["target"], n)] for n in names])
        for name, ctx_rel, twin, qnn_name, qg in _members(a, job, r, info, bin_name, twins):
            if qg is None:
                raise VerificationError(f"the binary of part {p} has no graph {qnn_name} for {name} "
                                        f"(it holds {', '.join(g.name for g in info.graphs)})",
                                        "report this with the manifest: the QNN EP's graph naming changed")
            g = graphs[name]
            a.m.graphs.append(GraphSpec(
                name=name, file=bin_rel, kind=GraphKind.CONTEXT_BINARY, target=job["target"], htp_arch=info.dsp_arch,
                **graph_io(qg), part=name, n_tokens=g["n_tokens"], context_len=g.get("context_len"), part_index=g["part"], n_parts=g["n_parts"],
                layers=g["layers"], qnn_graph_name=qg.name if qg else None, epcontext_model=ctx_rel, shared=len(names) > 1,
                **htp_facts(qg, "optimization_level", "const_bytes", "shared_weights_bytes"),
                host_twin=twin, quantized_model=g["qdq"], memory_estimate=MemoryEstimate(**g["memory_estimate"])))
    return weight_sharing, ctx_bins


def _weight_sharing(info, names: list[str], part, bin_rel: str, binary: Path, twins: list[HostTwin]) -> WeightSharing:
    """A weight-shared binary checked as read back: every graph in it, the weights stored once."""
    if len(info.graphs) != len(names):
        raise VerificationError(f"the weight-shared binary of part {part} holds {len(info.graphs)} graphs, "
                                f"expected {len(names)} ({', '.join(names)})", "report this: sharing failed")
    shared_sizes = {g.htp.shared_weights_size for g in info.graphs if g.htp}
    unshared_total = sum(t.bytes for t in twins)
    shared_bytes = binary.stat().st_size
    weights_once = len(shared_sizes) == 1 and next(iter(shared_sizes)) > 0
    if len(names) > 1 and not weights_once:
        raise VerificationError(f"the binary of part {part} does not share its weights (shared sizes {sorted(shared_sizes)})",
                                "report this: the QNN EP did not share the weights")
    return WeightSharing(
        file=bin_rel, graphs=[g.name for g in info.graphs], shared_weights_bytes=sorted(shared_sizes),
        const_bytes={g.name: g.htp.const_size for g in info.graphs if g.htp}, bytes=shared_bytes,
        unshared_twins_bytes=unshared_total, saved_bytes=unshared_total - shared_bytes, weights_stored_once=weights_once,
        note="read back through libQnnSystem; the x86 simulator cannot load weight-shared binaries, "
             "host numerics run on the unshared twins built from the same QDQ graphs")


def _members(a: BundleAssembler, job: dict, r: dict, info, bin_name: str, twins: dict) -> Iterator[tuple]:
    """Each graph of a weight-shared binary: (name, its EPContext model, pointed at the renamed binary, its
    host twin, the QNN graph name it should have, that graph as read back or None)."""
    entry, meta = Path(r["entry"]), r["meta"]
    for name, _ in job["models"]:
        ctx_rel = a.w.add_file(entry / meta["epcontext"][name], f"{job['target']}/{name}_ctx.onnx",
                               role=Role.EPCONTEXT_MODEL)
        # the EPContext model names the binary it references: point it at the renamed file
        _retarget_epcontext(a.w.dir / ctx_rel, meta["context_binary"], bin_name)
        twin = twins[(job["target"], name)]
        # parts in order: each compile named its graph from its own path (toolchain/qnn_graph_order.py)
        qnn_name = meta.get("expected_graph_names", {}).get(name, twin.qnn_graph_name)
        yield name, ctx_rel, twin, qnn_name, next((g for g in info.graphs if g.name == qnn_name), None)


def _add_embedder(a: BundleAssembler, qdq: QdqEntry, jobs: list, results: list, twins: dict, max_seq_len: int,
                  say) -> dict:
    """The embedder part: its graphs' ONNX, its weight-shared binary and EPContext models per target, and
    the check of each target's twin against the float lookup (in a child: it loads the simulator).
    → {"part": EmbedderPart}, or {} without an embedder."""
    embedder, qentry = qdq.meta.get("embedder"), qdq.entry
    if not embedder:
        return {}
    models = {}
    for g in embedder["graphs"]:
        if (rel := a.add_onnx(qentry / "embedder", g["name"], "embedder")) is not None:
            models[g["name"]] = rel
    n_of = {g["name"]: g["n_tokens"] for g in embedder["graphs"]}
    lut = a.w.add_file(qentry / embedder["genie_lut"], embedder["genie_lut"], role=Role.GENIE_LUT)
    part = EmbedderPart(precision=embedder["precision"], what=embedder["what"], quantized_models=models, genie_lut=lut)
    checks = []
    for (_, job), r in zip(jobs, results):
        if job["kind"] != "shared" or job.get("role") != "embedder":
            continue
        entry, meta = Path(r["entry"]), r["meta"]
        soc = get_target(job["target"])
        bin_name = f"embedder_{embedder['precision']}_cl{max_seq_len}.bin"
        bin_rel = a.w.add_file(entry / meta["context_binary"], f"{soc.name}/{bin_name}", role=Role.CONTEXT_BINARY)
        info = a.read_back(entry / meta["context_binary"], soc)
        part.bytes[soc.name] = (entry / meta["context_binary"]).stat().st_size
        for name, ctx_rel, twin, _, qg in _members(a, job, r, info, bin_name, twins):
            if qg is None and len(info.graphs) == 1:
                qg = info.graphs[0]
            part.graphs.append(GraphSpec(
                name=name, file=bin_rel, kind=GraphKind.CONTEXT_BINARY, target=soc.name, htp_arch=info.dsp_arch,
                **graph_io(qg), part="embedder", n_tokens=n_of[name], qnn_graph_name=qg.name if qg else None,
                epcontext_model=ctx_rel, shared=len(job["models"]) > 1, **htp_facts(qg, "const_bytes", "shared_weights_bytes"),
                host_twin=twin, quantized_model=models[name]))
        largest = max(job["models"], key=lambda m: n_of[m[0]])[0]
        checks.append((embedder_check, {"target": soc.name, "soc_model": soc.soc_model, "check": str(qentry / embedder["check"]),
                                        "epcontext": str(a.w.dir / twins[(soc.name, largest)].epcontext_model)}))
    say("checking the embedder part on the simulator", 3.6, 4)
    for (_, job), r in zip(checks, run_jobs("the embedder check", checks, 1)):
        if isinstance(r, ModelExportError):
            raise r
        part.check[job["target"]] = LogitsAgreement(sqnr_db=r["sqnr_db"], max_abs_error=r["max_abs_error"], samples=r["tokens"])
    return {"part": part}


def _genie_checks(a: BundleAssembler, plan: LlmPlan, qmeta: dict, ctx_bins: dict, embedder: dict, say,  # noqa: PLR0913
                  lora: LoraInputs | None = None) -> dict:
    """A Genie config per target, checked by the real libGenie, and a dialog created on the host twins
    (with `lora`, its first adapter applied there)."""
    socs, max_seq_len, spec = plan.socs, plan.max_seq_len, qmeta["spec"]
    genie = {}
    for soc in socs:
        rel = "genie_config.json" if len(socs) == 1 else f"{soc.name}/genie_config.json"
        up = "" if len(socs) == 1 else "../"   # paths relative to the folder Genie runs in
        lut = embedder["part"].genie_lut if embedder else None
        cfg = genie_config(ctx_bins=[(f"{soc.name}/{b}" if len(socs) == 1 else b) for b in ctx_bins[soc.name]],
                           tokenizer=f"{up}tokenizer/tokenizer.json",
                           context_size=max_seq_len, vocab=spec["vocab_size"],
                           bos=qmeta["bos_id"] if qmeta.get("add_bos") else None,
                           eos=qmeta["eos_ids"], head_dim=spec["head_dim"],
                           embedding=lut_embedding(f"{up}{lut}", spec["hidden_size"]) if lut else None)
        if qmeta.get("positions") == "cos-sin":   # Genie computes the cos and sin the graphs take
            cfg["dialog"]["engine"]["model"]["positional-encoding"] = genie_rope(qmeta)
        if lora is not None:
            cfg["dialog"]["engine"]["model"]["binary"]["lora"] = lora_block(
                [(e.name, f"{up}{e.genie_folder}") for e in lora.adapters] + [(GENIE_BASE, f"{up}{lora.genie_base}")])
        path = a.w.path(rel, role=Role.GENIE_CONFIG)
        path.write_text(json.dumps(cfg, indent=2))
        twins = [(g.n_tokens, a.w.dir / g.host_twin.context_binary)
                 for g in sorted(a.m.graphs, key=lambda g: (g.part_index or 1, g.name))
                 if g.n_tokens != max_seq_len
                 if g.target == soc.name and g.host_twin is not None]
        _check_part_order(a.m.graphs, soc.name)
        if qmeta.get("inputs", "tokens") == "both":   # Genie feeds input_ids or inputs_embeds, never both
            genie[soc.name] = GenieCheck(file=rel, **validate_genie_config(path), dialog_created=False,
                                         dialog_note=GENIE_BOTH_NOTE)
            continue
        say(f"creating a Genie dialog on the {soc.name} host twins", 3.8, 4)
        genie[soc.name] = GenieCheck(file=rel, **validate_genie_config(path),
                                     **check_dialogs(cfg, path.parent, twins, lora.adapters[0].name if lora else None))
    return genie


def _add_lora(a: BundleAssembler, record: dict | None, plan: LlmPlan) -> LoraInputs | None:
    """`--lora`: each adapter's two files under lora/NAME/ and its inputs as Genie reads them
    (lora/NAME/genie/), zeros for the base (lora/base/genie/), and the graphs' LoRA inputs."""
    if record is None:
        return None
    slots, entries = plan.lora.slots, []
    for adapter in plan.lora.adapters:
        for f in (CONFIG, WEIGHTS):
            a.w.add_file(adapter.folder / f, f"lora/{adapter.name}/{f}", role=Role.LORA_ADAPTER)
        genie = _write_genie_lora(a, f"lora/{adapter.name}/genie", adapter_arrays(adapter, slots, dtype=np.float32))
        entries.append(LoraAdapterEntry(**adapter.to_dict(), folder=f"lora/{adapter.name}", genie_folder=genie))
    base = _write_genie_lora(a, f"lora/{GENIE_BASE}/genie", zero_arrays(slots, np.float32))
    return LoraInputs(**{k: v for k, v in record.items() if k != "adapters"}, adapters=entries, genie_base=base)


def _write_genie_lora(a: BundleAssembler, folder: str, arrays: dict) -> str:
    for file, arr in lora_files(arrays):
        arr.tofile(a.w.path(f"{folder}/{file}", role=Role.LORA_INPUTS))
    return folder


def _check_part_order(graphs, target: str) -> None:
    """Genie orders a variant's parts by their QNN graph names (toolchain/qnn_graph_order.py): the
    names read back from the binaries, device and host twins, must sort in part order."""
    for n, c in sorted({(g.n_tokens, g.context_len) for g in graphs if g.target == target}, key=str):
        parts = sorted((g for g in graphs if g.target == target and (g.n_tokens, g.context_len) == (n, c)),
                       key=lambda g: g.part_index or 1)
        for what, names in (("device binaries", [g.qnn_graph_name for g in parts]),
                            ("host twins", [g.host_twin.qnn_graph_name for g in parts if g.host_twin])):
            if len(names) > 1 and not in_part_order(names):
                raise VerificationError(f"the QNN graphs of ar{n}'s parts in the {what} do not sort in part order "
                                        f"({', '.join(names)}): Genie would run the parts out of order",
                                        "report this with the manifest: the QNN EP's graph naming changed")


def _llm_section(plan: LlmPlan, qmeta: dict, weight_sharing: dict[str, WeightSharing], genie: dict,
                 embedder: EmbedderPart | None) -> LlmSection:
    """manifest.llm: the decoder's shape and variants, its parts, its bytes on the device, its binaries'
    weight sharing, the Genie checks, the quantization and the inputs."""
    socs, variants, max_seq_len, limit_mb = plan.socs, list(plan.variants), plan.max_seq_len, plan.limit_mb
    spec, n_parts, n_params = qmeta["spec"], len(qmeta["parts"]), qmeta["n_params"]
    device_bytes = sum(ws.bytes for ws in weight_sharing.values() if ws.file.startswith(socs[0].name))
    shared_w = sum(max(ws.shared_weights_bytes or [0]) for key, ws in weight_sharing.items()
                   if ws.file.startswith(socs[0].name) and not key.endswith("/full"))   # a decode step reads the arN binaries
    split_note = (f"split into {n_parts} parts by layers: the largest graph's estimated HTP memory exceeds the "
                  f"{limit_mb:g} MB per-context limit" if n_parts > 1 else None)
    return LlmSection(
        architecture=qmeta["architecture"], spec=DecoderShape(**spec), variants=variants, max_seq_len=max_seq_len,
        context_lengths=list(plan.context_lengths),
        n_parts=n_parts, parts=qmeta["parts"], split_note=split_note,
        weight_bytes_per_token=shared_w or device_bytes,
        device_bytes=device_bytes, bytes_per_parameter=round(device_bytes / n_params, 4),
        bos_id=qmeta["bos_id"], eos_ids=qmeta["eos_ids"], rope_theta=qmeta["rope_theta"],
        graph_naming=GRAPH_NAMING, weight_sharing=weight_sharing, genie=genie, quantization=qmeta["quantization"],
        memory_limit_mb=limit_mb, weight_rounding=qmeta.get("weight_rounding"), quality_recipe=qmeta.get("quality_recipe"),
        residual_scale=qmeta.get("residual_scale", 1.0),
        **_input_facts(qmeta, spec, variants, max_seq_len, embedder))


def _input_facts(qmeta: dict, spec: dict, variants: list[int], max_seq_len: int, embedder) -> dict:
    """The LLM section's input-mode fields (llm/model/input_modes.py) and the full-context flag."""
    mode = get_input_mode(qmeta.get("inputs"))
    return {"inputs": mode.name, "positions": qmeta.get("positions", "ids"), "embedder": embedder,
            "full_context": max_seq_len in variants,
            "no_token_id": qmeta.get("no_token_id", spec["vocab_size"]) if mode.name == "both" else None}


def _retarget_epcontext(onnx_path: Path, old: str, new: str) -> None:
    """Rewrite the EPContext nodes' `ep_cache_context` (the binary's file name in embed mode 0)."""
    import onnx
    model = onnx.load(str(onnx_path))
    changed = False
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        for a in node.attribute:
            if a.name == "ep_cache_context" and a.s.decode(errors="replace") == old:
                a.s = new.encode()
                changed = True
    if changed:
        onnx.save(model, str(onnx_path))
