"""Full SmolLM2-135M-Instruct (the Q4_1 GGUF) → ExecuTorch `.pte` (`compile --format pte`), SM8650,
16a4w_block, ar1 + ar32, context 512, beside the context-binary path's recorded figures
(bench/results/llm_genie.json, llm_export_16a4w_block.json).

Measures: the cold compile in a fresh process (wall time, peak RSS of the process and of its
children: the compile runs in-process, so the process is the largest one); the program sizes (the
weight-shared `.pte` and its unshared host twin, the embedded binaries read back); the numerics the
compile recorded per method (float / fake-quant / htp-sim); then `eval` (float and fake-quant on the
first 1024 tokens of lee_background.cor in 512-token windows, the twin on the first 64) and the
greedy answer to "What is the capital of France?" on the twin. Skip those with --compile-only.
Writes bench/results/llm_pte.json. Simulator timings say nothing about a phone.
usage: python bench/llm_pte.py [--compile-only]
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
RESULT = ROOT / "results" / "llm_pte.json"
QUESTION = "What is the capital of France?"


def _recorded_context_binary() -> dict:
    """The context-binary path's figures on the same model and settings, as recorded by its benches."""
    out = {}
    genie = ROOT / "results" / "llm_genie.json"
    if genie.is_file():
        g = json.loads(genie.read_text())
        out["llm_genie.json"] = {"compile_cold_s": g.get("compile_cold_s"), "peak_rss_mb": g.get("peak_rss_mb"),
                                 "note": g.get("note")}
    block = ROOT / "results" / "llm_export_16a4w_block.json"
    if block.is_file():
        b = json.loads(block.read_text())
        a = b.get("artifacts", {})
        out["llm_export_16a4w_block.json"] = {
            "compile_cold": b.get("compile_cold"), "device_bytes": a.get("device_bytes"),
            "bytes_per_parameter": a.get("bytes_per_parameter"),
            "shared_vs_twins": {k: {"bytes": v.get("bytes"), "unshared_twins_bytes": v.get("unshared_twins_bytes")}
                                for k, v in (a.get("weight_sharing") or {}).items()}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    only_compile = ap.parse_args().compile_only
    from modelexport.zoo.assets import asset_path
    gguf = asset_path("smollm2_gguf")
    work = Path(os.environ.get("BENCH_WORK", tempfile.mkdtemp(prefix="llm_pte_bench_")))
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(work / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = {"model": gguf.name, "format": "pte", "target": "SM8650", "precision": "16a4w_block",
           "variants": ["ar1", "ar32"], "max_seq_len": 512,
           "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_at_start": os.getloadavg(),
                    "shared": "the 2 cores were shared with another helper's work and the coordinator: timings are of a loaded host"}}
    bundle = work / "bundle"
    s = measured_cli(["compile", str(gguf), "--format", "pte", "--target", "SM8650", "--variants", "ar1,ar32",
                      "--max-seq-len", "512", "-o", str(bundle), "--force"], env)
    out["host"]["load_avg_after_compile"] = os.getloadavg()
    out["compile_cold"] = {"wall_s": round(s["wall_s"], 1), "in_process_s": round(s["in_process_s"], 1),
                           "cpu_s": round(s["cpu_s"], 1),
                           "peak_rss_mb": round(s["peak_rss_mb"], 1), "peak_child_rss_mb": round(s["peak_child_rss_mb"], 1),
                           "largest_process_rss_mb": round(max(s["peak_rss_mb"], s["peak_child_rss_mb"]), 1)}
    m = json.loads((bundle / "manifest.json").read_text())
    prog = m["llm"]["pte"]["SM8650"]
    ws = m["llm"]["weight_sharing"]["SM8650/pte"]
    out["stage_timings_s"] = m["timings"]
    out["artifacts"] = {
        "parameters": m["parameters"], "pte_bytes": prog["bytes"], "host_twin_pte_bytes": prog["host_twin_bytes"],
        "bytes_per_parameter": m["llm"]["bytes_per_parameter"],
        "embedded_binary": {"shared_bytes": ws["bytes"], "unshared_twin_bytes": ws["unshared_twins_bytes"],
                            "saved_bytes": ws["saved_bytes"], "shared_weights_bytes": ws["shared_weights_bytes"],
                            "const_bytes": ws["const_bytes"], "weights_stored_once": ws["weights_stored_once"]},
        "fake_quant_pt2_bytes": {f["path"]: f["size"] for f in m["files"] if f["path"].startswith("qdq/")},
        "files_bytes": sum(f["size"] for f in m["files"])}
    out["compile_numerics"] = prog["numerics"]
    out["context_binary_path_recorded"] = _recorded_context_binary()
    RESULT.write_text(json.dumps(out, indent=2))
    if not only_compile:
        t = time.perf_counter()
        e = measured_cli(["eval", str(bundle), "--stages", "float,fake-quant,htp-sim", "--tokens", "1024",
                          "--window", "512", "--sim-window", "64", "--sim-tokens", "64", "--json"], env)
        out["eval"] = {**json.loads(e["stdout"]), "wall_s": round(time.perf_counter() - t, 1)}
        RESULT.write_text(json.dumps(out, indent=2))
        t = time.perf_counter()
        g = measured_cli(["generate", str(bundle), "--backend", "htp-sim", "--prompt", QUESTION,
                          "--max-new-tokens", "10", "--temperature", "0", "--json"], env)
        out["generation"] = {"prompt": QUESTION, **json.loads(g["stdout"]), "wall_s": round(time.perf_counter() - t, 1)}
    out["host"]["load_avg_at_end"] = os.getloadavg()
    RESULT.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
