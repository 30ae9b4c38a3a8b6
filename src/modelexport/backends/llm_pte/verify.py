"""`modelexport verify` of an LLM `.pte` bundle: each decoder method's logits on the host twin (the
x86 HTP simulator, ExecuTorch's runtime) against the float static decoder, on windows of the
bundle's calibration text that calibration did not use, fed with the real KV cache the float
decoder built for the text before them. The fake-quant graphs (QnnQuantizer's, on the CPU) are
run on the same samples, so the report says how much of the loss quantization alone explains.

The numbers replace `manifest.numerics` (what inspect and report.html show), as verify does for
every bundle; the compile's own measure stays in `llm.pte[TARGET].numerics`.
"""
from __future__ import annotations

from pathlib import Path

from ...contract import open_bundle
from ...contract.bundle import refresh_report, save_manifest
from ...core.errors import InputError, UnsupportedError
from ...frontends import find_frontend
from ...frontends.source_hash import recorded_source
from ...llm.export.calibrate import calibration_samples
from ...llm.run.pte_numerics import JUDGED, compare_stages, manifest_numerics
from ...llm.run.pte_session import compiled_stages, program_of, stage_forwards
from ...llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
from ...llm.run.text import recorded_text, tokenize
from ...llm.run.tokenizers import from_transformers
from ...quant.precision import pass_mark
from ..ort_qnn.verify import GraphCheck, OutputCheck, VerifyReport
from .session import load_program

DEFAULT_SAMPLES = 2
INPUTS = "calibration text, windows calibration did not use"


def _methods(prog, part: str | None) -> dict[str, int]:
    """{method: N} to verify: every decoder method, or the one `--part` names (its name or arN)."""
    if not part:
        return dict(prog.decoder_methods)
    chosen = {m: n for m, n in prog.decoder_methods.items() if part in (m, f"ar{n}")}
    if not chosen:
        names = [f"{m} (ar{n})" for m, n in prog.decoder_methods.items()]
        raise InputError(f"the bundle has no decoder method {part!r}", f"give --part one of: {', '.join(names)}")
    return chosen


def verify_llm_pte(path: str | Path, inputs=None, part: str | None = None, target: str | None = None,
                   min_sqnr: float | None = None, max_samples: int | None = None, record: bool = True):
    """→ VerifyReport: one GraphCheck per decoder method, its output the logits (twin vs float)."""
    if inputs:
        raise InputError("--input is not used for LLM bundles",
                         "verify runs the decoder methods on the bundle's calibration text; leave --input out")
    bundle = open_bundle(path)
    m = bundle.manifest
    target = bundle.check_selection(None, target) or m.targets[0]
    prog = program_of(bundle, target)
    methods = _methods(prog, part)
    seq = m.llm.max_seq_len
    k = max_samples or DEFAULT_SAMPLES
    src = recorded_source(m, "verify")
    text = recorded_text(m, "verify")
    llm = find_frontend(str(src)).load(str(src))
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    ids = tokenize(tok, text.text, seq * (k + 3))
    held_out = ids[seq:] if len(ids) >= 2 * seq else ids      # calibration walked the first window
    by_n = calibration_samples(llm.model, held_out, sorted(set(methods.values())), seq, k)
    decoders = {meth: build_static_decoder(llm.model, StaticDecoderConfig(n, seq)) for meth, n in methods.items()}
    stages = {"htp-sim": stage_forwards(bundle, load_program, "htp-sim", target)}
    if "fake-quant" in compiled_stages(bundle):
        stages["fake-quant"] = stage_forwards(bundle, load_program, "fake-quant", target)
    forwards = {meth: {"float": dec, **{s: f[meth] for s, f in stages.items()}} for meth, dec in decoders.items()}
    numerics = compare_stages(forwards, {meth: by_n[n][:k] for meth, n in methods.items()},
                              {meth: dec.input_names() for meth, dec in decoders.items()})
    precision = m.precision or "16a4w_block"
    threshold = pass_mark(min_sqnr, precision)
    report = VerifyReport(str(bundle.path), [], stages=numerics)
    for meth, pairs in numerics.items():
        a = pairs[JUDGED]
        g = GraphCheck(meth, target, precision, threshold, a.samples or 0, INPUTS)
        g.outputs.append(OutputCheck("logits", a.sqnr_db, a.cosine, a.max_abs_error, a.top1_agreement,
                                     a.sqnr_db >= threshold))
        report.graphs.append(g)
    if record:
        _record(bundle, numerics, threshold, target)
    return report


def _record(bundle, numerics: dict, threshold: float, target: str) -> None:
    bundle.manifest.numerics = manifest_numerics(numerics, threshold, target, INPUTS)
    save_manifest(bundle)
    refresh_report(bundle)


def _refuse(verb: str, path) -> None:
    raise UnsupportedError(f"`modelexport {verb}` feeds one graph; {path} is an LLM .pte bundle, whose methods "
                           "run in a generation loop over a KV cache",
                           "run it with `modelexport generate BUNDLE --backend htp-sim -p TEXT`, score it with "
                           "`modelexport eval BUNDLE`, or compare it with float with `modelexport verify BUNDLE`")


def refuse_run(path, *a, **k) -> None:
    """The row's `run`: an LLM .pte bundle has no one graph to feed."""
    _refuse("run", path)


def refuse_profile(path, *a, **k) -> None:
    """The row's `profile`: likewise."""
    _refuse("profile", path)
