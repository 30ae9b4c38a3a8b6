"""4-bit weight quality on the real SmolLM2-135M-Instruct (Q4_1 GGUF; the second real family, Gemma 3
270M, is measured by bench/experiments/llm_compile_profile.py --model gemma3 and `eval`: results/llm_eval_gemma3.json):
each rounding technique and the --max-ppl-ratio recipe, SM8650, ar1 + ar32, max-seq-len 512.

Two kinds of rows, each named for what it measures:
- `weights_only`: the float model with its 4-bit linears replaced by the rounded weights (exactly
  the integers and scales the graphs get; activations float), for every technique and precision:
  perplexity on the first 1024 tokens of lee_background.cor (the project's reference span; the
  calibration text's own start, which the moments saw), on its tokens 4096-5119 (held out, same
  text) and on gensim's lee.cor (held out: other text),
  the rounding's seconds and its mean relative output error on the calibration activations;
- `compiled`: the compile CLI in a fresh process (`--rounding R`, or `--max-ppl-ratio`), cold
  cache: wall time, bytes/param of the device binary, then `evaluate` of the bundle: float and
  fake-quant (the QDQ graph on ONNX Runtime's CPU EP) on the reference span, fake-quant on lee.cor,
  and the HTP simulator on a short window unless BENCH_SIM_TOKENS=0.

    python bench/llm_quality.py [--weights-only] [--compile gptq,nearest] [--recipe 1.05]
Writes bench/results/llm_quality.json (merged into what is there).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULT = ROOT / "results" / "llm_quality.json"
PRECISIONS = {"16a4w_block": 32, "16a4w": 0}
HELD_OUT_SPAN = (4096, 5120)    # lee_background.cor tokens after every span the moments may use


def _held_out_text() -> Path:
    import importlib.util  # not `import gensim`: its package import needs smart_open, absent here
    return Path(importlib.util.find_spec("gensim").origin).parent / "test" / "test_data" / "lee.cor"


def _save(out: dict) -> None:
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps(out, indent=2))


def weights_only(out: dict, roundings: list[str], precisions: dict[str, int]) -> None:
    import numpy as np
    import torch

    from modelexport.frontends import find_frontend
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.weight_quality import onnx_weight, perplexity, windows
    from modelexport.quant.input_moments import record_input_moments
    from modelexport.quant.weight_rounding import (
        ROUNDING_TOKENS,
        ROUNDINGS,
        output_error,
    )
    from modelexport.zoo.assets import asset_path

    gguf = asset_path("smollm2_gguf")
    llm = find_frontend(str(gguf)).load(str(gguf))
    model = llm.model
    text = tokenize(llm.tokenizer, read_text(None).text, HELD_OUT_SPAN[1])
    ids, held_same = text[:ROUNDING_TOKENS], text[HELD_OUT_SPAN[0]:HELD_OUT_SPAN[1]]
    held = tokenize(llm.tokenizer, read_text(_held_out_text()).text, 1024)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]  # lm_head: 8-bit
    t0 = time.perf_counter()
    mom = record_input_moments(model, windows(ids, 512), lambda m, x: m.model(input_ids=x), lambda n: n in set(names))
    rows = out.setdefault("weights_only", {})
    out["weights_only_setup"] = {"moments_tokens": mom.tokens, "moments_s": round(time.perf_counter() - t0, 1),
                                 "linears": len(names), "reference": "lee_background.cor first 1024 tokens",
                                 "held_out": f"lee.cor first {len(held)} tokens",
                                 "held_out_same_text": f"lee_background.cor tokens {HELD_OUT_SPAN[0]}-{HELD_OUT_SPAN[1] - 1}",
                                 "load_avg_after_moments": os.getloadavg()}
    rows["float"] = {"ppl_reference": round(perplexity(model, ids[:1024], 512), 3),
                     "ppl_held_out": round(perplexity(model, held, 512), 3),
                     "ppl_held_out_same_text": round(perplexity(model, held_same, 512), 3)}
    _save(out)
    for prec, block in precisions.items():
        for r in roundings:
            ws = [onnx_weight(model, n) for n in names]
            blocks = [block or w.shape[0] for w in ws]
            hs = [mom.get(n) for n in names]
            t, cpu = time.perf_counter(), time.process_time()
            bws = ROUNDINGS[r].round_all(ws, hs, blocks)
            secs, cpu = time.perf_counter() - t, time.process_time() - cpu
            deq = {n: bw.dequantized(blk) for n, bw, blk in zip(names, bws, blocks)}
            errs = [output_error(w, bw, h, blk) for w, bw, h, blk in zip(ws, bws, hs, blocks)]
            row = {"rounding_s": round(secs, 1), "rounding_cpu_s": round(cpu, 1), "load_avg": os.getloadavg(),
                   "mean_output_error_db": round(float(10 * np.log10(np.mean(errs))), 2),
                   "ppl_reference": round(perplexity(model, ids[:1024], 512, deq), 3),
                   "ppl_held_out": round(perplexity(model, held, 512, deq), 3),
                   "ppl_held_out_same_text": round(perplexity(model, held_same, 512, deq), 3)}
            for k in ("reference", "held_out", "held_out_same_text"):
                row[f"ratio_{k}"] = round(row[f"ppl_{k}"] / rows["float"][f"ppl_{k}"], 4)
            rows[f"{prec}/{r}"] = row
            print(prec, r, row, flush=True)
            _save(out)


def compiled(out: dict, label: str, extra: list[str], precision: str) -> None:
    from cli_measure import measured_cli

    from modelexport.runtime.evaluate import evaluate
    from modelexport.zoo.assets import asset_path

    gguf = asset_path("smollm2_gguf")
    work = Path(tempfile.mkdtemp(prefix="llm_quality_"))
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(work / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    bundle = work / "bundle"
    s = measured_cli(["compile", str(gguf), "--target", "SM8650", "--precision", precision, "--variants", "ar1,ar32",
                      "--max-seq-len", "512", "-o", str(bundle), "--json", *extra], env)
    m = json.loads((bundle / "manifest.json").read_text())
    row = {"flags": ["--precision", precision, *extra], "compile_wall_s": round(s["wall_s"], 1),
           "peak_rss_mb": round(s["peak_rss_mb"], 1), "stage_timings_s": m["timings"],
           "bytes_per_parameter": m["llm"]["bytes_per_parameter"], "weight_rounding": m["llm"].get("weight_rounding"),
           "quality_recipe": m["llm"].get("quality_recipe"), "load_avg_after": os.getloadavg()}
    os.environ["MODELEXPORT_CACHE_DIR"] = str(work / "cache")
    sim = int(os.environ.get("BENCH_SIM_TOKENS", "64"))
    ev = evaluate(bundle, None, stages=["float", "fake-quant"] + (["htp-sim"] if sim else []), window=512,
                  max_tokens=1024, sim_window=sim or 64, sim_tokens=sim or 64)
    row["reference"] = {k: v.get("perplexity") for k, v in ev["stages"].items()}
    row["reference"]["short"] = ev.get("short")
    row["reference"]["sqnr"] = ev.get("sqnr")
    hv = evaluate(bundle, _held_out_text(), stages=["float", "fake-quant"], window=512, max_tokens=1024)
    row["held_out"] = {k: v.get("perplexity") for k, v in hv["stages"].items()}
    for span in ("reference", "held_out"):
        row[span]["fake_quant_ratio"] = round(row[span]["fake-quant"] / row[span]["float"], 4)
    out.setdefault("compiled", {})[label] = row
    print(label, json.dumps({k: row[k] for k in ("compile_wall_s", "bytes_per_parameter", "reference", "held_out")}), flush=True)
    _save(out)
    import shutil
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights-only", default="", help="roundings to measure weights-only, e.g. nearest,seqmse,gptq,seqmse-gptq")
    ap.add_argument("--compile", default="", help="roundings to compile at --precision, e.g. gptq,nearest")
    ap.add_argument("--precision", default="16a4w_block")
    ap.add_argument("--only-precision", action="store_true", help="weights-only rows for --precision alone (default: both)")
    ap.add_argument("--recipe", type=float, default=None, help="also compile with --max-ppl-ratio R")
    a = ap.parse_args()
    out = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    out.update({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "target": "SM8650", "variants": ["ar1", "ar32"], "max_seq_len": 512,
                "second_family": "Gemma 3 270M: bench/results/llm_eval_gemma3.json, llm_compile_profile.json",
                "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                         "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}})
    if a.weights_only:
        weights_only(out, a.weights_only.split(","), {a.precision: PRECISIONS[a.precision]} if a.only_precision else PRECISIONS)
    for r in filter(None, a.compile.split(",")):
        compiled(out, f"{a.precision}/{r}", ["--rounding", r], a.precision)
    if a.recipe:
        compiled(out, f"{a.precision}/recipe-{a.recipe:g}", ["--max-ppl-ratio", str(a.recipe)], a.precision)
    out["host"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    RESULT.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
