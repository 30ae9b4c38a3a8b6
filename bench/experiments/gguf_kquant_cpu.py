"""A GGUF with K-quants (llama.cpp's Q4_K_M, Q5_K_M, ...) in the CPU runtime: what the program
keeps as stored and what it re-quantizes, and the perplexity that costs, before and after.

For the GGUF given, the default CPU program (8da4w, native kernels) is built twice: keeping the
file's blocks where our kernels compute them (`gguf_blocks`, the default) and re-quantizing every
weight from its dequantized values (`gguf_blocks=False`, what a K-quant file got before our
kernels held Q4_K / Q5_x). Perplexity on the first --tokens tokens of lee_background.cor in
--window windows, as `bench/llm_cpu_decode.py` computes it, for: the float model (the GGUF
dequantized), both programs, and llama.cpp on the same file (llama-cpp-python from
`bench/llm_cpu_decode.py`'s venv under bench/.work/, if it is there).

    .venv/bin/python bench/experiments/gguf_kquant_cpu.py FILE.gguf [--tokens 1024] [--window 512]
                                              [--llamacpp-python PATH] [--out FILE]
writes bench/results/gguf_kquant_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent           # bench/: results/, .work/ and the sibling llm_cpu_decode.py
sys.path.insert(0, str(BENCH))
RESULTS = BENCH / "results" / "gguf_kquant_cpu.json"
THREADS = 2


def program_perplexity(gguf: Path, keep: bool, ids: list[int], window: int, cache: Path) -> dict:
    from modelexport.llm.cpu.export import CpuExportOptions, build_cached
    from modelexport.llm.cpu.session import ExecuTorchSession
    from modelexport.runtime.evaluate import CpuProgramRunner, perplexity

    t = time.perf_counter()
    entry, meta, _ = build_cached(gguf, CpuExportOptions(max_seq_len=max(window, 64), gguf_blocks=keep),
                                  cache_dir=cache)
    built = time.perf_counter() - t
    session = ExecuTorchSession(entry / "model.pte", threads=THREADS)
    ppl = perplexity(CpuProgramRunner(session), ids, window, "cpu").perplexity
    return {"perplexity": round(ppl, 4), "build_or_cache_s": round(built, 1), "pte_bytes": meta["bytes"],
            "weights": meta["weights"]}


def llamacpp_perplexity(python: Path, gguf: Path, ids: list[int], window: int) -> float | str:
    from llm_cpu_decode import LLAMACPP_PPL_SCRIPT
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
    p = subprocess.run([str(python), "-c", LLAMACPP_PPL_SCRIPT, str(gguf), f.name, str(window), str(THREADS)],
                       capture_output=True, text=True, timeout=1800, check=False)
    os.unlink(f.name)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    return round(json.loads(lines[-1])["perplexity"], 4) if lines else f"failed: {p.stderr[-300:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--llamacpp-python", type=Path, default=BENCH / ".work" / "llamacpp-venv" / "bin" / "python")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--skip-requantized", action="store_true",
                    help="skip the program that re-quantizes every weight (its build is the slow part)")
    ap.add_argument("--only-kept", action="store_true",
                    help="only the default program's perplexity (e.g. with an older checkout on PYTHONPATH)")
    a = ap.parse_args()

    from modelexport.frontends.gguf_file import read_gguf_info
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.runtime.evaluate import evaluate

    info = read_gguf_info(a.gguf)
    load_before = os.getloadavg()
    cache = BENCH / ".work" / "cache"
    result = {"gguf": a.gguf.name, "bytes": a.gguf.stat().st_size, "file_types": dict(info.quant_types),
              "text": "lee_background.cor", "tokens": a.tokens, "window": a.window}
    if not a.only_kept:
        float_stage = evaluate(a.gguf, None, stages=["float"], window=a.window, max_tokens=a.tokens)["stages"]["float"]
        result["float"] = round(float_stage["perplexity"], 4)
    from modelexport.llm.cpu.export import CpuExportOptions, build_cached
    t = time.perf_counter()
    entry, _, hit = build_cached(a.gguf, CpuExportOptions(max_seq_len=max(a.window, 64)), cache_dir=cache)
    result["kept_as_stored_build_s"] = None if hit else round(time.perf_counter() - t, 1)
    from modelexport.llm.run.tokenizers import load_tokenizer_json
    ids = tokenize(load_tokenizer_json(entry / "tokenizer.json"), read_text(None).text, a.tokens)
    if not (a.skip_requantized or a.only_kept):
        result["requantized_all"] = program_perplexity(a.gguf, False, ids, a.window, cache)
    result["kept_as_stored"] = program_perplexity(a.gguf, True, ids, a.window, cache)
    if a.llamacpp_python.is_file() and not a.only_kept:
        result["llamacpp"] = llamacpp_perplexity(a.llamacpp_python, a.gguf, ids, a.window)
    result["host"] = {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                      "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                      "note": "shared machine: other jobs were running (times are indicative only)"}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
