"""Several context lengths over one copy of the weights (`compile --context-lengths`) on SmolLM2-135M:
what the extra graphs cost (compile time, bytes), what a decode step at the short length saves (the
simulator's accelerator cycles per call), and whether a dialog that crosses the boundary stays
right: the logits against the float model on both sides, the same as the long graphs alone, and
Genie's own dialog on the host twins giving our loop's tokens across the boundary and after a reset.

    .venv/bin/python bench/llm_context.py [--out bench/results/llm_context.json] [--keep DIR] [--reuse]

The model is the bundled SmolLM2-135M-Instruct GGUF's weights saved as a Hugging Face folder. Both
compiles are cold (--no-cache) with the defaults (16a4w_block, ar1 + ar32): `--context-lengths
256,512` against `--max-seq-len 512`. Text: the calibration text's held-out last quarter. On this
2-core host an ar32 call of the 30 layers takes about 28 s on the simulator and an ar1 call 8.5 s,
so the dialogs are short: the first crosses the boundary, the second follows a reset.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "llm_context.json"
SHORT, LONG, AR = 256, 512, 32
TOKENS = 288            # nine ar32 chunks: the first eight on cl256 (positions < 256), the ninth on cl512
PROMPT, NEW = 232, 28   # Genie's first turn: decode (ar1) crosses from cl256 to cl512 after position 255
SECOND = 40             # the second turn's prompt, after a reset (8 new tokens)
CYCLE_RUNS = 2          # after a warm-up; detailed profiling's cycle counts agree to 0.02 % between runs


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_folder(work: Path) -> Path:
    sys.path.insert(0, str(ROOT.parent / "tests"))
    from llm_tiny import save_real_layers
    from modelexport.zoo.assets import asset_path
    folder = work / "smollm2_hf"
    if not (folder / "config.json").is_file():
        save_real_layers(asset_path("smollm2_gguf"), folder, n_layers=30)
    return folder


def compile_bundle(folder: Path, out: Path, flags: list[str], reuse: bool) -> dict:
    cmd = [sys.executable, "-m", "modelexport", "compile", str(folder), "-o", str(out), "--no-cache", "--force", *flags]
    wall = None
    if not (reuse and (out / "manifest.json").is_file()):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = round(time.perf_counter() - t0, 1)
        if proc.returncode != 0:
            raise SystemExit(f"compile failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    twins = sum(f["size"] for f in m["files"] if f["role"] == "host-context-binary")
    ws = next(iter(m["llm"]["weight_sharing"].values()))
    return {"flags": flags, "wall_s": wall, "compile_total_s": round(m["timings"]["total_s"], 1),
            "graphs": sorted(g["name"] for g in m["graphs"]), "device_bytes": m["llm"]["device_bytes"],
            "bytes_per_parameter": m["llm"]["bytes_per_parameter"], "weights_stored_once": ws["weights_stored_once"],
            "shared_weights_bytes": ws["shared_weights_bytes"], "host_twin_bytes": twins,
            "genie_dialog": (m["llm"].get("genie") or {}).get("SM8650", {}).get("dialog_checked_on")}


def held_out_ids(folder: Path, n: int, skip: int = 0) -> list[int]:
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import load_tokenizer
    tok = load_tokenizer(folder / "tokenizer.json")
    text = read_text(None).text
    return tokenize(tok, text[len(text) * 3 // 4:], n + skip)[skip:skip + n]


def float_logits(folder: Path, ids: list[int]):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def runner(bundle, lengths: set[int] | None = None):
    from modelexport.backends.llm_qnn.session import open_forwards
    from modelexport.llm.run.static_runner import StaticRunner
    graphs, spec, seq = open_forwards(bundle, "htp-sim")
    if lengths is not None:
        graphs = {k: g for k, g in graphs.items() if (k[1] if isinstance(k, tuple) else seq) in lengths}
    return StaticRunner(graphs, spec, seq)


def logits_check(bundle, ref, ids) -> dict:
    """ar32 chunks through every graph (moving to cl512 at position 256) and through the long graphs alone:
    SQNR against float on each side of the boundary."""
    from modelexport.core.numerics import sqnr_db
    both, alone = runner(bundle), runner(bundle, {LONG})
    got, long_only = (r.feed(ids).numpy() for r in (both, alone))
    edge = SHORT                 # positions 0..255 run on cl256, from 256 on cl512
    out = {"calls": list(zip(both.chunks, both.lengths)), "boundary_position": edge}
    for name, (a, z) in {"before": (0, edge), "after": (edge, len(ids)), "all": (0, len(ids))}.items():
        out[name] = {k: {"sqnr_db": round(sqnr_db(ref[a:z], x[a:z]), 2),
                         "top1": round(float((ref[a:z].argmax(-1) == x[a:z].argmax(-1)).mean()), 3)}
                     for k, x in (("both_lengths", got), ("long_graphs_alone", long_only))}
    out["both_vs_long_alone_sqnr_db"] = {name: round(sqnr_db(long_only[a:z], got[a:z]), 2)
                                         for name, (a, z) in {"before": (0, edge), "after": (edge, len(ids))}.items()}
    return out


def genie_check(bundle, folder: Path) -> dict:
    """Genie's dialog (two turns, a reset between) against our loop over the same twins."""
    import modelexport.llm as llm
    from modelexport.backends.llm_qnn.genie_dialog import genie_turns, sampler_block
    turns = [(held_out_ids(folder, PROMPT), NEW), (held_out_ids(folder, SECOND, skip=1000), 8)]
    t0 = time.perf_counter()
    model = llm.load(bundle.path, backend="htp-sim")
    ours = [model.generate(ids, max_new_tokens=n).token_ids for ids, n in turns]
    ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    genie = genie_turns(bundle, "SM8650", turns, sampler_block())
    return {"turns": [{"prompt_tokens": len(ids), "new_tokens": n, "ours": o, "genie": g, "equal": o == g}
                      for (ids, n), o, g in zip(turns, ours, genie)],
            "crosses_at_step": SHORT - 1 - PROMPT, "htp_sim_s": round(ours_s, 1), "genie_s": round(time.perf_counter() - t0, 1)}


def cycles(bundle) -> dict:
    """Each graph's accelerator cycles per call on the simulator (detailed profiling: basic gives times
    only; zeros fed, the fewest of CYCLE_RUNS runs, the simulator's threads on one host core)."""
    import numpy as np
    import onnxruntime as ort

    from modelexport.core.targets import get_target
    from modelexport.profiling.qnn_csv import read_qnn_csv
    from modelexport.toolchain.htp_options import run_provider_options
    from modelexport.toolchain.ort_qnn import SessionPlan, session_options
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int32)": np.int32,
             "tensor(int64)": np.int64, "tensor(uint16)": np.uint16, "tensor(uint8)": np.uint8}
    out = {}
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        for g in bundle.manifest.graphs:
            with tempfile.TemporaryDirectory() as d:
                csv = Path(d) / "qnn.csv"
                opts = run_provider_options(get_target(g.target).soc_model, None) | {
                    "profiling_level": "detailed", "profiling_file_path": str(csv)}
                sess = ort.InferenceSession(str(bundle.file(g.host_twin.epcontext_model)),
                                            sess_options=session_options(SessionPlan(provider_options=opts)))
                feed = {i.name: np.zeros(i.shape, types[i.type]) for i in sess.get_inputs()}
                for _ in range(CYCLE_RUNS + 1):
                    sess.run(None, feed)
                del sess
                gc.collect()                 # the QNN EP writes its CSV when the session goes away
                runs = [r.accel_cycles for r in read_qnn_csv(csv).runs[1:] if r.accel_cycles]
                out[g.name] = min(runs) if runs else None
    finally:
        os.sched_setaffinity(0, allowed)
    return out


def phase(work: Path, name: str, run) -> dict:
    """A measurement kept in the work folder (--keep): a run that stops part-way resumes after it."""
    path = work / f"phase_{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    out = run()
    path.write_text(json.dumps(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--keep", default=None, help="work folder to keep (default: a temporary one, removed)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: measure the bundles the folder already holds")
    args = ap.parse_args()
    from modelexport.contract import open_bundle
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="llm-context-")
    work = Path(args.keep or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    folder = make_folder(work)
    result = {"model": "SmolLM2-135M-Instruct (the bundled GGUF's weights as an HF folder)",
              "context_lengths": [SHORT, LONG], "variants": ["ar1", f"ar{AR}"], "precision": "16a4w_block",
              "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "load_avg_at_start": list(os.getloadavg())}}
    result["compile"] = {"both_lengths": compile_bundle(folder, work / "both", ["--context-lengths", f"{SHORT},{LONG}"], args.reuse),
                         "single_length": compile_bundle(folder, work / "single", ["--max-seq-len", str(LONG)], args.reuse)}
    c = result["compile"]
    c["ratios"] = {"compile_s": round(c["both_lengths"]["compile_total_s"] / c["single_length"]["compile_total_s"], 3),
                   "device_bytes": round(c["both_lengths"]["device_bytes"] / c["single_length"]["device_bytes"], 4)}
    both = open_bundle(work / "both")
    ids = held_out_ids(folder, TOKENS)
    say("logits: both lengths, then the long graphs alone")
    result["logits"] = phase(work, "logits", lambda: logits_check(both, float_logits(folder, ids), ids))
    say("cycles per call")
    cyc = phase(work, "cycles", lambda: cycles(both))
    result["cycles_per_call"] = cyc
    result["cycles_ratio_short_vs_long"] = {
        f"ar{n}": round(cyc[f"{'token' if n == 1 else 'prompt'}_ar{n}_cl{SHORT}_1_of_1"]
                        / cyc[f"{'token' if n == 1 else 'prompt'}_ar{n}_cl{LONG}_1_of_1"], 3) for n in (1, AR)}
    say("Genie's dialog and our loop, two turns")
    result["genie"] = phase(work, "genie", lambda: genie_check(both, folder))
    result["host"]["load_avg_at_end"] = list(os.getloadavg())
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("cycles_ratio_short_vs_long",)} | {"ratios": c["ratios"]}, indent=1))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
