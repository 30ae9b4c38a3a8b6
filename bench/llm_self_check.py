"""What an LLM compile's own numerics check measures on real models, and what it costs.

    python bench/llm_self_check.py [--models smollm2,gemma3-270m] [--precision 16a4w_block] [--work DIR]
    python bench/llm_self_check.py --bundle OUT --name llama-8b     # the check alone, on a bundle made without it

Each real GGUF the assets ship is compiled as a user compiles it (`python -m modelexport compile
GGUF -o OUT --json`, defaults: SM8650, ar1 + ar32, cl 512, a fresh cache), and the manifest's
`numerics` (the host twins on the simulator against the float decoder on held-out text) is recorded
beside the check's seconds and the compile's: the check's cost as a share of the compile, both
measured in the same run on the same machine. Writes bench/results/llm_self_check.json.
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

ROOT = Path(__file__).resolve().parent
RESULT = ROOT / "results" / "llm_self_check.json"
MODELS = {"smollm2": "smollm2_gguf", "gemma3-270m": "gemma3_270m_gguf"}


def compile_one(name: str, precision: str, work: Path) -> dict:
    from modelexport.zoo.assets import asset_path
    src = asset_path(MODELS[name])
    out, cache = work / f"{name}_{precision}", work / f"cache_{name}_{precision}_{int(time.time())}"
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "modelexport", "compile", str(src), "--precision", precision,
                           "-o", str(out), "--force", "--json"], env=env, capture_output=True, text=True, check=False)
    wall = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0:
        return {"rc": proc.returncode, "error": proc.stderr[-2000:]}
    m = json.loads((out / "manifest.json").read_text())
    num, t = m["numerics"], m["timings"]
    return {"rc": 0, "source": src.name, "precision": precision, "compile_wall_s": wall,
            "numerics_s": t.get("numerics_s"), "check_share_of_compile": round(t["numerics_s"] / wall, 3),
            "numerics": {k: num.get(k) for k in ("outputs", "calls", "samples", "inputs", "text", "threshold_db",
                                                 "passed", "fake_quant", "compiled_vs_fake_quant_db")}}


def check_existing(bundle_dir: Path, work: Path) -> dict:
    """Compile's check run by hand on a bundle built before the check existed (bench/llm_sizes.py's 8B): the
    float logits recorded from the bundle's source the way the quantized stage records them, then the
    host twins over the same tokens (one part at a time when they do not fit the simulator together)."""
    from types import SimpleNamespace

    import torch

    from modelexport.backends.llm_qnn.self_check import check_bundle
    from modelexport.contract import open_bundle
    from modelexport.frontends import find_frontend
    from modelexport.llm.export.reference import check_window, record_reference
    from modelexport.llm.run.text import read_text
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.quant.precision import pass_mark
    b = open_bundle(bundle_dir)
    m, t0 = b.manifest, time.perf_counter()
    src = Path(m.source.path)
    llm = find_frontend(str(src)).load(str(src), dtype=torch.bfloat16) if src.is_dir() else find_frontend(str(src)).load(str(src))
    tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
    lengths = tuple(m.llm.context_lengths or [m.llm.max_seq_len])
    plan = SimpleNamespace(variants=tuple(m.llm.variants), max_seq_len=m.llm.max_seq_len, lengths=lengths,
                           text=read_text(m.calibration["llm"]["text"]), quality=m.llm.quality_recipe)
    entry = work / f"reference_{bundle_dir.name}"
    window = check_window(plan, tok, int(m.calibration["llm"]["tokens"]))
    record_reference(llm.model, plan, window, entry)
    reference_s = round(time.perf_counter() - t0, 1)
    del llm
    num = check_bundle(b, entry, pass_mark(None, m.precision), print)
    return {"bundle": str(bundle_dir), "precision": m.precision, "parameters": m.parameters, "reference_s": reference_s,
            "numerics_s": num.get("seconds"), "numerics": {k: num.get(k) for k in (
                "outputs", "calls", "samples", "inputs", "text", "threshold_db", "passed", "fake_quant",
                "compiled_vs_fake_quant_db")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--precision", default="16a4w_block")
    ap.add_argument("--work", default=None, help="where bundles and caches go (default: a temporary folder)")
    ap.add_argument("--bundle", default=None, help="check this bundle (made without the check) instead of compiling")
    ap.add_argument("--name", default=None, help="--bundle: the name its entry is recorded under")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="llm_self_check_"))
    work.mkdir(parents=True, exist_ok=True)
    load = [round(x, 2) for x in os.getloadavg()]
    todo = [(a.name or Path(a.bundle).name, None)] if a.bundle else [(n, n) for n in a.models.split(",")]
    for key, name in todo:
        entry = compile_one(name, a.precision, work) if name else check_existing(Path(a.bundle), work)
        entry["host"] = {"cpus": os.cpu_count(), "load_avg_at_start": load,
                         "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}
        results = json.loads(RESULT.read_text()) if RESULT.exists() else {}   # read now: another run may have written
        results[f"{key}_{a.precision}" if name else f"{key}_checked_after"] = entry
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(results, indent=2))
        print(json.dumps({key: entry}, indent=2))


if __name__ == "__main__":
    main()
