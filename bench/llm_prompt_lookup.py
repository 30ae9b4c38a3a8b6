"""Prompt lookup (`generate --prompt-lookup N --ngram K`) on the real SmolLM2-135M-Instruct and real
text: accepted tokens per model call, equality with plain greedy decoding, and the decode speed-up
that acceptance implies on the NPU.

The model is the float SmolLM2 (the GGUF dequantized, as `eval`'s float stage loads it) in our
static decoder, run eagerly on this CPU through `StaticGraphSession` with graphs ar1, ar3, ar5, ar9
(a step of N drafts feeds 1 + N tokens) and ar64 for the prompt: how many drafts the model accepts
depends on its greedy choices, not on which runtime computes them, so the CPU tells what the HTP
would accept (up to the quantized model's own choices).

Prompts (chat template, greedy, up to 128 new tokens, EOS stops): three that invite copying, built
from real text that ships with the assets (an article of `lee_background.cor` to summarise, the
same kind of article to answer a question about, and a Python function of this repository to
edit) and one that does not (a question with nothing to copy from). For each: plain greedy
decoding, then draft 2 / 4 / 8 x ngram 1 / 2 / 3. A small model's greedy text also repeats itself
(loops), which prompt lookup copies too: `repeats_itself` says how much of the plain answer is a
4-gram the answer already holds.

Implied speed-up: a model call on 1 + N tokens runs the bundle's arN graph; its cost relative to
ar1 is taken from the HTP simulator's measured times (`ARN_COST` below, which file and value).
A run's decode cost is plain_steps * 1 + draft_steps * cost(arN) (in ar1 calls); plain decoding
costs one ar1 call per token, so

    speed-up = decoded tokens / (plain_steps + draft_steps * cost(arN) / cost(ar1))

(decoded tokens: those after the first, which comes out of the prompt's prefill). The bundle's
default graphs are ar1 + ar32, so every step with drafts runs ar32 whatever N is.

    .venv/bin/python bench/llm_prompt_lookup.py [--new-tokens 128] [--out FILE]
writes bench/results/llm_prompt_lookup.json
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "llm_prompt_lookup.json"
DRAFTS = (2, 4, 8)
NGRAMS = (1, 2, 3)
GRAPHS = (1, 3, 5, 9, 64)
MAX_SEQ_LEN = 1024

# cost(ar32) / cost(ar1) on the HTP simulator, SmolLM2-135M 16a4w, SM8650, cl512 (ar1 + ar32 bundle):
# bench/results/llm_export.json: "perplexity.stages.htp-sim.seconds_per_call" 15.399 s (ar32 calls) and
# "htp_sim_generation.stats.decode_s" 91.873 s for 8 generated tokens = 7 ar1 calls: 13.125 s each.
# bench/results/llm_export_16a8w.json (16a8w): 15.818 s per ar32 call, 86.995 s / 7 = 12.428 s per ar1 call.
ARN_COST = {
    "16a4w ar32/ar1 (bench/results/llm_export.json)": round(15.399 / (91.873 / 7), 3),
    "16a8w ar32/ar1 (bench/results/llm_export_16a8w.json)": round(15.818 / (86.995 / 7), 3),
    "memory-bound ideal (an arN step reads the weights once, as ar1 does)": 1.0,
}


def prompts(tokenizer) -> dict[str, dict]:
    from modelexport.llm.run import sampling
    from modelexport.zoo.assets import asset_path
    articles = [a.strip() for a in asset_path("lee_background").read_text().splitlines() if len(a.split()) > 150]
    summary_src = " ".join(articles[0].split()[:260])
    qa_src = " ".join(articles[3].split()[:260])
    code = inspect.getsource(sampling.apply_repetition_penalty)
    return {
        "summarise": {"copies": True, "text": f"Summarise this article in a few sentences.\n\n{summary_src}"},
        "qa": {"copies": True, "text": f"{qa_src}\n\nAccording to the article above, what happened, where, and who "
                                       "said what? Quote the article."},
        "code_edit": {"copies": True, "text": "Rename the parameter `history` to `context` in this Python function "
                                              f"and give the whole function back.\n\n```python\n{code}```"},
        "no_copy": {"copies": False, "text": "Explain in one paragraph why the sky is blue."},
    }


def load():
    import torch

    from modelexport.frontends import find_frontend
    from modelexport.llm import Generator, StaticGraphSession
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.tokenizers import load_tokenizer
    from modelexport.zoo.assets import asset_path
    gguf = asset_path("smollm2_gguf")
    torch.manual_seed(0)
    model = find_frontend(str(gguf)).load(str(gguf)).model
    decoder = build_static_decoder(model, StaticDecoderConfig(max(GRAPHS), MAX_SEQ_LEN))
    tok = load_tokenizer(gguf)
    return gguf, Generator(StaticGraphSession.from_decoder(decoder, GRAPHS), tok, backend="cpu-eager-float")


def repeats_itself(tokens: list[int], n: int = 4) -> float:
    """The share of the answer's tokens that end an n-gram the answer already held."""
    seen, hits = set(), 0
    for i in range(n - 1, len(tokens)):
        gram = tuple(tokens[i - n + 1:i + 1])
        hits += gram in seen
        seen.add(gram)
    return round(hits / max(len(tokens) - n + 1, 1), 3)


def run(gen, ids: list[int], new_tokens: int, draft: int = 0, ngram: int = 3) -> dict:
    """One greedy run; the prompt-lookup steps split into those with drafts (one arN call each) and without."""
    session = gen.session
    calls = {"draft_steps": 0}
    feed_all = session.feed_all

    def counted(token_ids):
        calls["draft_steps"] += 1
        return feed_all(token_ids)
    session.feed_all = counted
    try:
        t0 = time.perf_counter()
        res = gen.generate(ids, max_new_tokens=new_tokens, prompt_lookup=draft, ngram=ngram)
        wall = time.perf_counter() - t0
    finally:
        del session.feed_all
    s = res.stats
    decoded = max(s.generated_tokens - 1, 0)
    plain_steps = s.target_steps - calls["draft_steps"]
    return {"draft": draft, "ngram": ngram, "tokens": res.token_ids, "text": res.text, "stop": s.stop_reason,
            "generated": s.generated_tokens, "target_steps": s.target_steps, "draft_steps": calls["draft_steps"],
            "plain_steps": plain_steps, "drafted": s.drafted_tokens, "accepted": s.accepted_tokens,
            "tokens_per_step": s.tokens_per_step, "decoded": decoded,
            "speedup": {k: round(decoded / (plain_steps + calls["draft_steps"] * c), 3) if s.target_steps else None
                        for k, c in ARN_COST.items()},
            "wall_s_cpu_eager": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    t0 = time.perf_counter()
    gguf, gen = load()
    out: dict = {"model": gguf.name, "weights": "float32 (the GGUF dequantized), our static decoder, eager on this CPU",
                 "graphs": list(GRAPHS), "max_seq_len": MAX_SEQ_LEN, "new_tokens": args.new_tokens,
                 "greedy": True, "chat_template": True, "arN_cost_vs_ar1": ARN_COST,
                 "speedup_formula": "decoded / (plain_steps + draft_steps * cost(arN)/cost(ar1)); decoded = generated - 1",
                 "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                          "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]},
                 "load_s": round(time.perf_counter() - t0, 1), "prompts": {}}
    for name, p in prompts(gen.tokenizer).items():
        ids = gen.tokenizer.encode_chat([{"role": "user", "content": p["text"]}])
        plain = run(gen, ids, args.new_tokens)
        rows = []
        for draft in DRAFTS:
            for ngram in NGRAMS:
                r = run(gen, ids, args.new_tokens, draft, ngram)
                same = r["tokens"] == plain["tokens"]
                first_diff = next((i for i, (a, b) in enumerate(zip(r["tokens"], plain["tokens"])) if a != b),
                                  None if same else min(len(r["tokens"]), len(plain["tokens"])))
                rows.append({**{k: v for k, v in r.items() if k not in ("tokens", "text")},
                             "equal_to_plain": same, "first_difference": first_diff})
                print(f"{name:10s} draft {draft} ngram {ngram}: {r['tokens_per_step']} tokens/step, "
                      f"accepted {r['accepted']}/{r['drafted']}, equal {same}, "
                      f"speed-up {list(r['speedup'].values())}", flush=True)
        out["prompts"][name] = {"copies": p["copies"], "prompt_tokens": len(ids), "prompt_head": p["text"][:160],
                                "repeats_itself": repeats_itself(plain["tokens"]),
                                "plain": {k: v for k, v in plain.items() if k not in ("tokens",)}, "runs": rows}
    every = [r for p in out["prompts"].values() for r in p["runs"]]
    out["all_equal_to_plain"] = all(r["equal_to_plain"] for r in every)
    out["runs"] = len(every)
    out["host"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["total_s"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"all equal to plain greedy: {out['all_equal_to_plain']} ({len(every)} runs); wrote {args.out}")


if __name__ == "__main__":
    main()
