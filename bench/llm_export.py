"""Benchmark the LLM path on the real SmolLM2-135M-Instruct (Q4_1 GGUF), SM8650, 16a4w (or
`--precision 16a8w`), ar1 + ar32, max-seq-len 512.

Measures (the compile CLI in a fresh process, as a user runs it):
- compile wall time and peak RSS, cold (empty cache) and cached (same inputs, new output);
- artifact size: device bytes (the weight-shared context binary) per parameter;
- perplexity on lee_background.cor: float and fake-quant (first 2048 tokens, 512-token windows),
  compiled on the HTP simulator (a short window), and SQNR of the logits between the stages;
- decode steps per second on the simulator (ar1 graph) and the greedy answer to
  "What is the capital of France?" on the simulator, by our loop and by Genie's own dialog.
Writes bench/results/llm_export.json (llm_export_<precision>.json for another precision).
Simulator timings say nothing about a phone.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from cli_measure import measured_cli

ROOT = Path(__file__).resolve().parent
RESULT = ROOT / "results" / "llm_export.json"

def run_cli(args: list[str], env: dict) -> dict:
    s = measured_cli(args, env)
    return {"wall_s": round(s["wall_s"], 2), "in_process_s": round(s["in_process_s"], 2),
            "peak_rss_mb": round(s["peak_rss_mb"], 1), "peak_child_rss_mb": round(s["peak_child_rss_mb"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="16a4w")
    precision = ap.parse_args().precision
    result = RESULT if precision == "16a4w" else RESULT.with_name(f"llm_export_{precision}.json")
    from modelexport.zoo.assets import asset_path
    gguf = asset_path("smollm2_gguf")
    work = Path(os.environ.get("BENCH_WORK", tempfile.mkdtemp(prefix="llm_bench_")))
    cache = Path(os.environ.get("BENCH_CACHE", work / "cache"))
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = {"model": gguf.name, "target": "SM8650", "precision": precision, "variants": ["ar1", "ar32"], "max_seq_len": 512,
           "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_at_start": os.getloadavg()}}
    args = ["compile", str(gguf), "--target", "SM8650", "--precision", precision, "--variants", "ar1,ar32",
            "--max-seq-len", "512", "--json"]
    cold_cached = cache.exists() and any(cache.glob("llm-qdq/*/*/entry.json"))
    out["compile_cold"] = run_cli([*args, "-o", str(work / "cold"), "--force"], env)
    out["compile_cold"]["cache_was_warm"] = cold_cached
    if os.environ.get("BENCH_COLD_MEASURED"):   # a cold run measured separately (e.g. /usr/bin/time -v)
        out["compile_cold_measured_separately"] = json.loads(os.environ["BENCH_COLD_MEASURED"])
    out["compile_cached"] = run_cli([*args, "-o", str(work / "cached"), "--force"], env)
    m = json.loads((work / "cold" / "manifest.json").read_text())
    llm = m["llm"]                     # manifest schema 2
    out["stage_timings_s"] = m["timings"]
    out["artifacts"] = {"parameters": m["parameters"], "device_bytes": llm["device_bytes"],
                        "bytes_per_parameter": llm["bytes_per_parameter"],
                        "weight_sharing": llm["weight_sharing"], "n_parts": llm["n_parts"],
                        "graphs": {g["name"]: {"qnn_graph_name": g.get("qnn_graph_name"),
                                               "const_bytes": g.get("const_bytes"),
                                               "shared_weights_bytes": g.get("shared_weights_bytes"),
                                               "memory_estimate_mb": g["memory_estimate"]["total_mb"]}
                                   for g in m["graphs"]},
                        "files_bytes": sum(f["size"] for f in m["files"]),
                        "genie": llm["genie"]}
    result.parent.mkdir(exist_ok=True)
    result.write_text(json.dumps(out, indent=2))

    os.environ["MODELEXPORT_CACHE_DIR"] = str(cache)
    from modelexport.runtime.evaluate import evaluate
    # float on the reference span (2048 tokens, 512-token windows: measured 30.9 before)
    t0 = time.perf_counter()
    ref = evaluate(gguf, None, stages=["float"], window=512, max_tokens=2048, max_seq_len=512)
    out["perplexity_float_2048"] = {**ref["stages"]["float"], "seconds": round(time.perf_counter() - t0, 1)}
    result.write_text(json.dumps(out, indent=2))
    # the three stages on the same tokens (fake-quant on the CPU EP is slow: a shorter span)
    t0 = time.perf_counter()
    ev = evaluate(work / "cold", None, window=512, max_tokens=int(os.environ.get("BENCH_TOKENS", 1024)),
                  sim_window=int(os.environ.get("BENCH_SIM_WINDOW", 64)),
                  sim_tokens=int(os.environ.get("BENCH_SIM_TOKENS", 64)), progress=lambda s: print(s, flush=True))
    out["perplexity"] = ev
    out["perplexity"]["seconds"] = round(time.perf_counter() - t0, 1)
    result.write_text(json.dumps(out, indent=2))

    # decode speed + the Paris question on the simulator
    import modelexport.llm as llm_api
    model = llm_api.load(work / "cold", backend="htp-sim")
    t0 = time.perf_counter()
    res = model.generate("What is the capital of France?", chat=True, max_new_tokens=int(os.environ.get("BENCH_NEW", 10)),
                         temperature=0.0)
    out["htp_sim_generation"] = {"prompt": "What is the capital of France?", "chat": True, "text": res.text,
                                 "paris": "paris" in res.text.lower(), "stats": res.stats.to_dict(),
                                 "wall_s": round(time.perf_counter() - t0, 1)}
    st = res.stats
    out["htp_sim_decode_steps_per_s"] = st.decode_tokens_per_s
    result.write_text(json.dumps(out, indent=2))

    # the same question through Qualcomm's Genie (libGenie.so's own dialog loop on the simulator)
    genie = llm_api.load(work / "cold", backend="genie")
    t0 = time.perf_counter()
    gres = genie.generate("What is the capital of France?", chat=True, max_new_tokens=int(os.environ.get("BENCH_NEW", 10)),
                          temperature=0.0)
    out["genie_generation"] = {"prompt": "What is the capital of France?", "chat": True, "text": gres.text,
                               "paris": "paris" in gres.text.lower(), "same_tokens_as_htp_sim": gres.token_ids == res.token_ids,
                               "stats": gres.stats.to_dict(), "wall_s": round(time.perf_counter() - t0, 1)}
    result.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("compile_cold", "compile_cached", "htp_sim_decode_steps_per_s")}, indent=1))
    if "BENCH_WORK" not in os.environ:   # its own temp folder: two bundles and a cache, ~2-3 GB
        import shutil
        del model
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
