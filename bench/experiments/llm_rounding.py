"""The 4-bit weights' data-aware rounding step alone (llm/weight_quality.plan_weights, `--rounding
gptq`, 16a4w_block blocks of 32): its seconds and the process's peak RSS while it runs, on the
real SmolLM2-135M GGUF or on a Llama-3.2-1B-shaped random bf16 model (bench/llm_sizes.py builds it).

    python bench/experiments/llm_rounding.py --model smollm2 [--ppl] [--save W.npz] [--compare W.npz]
    python bench/experiments/llm_rounding.py --model llama-1b --work /tmp/w [--layers 2]

The model is loaded as a compile loads it (a bf16 folder held in bf16); the RSS is sampled every
0.1 s during the step, and reported beside the RSS just before it (the model and Python). With
--ppl, the held-out perplexity (the 1024 tokens of the calibration text after the rounding's 2048,
windows of 512) of the float model and of the rounded weights substituted into it. Run it with
PYTHONPATH pointing at another checkout's src/ to measure that one (plan_weights' signature is the
same). Prints one JSON line; the load average is in it: this machine is shared.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # bench/: the sibling llm_sizes.py


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load(model: str, work: Path):
    import torch

    from modelexport.frontends import find_frontend
    from modelexport.llm.export.weight_dtype import store_bf16
    if model == "smollm2":
        from llm_sizes import smollm2_gguf
        src, bf16 = smollm2_gguf(), False
    else:
        from llm_sizes import build_folder
        src, bf16 = build_folder(model, work / f"{model}_hf"), True
    fe = find_frontend(str(src))
    llm = fe.load(str(src), dtype=torch.bfloat16) if bf16 else fe.load(str(src))
    if bf16:
        store_bf16(llm.model, "bfloat16")
    return llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "llama-1b"], required=True)
    ap.add_argument("--work", default=None, help="where the 1B-shaped folder is built (reused)")
    ap.add_argument("--ppl", action="store_true", help="held-out perplexity, float and rounded")
    ap.add_argument("--save", help="copy the rounded weights' .npz here")
    ap.add_argument("--compare", help="the share of integers equal to this .npz's")
    ap.add_argument("--layers", type=int, help="round only the first N decoder layers' linears (the peak "
                    "recurs every layer; a loaded host takes minutes per 1B layer)")
    a = ap.parse_args()
    import numpy as np
    import torch

    import modelexport
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.llm.weight_quality import HELD_OUT_TOKENS, four_bit_linears, perplexity, plan_weights
    from modelexport.quant.block_weights import BlockWeight
    from modelexport.quant.llm_graphs import DEFAULT_OVERRIDES, parse_overrides
    from modelexport.quant.weight_rounding import ROUNDING_TOKENS
    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(a.work or tempfile.mkdtemp(prefix="llm_rounding_"))
    work.mkdir(parents=True, exist_ok=True)
    llm = load(a.model, work)
    model = llm.model
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    ids = tokenize(tok, read_text(None).text, ROUNDING_TOKENS + HELD_OUT_TOKENS)
    overrides = list(reversed(parse_overrides(list(DEFAULT_OVERRIDES), "16a4w_block")))
    names = four_bit_linears(model, 4, overrides)
    if a.layers:
        names = [n for n in names if int(n.split("layers.")[1].split(".")[0]) < a.layers]
    window = 512
    before = _rss()
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.wait(0.1):
            peak[0] = max(peak[0], _rss())
    threading.Thread(target=sample, daemon=True).start()
    load0, t0, c0 = os.getloadavg(), time.perf_counter(), time.process_time()
    plan = plan_weights(model, ids, window, names, "gptq", 32, work / "rounding", None, lambda m: print(m, file=sys.stderr))
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    done.set()
    peak[0] = max(peak[0], _rss())
    out = {"model": a.model, "code": str(Path(modelexport.__file__).parents[2]), "linears": len(names), "layers": a.layers,
           "tokens": plan.rounding.get("tokens"), "rounding_step_s": round(secs, 1), "cpu_s": round(cpu, 1),
           "record": plan.rounding, "rss_before_gb": round(before / 2**30, 2), "peak_rss_gb": round(peak[0] / 2**30, 2),
           "step_rss_gb": round((peak[0] - before) / 2**30, 2),
           "load_avg_start": [round(x, 2) for x in load0], "load_avg_end": [round(x, 2) for x in os.getloadavg()]}
    z = np.load(plan.rounded_path, allow_pickle=False)
    if a.compare:
        with np.load(a.compare, allow_pickle=False) as ref:
            eq = [float((z[f"{n}|q"] == ref[f"{n}|q"]).mean()) for n in names]
            out["equal_to_compare"] = {"q_mean": round(float(np.mean(eq)), 6), "q_min": round(min(eq), 6),
                                       "block_scales_all_equal": all((z[f"{n}|block_scales"] == ref[f"{n}|block_scales"]).all()
                                                                     for n in names)}
    if a.save:
        import shutil
        shutil.copy(plan.rounded_path, a.save)
    if a.ppl:
        held = ids[ROUNDING_TOKENS:ROUNDING_TOKENS + HELD_OUT_TOKENS]
        deq = {n: BlockWeight(z[f"{n}|q"], z[f"{n}|block_scales"], z[f"{n}|channel_scale"]).dequantized(32) for n in names}
        f, q = perplexity(model, held, window), perplexity(model, held, window, deq)
        out["held_out_ppl"] = {"tokens": len(held), "float": round(f, 3), "rounded": round(q, 3), "ratio": round(q / f, 4)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
