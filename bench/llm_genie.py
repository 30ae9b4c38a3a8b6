"""Full SmolLM2-135M-Instruct (the Q4_1 GGUF) through Qualcomm's Genie on this host: cold compile
(SM8650, ar1 + ar32, context 512, 16a4w_block), Genie's dialog creation at build time, then the
Paris question greedy through Genie's own loop (`--backend genie`, libGenie.so on the HTP simulator)
and through our loop (`--backend htp-sim`) on the same bundle: same tokens expected.
Writes bench/results/llm_genie.json. Simulator timings say nothing about a phone.
usage: python bench/llm_genie.py   (an empty cache in a temp folder: a cold compile)
"""
from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from pathlib import Path

RESULT = Path(__file__).resolve().parent / "results" / "llm_genie.json"
QUESTION = "What is the capital of France?"


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="llm_genie_"))
    os.environ["MODELEXPORT_CACHE_DIR"] = str(work / "cache")
    import modelexport
    import modelexport.llm as llm
    from modelexport.zoo.assets import asset_path
    out = {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "target": "SM8650", "variants": ["ar1", "ar32"], "max_seq_len": 512,
           "host": {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()}}
    t0 = time.perf_counter()
    b = modelexport.compile(str(asset_path("smollm2_gguf")), output=work / "bundle", target="SM8650",
                            variants="ar1,ar32", max_seq_len=512)
    out["compile_cold_s"] = round(time.perf_counter() - t0, 1)
    out["genie_check"] = b.manifest.llm.genie["SM8650"].model_dump(mode="json", exclude_none=True)
    runs = {}
    for backend in ("genie", "htp-sim"):
        t0 = time.perf_counter()
        r = llm.load(work / "bundle", backend=backend).generate(QUESTION, chat=True, max_new_tokens=10, temperature=0.0)
        runs[backend] = {"text": r.text, "token_ids": r.token_ids, "paris": "paris" in r.text.lower(),
                         "wall_s": round(time.perf_counter() - t0, 1)}
    out["generation"] = {"prompt": QUESTION, "chat": True, **runs,
                         "same_tokens": runs["genie"]["token_ids"] == runs["htp-sim"]["token_ids"]}
    out["peak_rss_mb"] = {"self": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                          "largest_child": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)}
    out["host"]["load_avg_at_end"] = os.getloadavg()
    RESULT.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
