"""Does the host libGenie (QAIRT 2.51 in the onnxruntime-qnn wheel) run its speculative dialog types
on a bundle's host twins, and do their greedy tokens equal its basic dialog's?

A tiny untied Llama (tests/llm_tiny.py; its greedy text varies) is compiled here with ar1 + ar8 at
a 128-token context; the bundle's own genie_config.json is run with `type` "basic" and with the
speculative types written by hand:

- "lade" (lookahead decoding, Jacobi iterations with an n-gram pool): the config's optional block
  {"version": 1, "window": W, "ngram": N, "gcap": G, "update-mode": ...}; a step feeds
  (W + G) * (N - 1) tokens, which must fit the arN graph (8 here);
- "spd" (a draft model): two engines with "role" "target" and "draft" and {"version": 1,
  "draft-len": K}; the same twins serve as both, which only asks whether the host runs the type;
- "ssd-q1" needs a model trained with forecast tokens and a KV prefix ("forecast-prefix-name"):
  not something a plain model has, so not tried.

Our own loop on the same binaries (`--backend htp-sim`) is run too, plain and with prompt lookup.

    .venv/bin/python bench/experiments/genie_speculative.py
writes bench/results/genie_speculative.json
"""
from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "genie_speculative.json"
NEW_TOKENS = 24
PROMPT = "Markets rose on Tuesday as investors weighed the outlook"
LADE = {"lade_defaults": None,
        "lade_w2_n3_g2": {"version": 1, "window": 2, "ngram": 3, "gcap": 2},
        "lade_w2_n3_g2_fwd_max_hit": {"version": 1, "window": 2, "ngram": 3, "gcap": 2, "update-mode": "FWD_MAX_HIT"},
        "lade_w1_n2_g1": {"version": 1, "window": 1, "ngram": 2, "gcap": 1},
        "lade_w4_n2_g4": {"version": 1, "window": 4, "ngram": 2, "gcap": 4}}


def build(work: Path):
    sys.path.insert(0, str(ROOT / "tests"))
    import llm_tiny

    import modelexport
    llm_tiny.tiny_llama(2, tie_word_embeddings=False).save_pretrained(work / "tiny_hf")
    llm_tiny.tiny_tokenizer().save(work / "tiny_hf")
    (work / "calib.txt").write_text(llm_tiny.CALIBRATION_TEXT)
    return modelexport.compile(str(work / "tiny_hf"), output=work / "bundle", target="SM8650", precision="16a4w",
                               variants="ar1,ar8", max_seq_len=128, calibration=str(work / "calib.txt"),
                               calibration_samples=4), llm_tiny.tiny_tokenizer()


def configs(bundle) -> dict[str, dict]:
    from modelexport.backends.llm_qnn.genie_dialog import bundle_config, sampler_block
    base = bundle_config(bundle, "SM8650", sampler_block())
    base["dialog"]["context"]["bos-token"] = -1          # the prompt's ids go in as they are
    out = {"basic": base}
    for name, block in LADE.items():
        cfg = copy.deepcopy(base)
        cfg["dialog"]["type"] = "lade"
        if block is not None:
            cfg["dialog"]["lade"] = block
        out[name] = cfg
    spd = copy.deepcopy(base)
    target, draft = copy.deepcopy(spd["dialog"]["engine"]), copy.deepcopy(spd["dialog"]["engine"])
    target["role"], draft["role"] = "target", "draft"
    spd["dialog"].update(type="spd", engine=[target, draft], spd={"version": 1, "draft-len": 3})
    out["spd_same_twins_as_draft"] = spd
    return out


def main() -> None:
    from modelexport.toolchain.genie import genie_messages, run_dialog
    with tempfile.TemporaryDirectory(prefix="genie-spec-") as d:
        os.environ["MODELEXPORT_CACHE_DIR"] = str(Path(d) / "cache")
        t0 = time.perf_counter()
        bundle, tok = build(Path(d))
        out: dict = {"bundle": "tiny untied Llama (tests/llm_tiny.py), 16a4w, ar1 + ar8, context 128, SM8650 host twins",
                     "library": "libGenie.so of onnxruntime-qnn (QAIRT 2.51)", "prompt": PROMPT,
                     "max_new_tokens": NEW_TOKENS, "greedy": True, "compile_s": round(time.perf_counter() - t0, 1),
                     "dialogs": {}}
        ids = tok.encode(PROMPT)
        import modelexport.llm as llm
        ours = llm.load(bundle.path, backend="htp-sim")
        plain = ours.generate(ids, max_new_tokens=NEW_TOKENS, stop_on_eos=False)
        look = ours.generate(ids, max_new_tokens=NEW_TOKENS, stop_on_eos=False, prompt_lookup=4, ngram=2)
        out["htp_sim_our_loop"] = {"tokens": plain.token_ids, "prompt_lookup_4_equal": look.token_ids == plain.token_ids,
                                   "prompt_lookup_stats": {k: getattr(look.stats, k) for k in
                                                           ("target_steps", "drafted_tokens", "accepted_tokens",
                                                            "tokens_per_step")}}
        for name, cfg in configs(bundle).items():
            got: list[int] = []
            t = time.perf_counter()
            status, stderr = run_dialog(cfg, {"tokens": ids, "max_new_tokens": NEW_TOKENS}, timeout=1800,
                                        on_event=lambda e, got=got: got.extend(e["ids"]) if e["event"] == "tokens" else None)
            row = {"type": cfg["dialog"]["type"], "block": cfg["dialog"].get("lade") or cfg["dialog"].get("spd"),
                   "status": status, "tokens": got, "n_tokens": len(got), "wall_s": round(time.perf_counter() - t, 1),
                   "genie_says": genie_messages(stderr)}
            basic = out["dialogs"].get("basic", {}).get("tokens")
            if basic is not None:
                n = min(len(basic), len(got))
                row["first_tokens_equal_basic"] = bool(n) and got[:n] == basic[:n]
                row["stopped_at_max_new_tokens"] = len(got) == NEW_TOKENS
            out["dialogs"][name] = row
            print(name, json.dumps({k: v for k, v in row.items() if k != "tokens"}), flush=True)
        out["basic_equals_our_loop"] = out["dialogs"]["basic"]["tokens"] == plain.token_ids
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
