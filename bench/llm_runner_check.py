"""SmolLM2-135M-Instruct (the Q4_1 GGUF) for ExecuTorch's qnn_llama_runner (issue 44): cold compile with
`--executorch-program` (SM8650, ar1 + ar32, context 512, 16a4w_block), then the Paris question greedy for
32 tokens through three loops over the same binaries on the HTP simulator: the program's host twin
driven as qnn_llama_runner drives it (ExecuTorch's runtime), Genie's own loop (libGenie.so), and the
bundle's loop (ONNX Runtime). Writes bench/results/llm_runner_check.json. Simulator times say nothing
about a phone.
usage: python bench/llm_runner_check.py   (an empty cache in a temp folder: a cold compile)
"""
from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from pathlib import Path

RESULT = Path(__file__).resolve().parent / "results" / "llm_runner_check.json"
QUESTION = "What is the capital of France?"
NEW_TOKENS = 32


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="llm_runner_check_"))
    os.environ["MODELEXPORT_CACHE_DIR"] = str(work / "cache")
    import modelexport
    import modelexport.llm as llm
    from modelexport.backends.llm_qnn.executorch_runner import RunnerLoop
    from modelexport.llm.run.tokenizers import load_tokenizer
    from modelexport.zoo.assets import asset_path
    out = {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "target": "SM8650", "variants": ["ar1", "ar32"],
           "max_seq_len": 512, "host": {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()}}
    t0 = time.perf_counter()
    b = modelexport.compile(str(asset_path("smollm2_gguf")), output=work / "bundle", target="SM8650",
                            variants="ar1,ar32", max_seq_len=512, executorch_program=True)
    out["compile_cold_s"] = round(time.perf_counter() - t0, 1)
    e = b.manifest.llm.executorch["SM8650"]
    out["program"] = e.model_dump(mode="json", exclude_none=True)
    out["program"]["bytes_per_parameter"] = round(e.bytes / b.manifest.parameters, 3)
    out["context_binaries_bytes"] = sum(ws.bytes for ws in b.manifest.llm.weight_sharing.values())
    tok = load_tokenizer(b.file("tokenizer/tokenizer.json"))
    ids = tok.encode_chat([{"role": "user", "content": QUESTION}])   # the same prompt ids for every loop
    runs = {}
    t0 = time.perf_counter()
    trace = RunnerLoop(b.file(e.host_twin)).generate(ids, NEW_TOKENS, e.eos_ids)
    runs["executorch (qnn_llama_runner's loop)"] = {"token_ids": trace.tokens, "text": tok.decode(trace.tokens),
                                                   "wall_s": round(time.perf_counter() - t0, 1)}
    for backend in ("genie", "htp-sim"):
        t0 = time.perf_counter()
        r = llm.load(b.path, backend=backend).generate(ids, max_new_tokens=NEW_TOKENS, temperature=0.0)
        runs[backend] = {"token_ids": r.token_ids, "text": r.text, "wall_s": round(time.perf_counter() - t0, 1)}
    for r in runs.values():
        r["paris"] = "paris" in r["text"].lower()
    eos = set(e.eos_ids)   # Genie does not report the end-of-turn token it stops on; the other loops do
    got = [r["token_ids"][:-1] if r["token_ids"] and r["token_ids"][-1] in eos else r["token_ids"] for r in runs.values()]
    out["generation"] = {"prompt": QUESTION, "chat": True, "prompt_tokens": len(ids), "new_tokens": NEW_TOKENS, **runs,
                         "same_tokens": all(g == got[0] for g in got),
                         "compared": "token ids up to the end-of-turn token (Genie does not report the EOS it stops on)"}
    out["peak_rss_mb"] = {"self": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                          "largest_child": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)}
    out["host"]["load_avg_at_end"] = os.getloadavg()
    RESULT.write_text(json.dumps(out, indent=2))
    print(json.dumps(out["generation"], indent=1))


if __name__ == "__main__":
    main()
