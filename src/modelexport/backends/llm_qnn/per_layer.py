"""`verify --per-layer` for LLM bundles: every module of the float decoder vs the bundle's QDQ
(fake-quant) graph, on real text, on ONNX Runtime's CPU EP.

The bundle keeps the QDQ model of each graph but not its float twin, so the float graph is
exported again from the source model with the same exporter (same node names). The inputs are
windows of the bundle's calibration text recorded through the float decoder with a real KV cache
(the windows after the first one, which calibration used, when the text is long enough). For a
decoder split into parts, each part gets the float hidden states entering it, so a part's numbers
are its own loss, not the sum of the parts before it.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from ...core.errors import InputError
from ...frontends import find_frontend
from ...frontends.module_paths import llm_module_path
from ...frontends.source_hash import recorded_source
from ...llm.model.input_modes import get_input_mode
from ...llm.run.text import dialog_start, recorded_text, tokenize
from ...llm.run.tokenizers import from_transformers

DEFAULT_SAMPLES = 2


def llm_per_layer(bundle, inputs, part, threshold_db, max_samples) -> list:
    """PER_LAYER_HOOKS["llm"]: → [PerLayerReport] for the chosen variant (default: the widest arN)."""
    import torch

    from ...quant.precision import pass_mark
    from ...quant.per_layer import PerLayerReport, per_layer, suggest_module
    from ...llm.export.calibrate import (WalkExtras, calibration_samples, full_context_samples, part_samples,
                                         with_input_mode, with_positions)
    from ...llm.export.onnx_export import DecoderPart, PartRange, export_part
    from ...llm.model.static_decoder import ONNX_RMS_NORM, build_static_decoder, decoder_config

    if inputs:
        raise InputError("--input is not used for LLM bundles", "per-layer numerics run on the bundle's calibration text; leave --input out")
    m = bundle.manifest
    info = m.llm
    if info is None:
        raise InputError(f"{bundle.path} records no LLM section in its manifest", "recompile the bundle")
    seq = int(info.max_seq_len)
    # at the bundle's context (--context-lengths' shorter graphs compute what these do, on fewer positions)
    graphs = [g for g in m.graphs if g.target == m.targets[0] and (g.context_len or seq) == seq]
    names = sorted({g.name for g in graphs})
    if part:
        chosen = [g for g in graphs if g.name == part or f"ar{g.n_tokens}" == part]
        if not chosen:
            raise InputError(f"{bundle.path} has no graph {part!r}", f"name one of: {', '.join(names)} (or arN)")
        n = chosen[0].n_tokens
    else:   # the largest arN (the full-context graph only when named: its samples are whole windows)
        n = max((g.n_tokens for g in graphs if g.n_tokens != seq), default=seq)
    chain = sorted((g for g in graphs if g.n_tokens == n), key=lambda g: g.part_index)

    t0 = time.perf_counter()
    src = recorded_source(m, "per-layer numerics")
    text = recorded_text(m, "per-layer numerics")
    llm = find_frontend(str(src)).load(str(src))
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    k = max_samples or DEFAULT_SAMPLES
    ids = tokenize(tok, text.text, seq * (k + 3))
    held_out = ids[seq:] if len(ids) >= 2 * seq else ids       # calibration walked the first window
    mode = get_input_mode(info.inputs)
    dec = build_static_decoder(llm.model, decoder_config(n, seq), rms_norm=ONNX_RMS_NORM, inputs=mode.name,
                               residual_scale=info.residual_scale, positions=info.positions)
    lead = tuple(dialog_start(tok))
    samples = (full_context_samples(held_out, seq, k, lead=lead) if n == seq
               else calibration_samples(llm.model, held_out, [n], seq, k, extras=WalkExtras(lead=lead))[n])
    with torch.inference_mode():
        samples = with_input_mode(samples, mode, lambda x: dec.lookup(torch.from_numpy(x)).float().numpy(),
                                  dec.spec.hidden_size)
    samples = with_positions(samples, dec)

    precision = m.precision or "16a4w"
    thr = pass_mark(threshold_db, precision)
    merged = PerLayerReport(f"ar{n}", precision, thr, len(samples))
    hidden = None
    with tempfile.TemporaryDirectory(prefix="mx-llm-float-") as tmp:
        for g in chain:
            a, b = g.layers
            pr = PartRange(g.part_index, len(chain), a, b)
            ps = part_samples(samples, pr, hidden, mode.decoder_inputs)
            fpath = export_part(dec, pr, Path(tmp) / f"{g.name}.onnx")
            weights = set((info.quantization.get(g.name) or {}).get("modules", {}))
            rep = per_layer(fpath, bundle.file(g.quantized_model), ps, thr, precision, g.name,
                            name_of=lambda node: llm_module_path(node.name) or node.name,
                            overridable=lambda name, w=weights: any(x.startswith(suggest_module(name)) for x in w))
            merged.layers.extend(rep.layers)
            for key in ("first_bad_layer", "suggestion", "suggestion_module", "culprit_layer"):
                if getattr(merged, key) is None:
                    setattr(merged, key, getattr(rep, key))
            if rep.worst_drop and (merged.worst_drop is None or rep.worst_drop["drop_db"] > merged.worst_drop["drop_db"]):
                merged.worst_drop = rep.worst_drop
            if not pr.is_last:      # the float hidden states entering the next part
                mod = DecoderPart(dec, pr).eval()
                with torch.inference_mode():
                    hidden = [mod(*[torch.from_numpy(s[x]) for x in mod.input_names()])[0].numpy() for s in ps]
    merged.seconds = time.perf_counter() - t0
    return [merged]


SOURCE = "float decoder (re-exported from the source) vs the bundle's QDQ fake-quant graph on the CPU EP"


def llm_per_layer_verify(bundle, inputs, part, target, threshold_db, min_sqnr, max_samples) -> tuple[Any, list, str]:
    """→ (VerifyReport from the per-layer run's logits, [PerLayerReport], where the numbers come from). The
    compiled graphs' agreement with fake-quant is what `modelexport eval` measures."""
    layers = llm_per_layer(bundle, inputs, part, threshold_db, max_samples)
    return _logits_report(bundle, layers[0], min_sqnr), layers, SOURCE


def _logits_report(bundle, pl, min_sqnr):
    """A VerifyReport for an LLM bundle from its per-layer run: the last module's (lm_head's) numbers."""
    from ...quant.precision import pass_mark
    from ..ort_qnn.verify import GraphCheck, OutputCheck, VerifyReport
    last = pl.layers[-1]
    threshold = pass_mark(min_sqnr, pl.precision)
    g = GraphCheck(pl.part, "cpu fake-quant", pl.precision, threshold, pl.samples, "calibration text (held out)")
    g.outputs.append(OutputCheck(f"logits ({last.name})", last.sqnr_db, last.cosine, last.max_abs_error, None,
                                 last.sqnr_db >= threshold))
    return VerifyReport(str(bundle.path), [g])
