"""Where the `.pte` path's fake-quant loss comes from, one factor at a time, on SmolLM2-135M (the Q4_1
GGUF) cut to its first N layers: the quantize stage only (export + QnnQuantizer prepare / calibrate /
convert, no lowering), logits SQNR vs the float static decoder per method (ar1 `kv_forward`, arN
`prefill_forward`) on the first calibration samples.

    weights only      the float decoder with its 4-bit linears replaced by the dequantized weights of
                      QnnQuantizer's block min-max (absmax/7 per block, float scale, [-7, 7]), or of
                      the ONNX path's rounding (LPBQ: uint4 block scale x channel scale, [-8, 7])
    fake-quant        QnnQuantizer's converted graph (16-bit activations) with those weights: its own
                      min-max, or the ONNX path's rounding pinned (`llm_pt2e.pin_rounded_weights`);
                      and with the KV ranges not tied (each observer its own min-max)

usage: python bench/experiments/llm_pte_weights.py --layers 2 [--layers 6] [--samples 8] [--eval 4]
       python bench/experiments/llm_pte_weights.py --layers 30 --ppl min-max,gptq   (fake-quant perplexity, as `eval`)
Writes bench/results/llm_pte_weights.json (merged per layer count)."""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent            # bench/
RESULT = ROOT / "results" / "llm_pte_weights.json"
sys.path.insert(0, str(HERE))   # the sibling llm_pte_stages.py


def qnn_min_max_block(w, block: int):
    """QnnQuantizer's PerBlockParamObserver on a torch weight [O, I]: symmetric, absmax/7 per block."""
    import torch
    o, i = w.shape
    wb = w.reshape(o, i // block, block)
    s = torch.clamp(wb.abs().amax(-1, keepdim=True) / 7, min=1e-12)
    return (torch.clamp(torch.round(wb / s), -7, 7) * s).reshape(o, i)


def dequantized_as_lowered(bw, block: int):
    """A rounded weight [K, N] as ExecuTorch's lowering hands it to QNN: the integers kept, the block
    scales re-derived as LPBQ (`llm_pt2e.as_lowered`, what `pin_rounded_weights` pins)."""
    import numpy as np
    import torch

    from modelexport.quant.llm_pt2e import as_lowered
    s = as_lowered(torch.from_numpy((bw.block_scales.astype(np.float32) * bw.channel_scale).T.copy())).numpy()
    k, n = bw.q.shape
    return (bw.q.reshape(k // block, block, n) * s.T[:, None, :]).reshape(k, n)


@dataclass
class Setup:
    """The cut model and what both measurements start from: the float static decoders (RoPE lookups
    split as the compile splits them), each method's calibration samples and the tied KV ranges."""
    llm: Any
    tok: Any
    text: Any
    decoders: dict          # {method: static decoder}
    samples: dict           # {method: [flat input dicts]}
    kv_ranges: dict
    seq: int


def _setup(n_layers: int, n_samples: int, variants: list[int], seq: int) -> Setup:
    from llm_pte_stages import cut_model
    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.backends.llm_qnn.calibration import calibration_samples
    from modelexport.llm.model.pte_methods import method_name
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder, split_rope_lookups
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.quant.llm_pt2e import MAX_ROPE_GATHER
    qnn_ready()
    llm = cut_model(n_layers)
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    text = read_text(None)
    kv: dict = {}
    samples = calibration_samples(llm.model, tokenize(tok, text.text, seq * (n_samples + 2)), variants, seq,
                                  n_samples, kv)
    decs = {method_name(n): build_static_decoder(llm.model, StaticDecoderConfig(n, seq)) for n in variants}
    for d in decs.values():
        split_rope_lookups(d, MAX_ROPE_GATHER)
    return Setup(llm, tok, text, decs, {method_name(n): samples[n] for n in variants}, kv, seq)


def _rounded(s: Setup, plan, rounding: str) -> dict:
    """The ONNX path's 4-bit weights of the cut model with this rounding, as the compile computes them."""
    from modelexport.backends.llm_pte.compile import _round_weights
    from modelexport.backends.llm_qnn.compile import _quality_options
    from modelexport.backends.spec import LlmCompileOptions
    opts = LlmCompileOptions(rounding=rounding)
    return _round_weights(s.llm.model, s.tok, s.text, s.seq, plan, _quality_options(opts, plan.precision.name, {}),
                          opts, lambda *a: None)[0]


def run(n_layers: int, n_samples: int, n_eval: int, variants: list[int], seq: int, weights_only_rows: bool = False) -> dict:
    import numpy as np
    import torch

    from modelexport.core.numerics import compare
    from modelexport.core.targets import get_target
    from modelexport.llm.weight_quality import four_bit_linears
    from modelexport.quant.llm_pt2e import llm_quant_plan, quantize_methods
    soc = get_target("SM8650")
    s = _setup(n_layers, n_samples, variants, seq)
    llm, decs, by_method, kv = s.llm, s.decoders, s.samples, s.kv_ranges
    feeds = {m: [[torch.from_numpy(x[k]) for k in d.input_names()] for x in by_method[m][:n_eval]] for m, d in decs.items()}

    def logits(forward, m):
        with torch.no_grad():
            return np.stack([forward(*f)[0].float().numpy() for f in feeds[m]])

    ref = {m: logits(d, m) for m, d in decs.items()}

    def sqnr(got):
        return {m: round(float(compare(ref[m], got[m])["sqnr_db"]), 2) for m in ref}

    plan = llm_quant_plan("16a4w_block", None, None)
    names = four_bit_linears(llm.model, 4, plan.overrides)
    rounded, times = {}, {}
    for r in ("nearest", "gptq"):
        t = time.perf_counter()
        rounded[r] = _rounded(s, plan, r)
        times[f"rounding {r} s"] = round(time.perf_counter() - t, 1)
    rows: dict = {}

    # the static decoders hold the HF model's own parameters: set there, restored after
    orig = {n: llm.model.get_submodule(n).weight.detach().clone() for n in names}

    def weights_only(label, weight_of):
        with torch.no_grad():
            for n in names:
                llm.model.get_submodule(n).weight.copy_(weight_of(n, orig[n]))
        rows[f"weights only: {label}"] = sqnr({m: logits(d, m) for m, d in decs.items()})
        with torch.no_grad():
            for n in names:
                llm.model.get_submodule(n).weight.copy_(orig[n])

    weights_only("QnnQuantizer block min-max", lambda n, w: qnn_min_max_block(w, plan.block_size))
    for r in rounded:
        weights_only(f"ONNX path {r}", lambda n, w, r=r: torch.from_numpy(rounded[r][n].dequantized(plan.block_size).T.copy()))

    weights_only("ONNX path gptq, block scales as ExecuTorch's lowering re-derives them",
                 lambda n, w: torch.from_numpy(dequantized_as_lowered(rounded["gptq"][n], plan.block_size).T.copy()))

    def fake_quant(label, rnd, tied=True):
        t = time.perf_counter()
        graphs, _, _ = quantize_methods(decs, by_method, kv if tied else {}, plan, soc, rnd)
        times[f"quantize {label} s"] = round(time.perf_counter() - t, 1)
        rows[f"fake-quant: {label}"] = sqnr({m: logits(g, m) for m, g in graphs.items()})

    if weights_only_rows:
        return {"n_layers": n_layers, "eval_samples_per_method": n_eval, "sqnr_db_vs_float": rows, "seconds": times,
                "load_avg_at_end": os.getloadavg()}
    fake_quant("QnnQuantizer min-max weights (before)", None)
    fake_quant("ONNX path nearest", rounded["nearest"])
    fake_quant("ONNX path gptq (after, the default)", rounded["gptq"])
    fake_quant("ONNX path gptq, KV ranges not tied", rounded["gptq"], tied=False)
    assert all(torch.equal(llm.model.get_submodule(n).weight, orig[n]) for n in names)   # float kept
    return {"n_layers": n_layers, "samples": n_samples, "eval_samples_per_method": n_eval,
            "variants": [f"ar{n}" for n in variants], "seq": seq, "sqnr_db_vs_float": rows, "seconds": times,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "load_avg_at_end": os.getloadavg()}


def perplexities(n_layers: int, n_samples: int, variants: list[int], seq: int, configs: list[str],
                 tokens: int = 1024) -> dict:
    """Fake-quant perplexity of the methods' converted graphs on the first `tokens` of the calibration
    text in `seq`-token windows, as `eval --stages float,fake-quant` scores a `.pte` bundle (prefill in
    arN chunks, then decode), for each weight config: "min-max" (QnnQuantizer's own, before) or a
    rounding of the ONNX path pinned ("nearest", "gptq")."""
    from modelexport.core.targets import get_target
    from modelexport.llm.model.pte_methods import method_name
    from modelexport.llm.run.pte_session import GraphForward
    from modelexport.llm.run.static_runner import StaticRunner
    from modelexport.llm.run.text import tokenize
    from modelexport.quant.llm_pt2e import llm_quant_plan, quantize_methods
    from modelexport.runtime.evaluate import perplexity
    s = _setup(n_layers, n_samples, variants, seq)
    decs = s.decoders
    ids = tokenize(s.tok, s.text.text, tokens)[:tokens]
    spec = decs[method_name(1)].spec
    out = {"float": round(perplexity(StaticRunner.from_decoder(decs[method_name(max(variants))], variants), ids, seq,
                                     "float").perplexity, 3)}
    print(out, flush=True)
    plan = llm_quant_plan("16a4w_block", None, None)
    times: dict = {}
    for config in configs:
        t = time.perf_counter()
        rounded = None if config == "min-max" else _rounded(s, plan, config)
        graphs, _, _ = quantize_methods(decs, s.samples, s.kv_ranges, plan, get_target("SM8650"), rounded)
        del rounded
        times[f"{config} weights + quantize s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        runner = StaticRunner({n: GraphForward(graphs[method_name(n)], method_name(n)) for n in variants}, spec, seq)
        out[f"fake-quant ({config})"] = round(perplexity(runner, ids, seq, config).perplexity, 3)
        times[f"{config} perplexity s"] = round(time.perf_counter() - t, 1)
        print(out, times, flush=True)
        del graphs, runner
    return {"n_layers": n_layers, "tokens": len(ids), "window": seq, "variants": [f"ar{n}" for n in variants],
            "samples": n_samples, "perplexity": out, "seconds": times,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "load_avg_at_end": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, action="append", required=True)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--eval", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--prefill", type=int, default=32)
    ap.add_argument("--weights-only", action="store_true", help="the weights-only rows alone (no quantizer)")
    ap.add_argument("--ppl", default=None, help="perplexity of these weight configs instead (e.g. min-max,gptq)")
    a = ap.parse_args()
    for n in a.layers:
        if a.ppl:
            r = perplexities(n, a.samples, [1, a.prefill], a.seq, a.ppl.split(","))
        else:
            r = run(n, a.samples, a.eval, [1, a.prefill], a.seq, a.weights_only)
        r["host"] = {"cpus": os.cpu_count(), "shared": "2 cores shared with the lead and other helpers"}
        print(json.dumps(r, indent=1), flush=True)
        results = json.loads(RESULT.read_text()) if RESULT.is_file() else {}
        results[f"{n}_layers{'_ppl' if a.ppl else '_weights_only' if a.weights_only else ''}"] = r
        RESULT.parent.mkdir(exist_ok=True)
        RESULT.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
