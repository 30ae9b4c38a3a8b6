"""Perplexity of an LLM at three stages, and how far the quantized logits are from float.

    float       the Hugging Face model (from the GGUF / HF folder) as the static decoder, eager, CPU
    fake-quant  the bundle's quantized graphs on the CPU: the QDQ ONNX graphs on ONNX Runtime's CPU EP
    htp-sim     the bundle's compiled graphs (unshared twins) on the x86 HTP simulator, as EPContext
                models in ONNX Runtime
    cpu         the CPU runtime's ExecuTorch XNNPACK program (8da4w unless told), the one
                `generate` runs; it returns the last position's logits only, so it is scored
                one decode step per token (the same KV-cache path generation takes)

Every stage runs the same chunked loop (`StaticRunner`: arN prefill chunks over the real KV
cache), on windows of `window` tokens cut from the start of the text, each begun with BOS when the
model wants one first (as every dialog is); the first token of each window is context only. SQNR / cosine of the logits are taken between stages on the tokens they
both ran (the simulator's windows are short: one decode step of SmolLM2 takes seconds there).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..contract.bundle import open_bundle
from ..core.errors import InputError
from ..core.formats import BundleFormat, bundle_format
from ..core.numerics import compare
from ..core.vocab import BundleKind, Format, Role
from ..frontends import find_frontend
from ..frontends.source_hash import recorded_source
from ..llm import load
from ..llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
from ..llm.run.openers import require_context
from ..llm.run.static_runner import StaticRunner
from ..llm.run.text import dialog_start, read_text, text_windows, tokenize
from ..llm.run.tokenizers import from_transformers, load_tokenizer
from ..llm.export.reference import tokens_compile_read

STAGES = ("float", "fake-quant", "htp-sim", "cpu")
BUNDLE_STAGES = ("float", "fake-quant", "htp-sim")   # the default for a bundle
COMPILED = ("fake-quant", "htp-sim")                 # the stages that run what a bundle holds


def _compiled_stages_of(bundle, stages: list[str]) -> BundleFormat | None:
    """The format's row (its `stages`, `forwards`); a stage the bundle cannot run is refused up front,
    naming those it can."""
    fmt = bundle.manifest.format or Format.CONTEXT_BINARY
    row = bundle_format(fmt, bundle.manifest.kind)
    runs = row.entry("stages") if row else None
    can = ("float", *(runs(bundle) if runs else ()), "cpu")
    cannot = [s for s in stages if s in STAGES and s not in can]
    if cannot:
        raise InputError(f"{bundle.path} ({fmt} bundle) cannot run stage(s) {', '.join(cannot)}; it runs {', '.join(can)}",
                         f"use --stages {','.join(s for s in stages if s in can) or 'float'}")
    return row


@dataclass
class StageResult:
    stage: str
    tokens: int
    windows: int
    window: int
    perplexity: float
    nll: float
    seconds: float
    logits: list[np.ndarray] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "tokens": self.tokens, "windows": self.windows, "window": self.window,
                "perplexity": round(self.perplexity, 4), "nll": round(self.nll, 5), "seconds": round(self.seconds, 2),
                "tokens_per_s": round(self.tokens / self.seconds, 2) if self.seconds else None}


def perplexity(runner: StaticRunner, ids: list[int], window: int, stage: str, keep_logits: int = 0,
               progress: Callable[[str], None] | None = None, lead: list[int] | None = None) -> StageResult:
    """Perplexity over `ids` in windows of `window` tokens, each begun with `lead` (text.dialog_start:
    BOS for a model that wants it first); the first token of each window is context only."""
    if window < 2 + len(lead or []):
        raise InputError(f"--window must be at least {2 + len(lead or [])} tokens")
    if window > runner.max_seq_len:
        raise InputError(f"--window {window} is longer than the model's max_seq_len {runner.max_seq_len}",
                         f"use --window {runner.max_seq_len} or less")
    nll, count, windows, kept = 0.0, 0, 0, []
    t0 = time.perf_counter()
    for w in text_windows(ids, window, lead or []):
        runner.reset()
        logits = runner.feed(w).double()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        tgt = torch.tensor(w[1:])
        nll += float(-logp[torch.arange(len(tgt)), tgt].sum())
        count += len(tgt)
        windows += 1
        if len(kept) < keep_logits:
            kept.append(logits.float().numpy())
        if progress:
            progress(f"{stage}: window {windows}, perplexity so far {math.exp(nll / count):.2f}")
    if not count:
        raise InputError("the text gave no tokens to score", "give a longer text")
    return StageResult(stage, count + (0 if lead else windows), windows, window, math.exp(nll / count), nll / count,
                       time.perf_counter() - t0, kept)


class CpuProgramRunner:
    """`perplexity`'s runner over the CPU runtime's session: one decode step per token."""

    def __init__(self, session):
        self.session = session
        self.max_seq_len = session.max_seq_len

    def reset(self) -> None:
        self.session.reset()

    def feed(self, ids: list[int]) -> torch.Tensor:
        return torch.stack([self.session.feed([t]) for t in ids])


def float_runner(source: Path, max_seq_len: int, n_tokens: list[int]) -> tuple[StaticRunner, Any]:
    llm = find_frontend(str(source)).load(str(source))
    dec = build_static_decoder(llm.model, StaticDecoderConfig(max(n_tokens), max_seq_len))
    return StaticRunner.from_decoder(dec, n_tokens), llm


def _check_llm_source(src: Path) -> None:
    """eval scores language models: anything else (an ONNX or PyTorch model) is refused here,
    before a loader meant for LLMs fails on it."""
    if src.suffix.lower() == ".pte":
        return
    kind = find_frontend(str(src)).kind
    if kind != "llm":
        raise InputError(f"{src} is a {kind} model, not an LLM",
                         "eval scores LLMs (a .gguf, a Hugging Face folder or an LLM bundle); check other models with `modelexport verify`")


def evaluate(model: str | Path, text: str | Path | None = None, *, stages: list[str] | None = None, window: int = 512,
             max_tokens: int = 2048, sim_window: int = 64, sim_tokens: int = 64, max_seq_len: int | None = None,
             cpu_quant: str = "8da4w", progress: Callable[[str], None] | None = None,
             from_token: int | None = None) -> dict[str, Any]:
    """Perplexity per stage (+ SQNR between stages). `model`: an LLM bundle, a GGUF / HF folder
    (float and cpu stages) or an ExecuTorch LLM `.pte` (cpu). Scoring starts at `from_token` of the
    text, by default after every token compile read of it (held_out_span)."""
    say = progress or (lambda m: None)
    src = Path(model)
    if not src.exists():
        raise InputError(f"{src} does not exist", "give an LLM bundle, a .gguf file or a Hugging Face folder")
    txt = read_text(text)
    bundle = None
    if src.is_dir() and (src / "manifest.json").is_file():
        bundle = open_bundle(src)
        llm_meta = bundle.manifest.llm
        if bundle.manifest.kind != BundleKind.LLM or llm_meta is None:
            raise InputError(f"{src} is a {bundle.manifest.kind} bundle, not an LLM",
                             "eval scores LLMs; check a model bundle with `modelexport verify`")
        seq = llm_meta.max_seq_len
        variants = [n for n in llm_meta.variants if n != seq]   # not the full-context graph: it keeps no cache
        source = Path(bundle.manifest.source.path or "")
        stages = stages or list(BUNDLE_STAGES)
    else:
        _check_llm_source(src)
        if max_seq_len:
            require_context(src, max_seq_len)    # before any weight is loaded
        seq = max_seq_len or window
        variants = [32, 1] if seq > 32 else [1]
        source = src
        stages = stages or (["cpu"] if src.suffix == ".pte" else ["float"])
        if set(stages) & {"fake-quant", "htp-sim"}:
            raise InputError("fake-quant and htp-sim need a compiled bundle", "run `modelexport compile` first and eval the bundle")
        if "float" in stages and src.suffix == ".pte":
            raise InputError("a .pte holds no float model", "eval the GGUF or HF folder it was built from for --stages float")
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise InputError(f"unknown stage(s) {', '.join(sorted(unknown))}", f"choose from {', '.join(STAGES)}")
    compiled = _compiled_stages_of(bundle, stages) if bundle is not None else None
    window = min(window, seq)
    sim_window = min(sim_window, seq)
    tok = None
    results: dict[str, StageResult] = {}
    sim_stage_tokens = None
    flt = None
    if "float" in stages:
        if not source.exists():
            raise InputError(f"the float stage needs the source model {source}, which is not on this machine",
                             "run eval with --stages fake-quant,htp-sim")
        if bundle is not None:
            recorded_source(bundle.manifest, "the float stage")
        say("loading the float model")
        flt, loaded = float_runner(source, seq, variants)
        tok = from_transformers(loaded.tokenizer, chat_template=loaded.chat_template)
    if bundle is not None:
        tok_file = next(bundle.file(f.path) for f in bundle.manifest.files if f.role == Role.TOKENIZER)
        tok = load_tokenizer(tok_file)
    cpu = None
    if "cpu" in stages:
        say("building or opening the CPU program")
        cpu = load(src, backend="cpu", quant=cpu_quant, progress=say)
        if tok is None:
            tok = cpu.tokenizer
        if window > cpu.max_seq_len:
            raise InputError(f"--window {window} is longer than the CPU program's context {cpu.max_seq_len}",
                             f"use --window {cpu.max_seq_len} or less")
    span = held_out_span(bundle, txt)
    if from_token is not None:
        held = span["held_out"] and from_token >= span["first_token"]
        span = {"first_token": int(from_token), "held_out": held,
                "note": f"from token {from_token}, as asked" + ("" if held else ": text compile calibrated on")}
    ids = tokenize(tok, txt.text, span["first_token"] + max_tokens)[span["first_token"]:]
    if len(ids) < 2:                  # compile read the whole text: it is all there is to score
        span = {"first_token": 0, "held_out": False,
                "note": "the calibration text itself, all of which compile read: give another with --perplexity FILE"}
        ids = tokenize(tok, txt.text, max_tokens)
    span["last_token"] = span["first_token"] + len(ids)
    lead = dialog_start(tok)
    if lead:
        span["note"] += "; each window begins with BOS, as a dialog does"
    short = ids[:sim_tokens]
    out: dict[str, Any] = {"model": str(src), "text": str(txt.path), "text_sha256": txt.sha256, "tokens": len(ids),
                           "text_span": span,
                           "window": window, "max_seq_len": seq, "stages": {}, "short": {"tokens": len(short), "window": sim_window}}
    short_logits: dict[str, list[np.ndarray]] = {}
    n_short = len(text_windows(short, sim_window, lead))
    if flt is not None:
        say("float on the CPU")
        results["float"] = perplexity(flt, ids, window, "float", progress=say, lead=lead)
        short_logits["float"] = perplexity(flt, short, sim_window, "float", keep_logits=n_short, lead=lead).logits
    if compiled is not None:
        for stage in COMPILED:
            if stage not in stages:
                continue
            say(f"opening the {stage} graphs")
            graphs, spec, _ = compiled.entry("forwards")(bundle, stage)
            runner = StaticRunner(graphs, spec, seq)
            if stage == "fake-quant":
                results[stage] = perplexity(runner, ids, window, stage, progress=say, lead=lead)
                short_logits[stage] = perplexity(runner, short, sim_window, stage, keep_logits=n_short, lead=lead).logits
            else:
                r = perplexity(runner, short, sim_window, stage, keep_logits=n_short, progress=say, lead=lead)
                calls = sum(g.calls for g in graphs.values())
                results[stage] = r
                short_logits[stage] = r.logits
                sim_stage_tokens = {"graph_calls": calls, "seconds_per_call": round(r.seconds / max(1, calls), 3)}
    if cpu is not None:
        say(f"cpu ({cpu_quant}), one decode step per token")
        runner = CpuProgramRunner(cpu.session)
        results["cpu"] = perplexity(runner, ids, window, "cpu", progress=say, lead=lead)
        short_logits["cpu"] = perplexity(runner, short, sim_window, "cpu", keep_logits=n_short, lead=lead).logits
        out["cpu_program"] = {"quant": cpu_quant, "pte": cpu.info.get("pte")}
    for k, r in results.items():
        out["stages"][k] = r.to_dict()
    if sim_stage_tokens:
        out["stages"]["htp-sim"].update(sim_stage_tokens)
    # perplexities on the short span too (the one the simulator ran), and SQNR between stages
    out["short"]["perplexity"] = {}
    for k, ls in short_logits.items():
        out["short"]["perplexity"][k] = round(_ppl_from_logits(ls, short, sim_window, lead), 4)
    pairs = [("float", "fake-quant"), ("float", "htp-sim"), ("fake-quant", "htp-sim"), ("float", "cpu")]
    out["sqnr"] = {}
    for a, b in pairs:
        if a in short_logits and b in short_logits:
            ra, rb = np.concatenate(short_logits[a]), np.concatenate(short_logits[b])
            c = compare(ra, rb)
            agree = float(np.mean(ra.argmax(-1) == rb.argmax(-1)))
            out["sqnr"][f"{a} vs {b}"] = {"sqnr_db": round(float(c["sqnr_db"]), 3), "cosine": None if c["cosine"] is None else round(c["cosine"], 6),
                                          "max_abs_error": round(c["max_abs_error"], 4), "top1_agreement": round(agree, 4)}
    return out


def held_out_span(bundle, txt) -> dict[str, Any]:
    """Where in the text scoring starts: after every token compile read (its calibration samples; the
    4-bit rounding's input moments; the quality recipe's held-out span after those) when the text is
    the bundle's calibration text; from its start otherwise."""
    if bundle is None:
        return {"first_token": 0, "held_out": True, "note": "nothing calibrated on it (a model, not a bundle)"}
    cal = (bundle.manifest.calibration or {}).get("llm", {})
    if cal.get("sha256") != txt.sha256:
        return {"first_token": 0, "held_out": True, "note": "a text the bundle was not calibrated on"}
    llm = getattr(bundle.manifest, "llm", None)
    rounding = getattr(llm, "weight_rounding", None)
    start = tokens_compile_read(int(cal.get("tokens") or 0), int(getattr(rounding, "tokens", 0) or 0),
                                getattr(llm, "quality_recipe", None) is not None)
    return {"first_token": start, "held_out": True,
            "note": f"the bundle's calibration text, after the first {start} tokens compile read"}


def _ppl_from_logits(logits: list[np.ndarray], ids: list[int], window: int, lead: list[int]) -> float:
    nll, n = 0.0, 0
    for lg, w in zip(logits, text_windows(ids, window, lead)):
        t = torch.from_numpy(lg).double()
        lp = torch.log_softmax(t[:-1], dim=-1)
        tgt = torch.tensor(w[1:len(lg)])
        nll += float(-lp[torch.arange(len(tgt)), tgt].sum())
        n += len(tgt)
    return math.exp(nll / max(1, n))
