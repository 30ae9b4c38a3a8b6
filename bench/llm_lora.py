"""LoRA adapters on SmolLM2-135M: compile time and bytes with and without `--lora`, and how close the
bundle's logits on the HTP simulator come to PEFT's own model on the float weights, per adapter.

The base is the bundled SmolLM2-135M-Instruct GGUF's weights saved as a Hugging Face folder (what
`--lora` takes). No trained adapter of it is on the package index, so the adapters are PEFT's own
LoRA layers with random B (A as PEFT initializes it), scaled so that each moves the float model's
logits about as far as a fine-tune does (top-1 agreement with the base well below 100 %):
`attn` r=8 on q/k/v/o, `mlp` r=16 on all seven projections (both compiled in), and `later` r=8 on
q/v, applied at run time to the same bundle without a recompile.

    .venv/bin/python bench/llm_lora.py [--out bench/results/llm_lora.json] [--keep DIR]

Each compile is cold (--no-cache) with the defaults (16a4w_block, ar1 + ar32, context 512).
Logits: the first 96 tokens of the calibration text's held-out end (the text compile does not
calibrate on), fed in ar32 chunks; SQNR in dB against PEFT's float model, and top-1 agreement.
`delta_sqnr_db`: the adapter's own contribution (its logits minus the base's) on the simulator
against the float model's: the base's quantization error is in both and cancels.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "llm_lora.json"
ADAPTERS = {"attn": (8, ["q_proj", "k_proj", "v_proj", "o_proj"], 1),
            "mlp": (16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 2),
            "later": (8, ["q_proj", "v_proj"], 3)}
B_STD = 0.02          # lora_B ~ N(0, B_STD): moves the logits as a fine-tune does (see top1_vs_base in the JSON)
TOKENS = 96


def make_inputs(work: Path, b_std: float) -> Path:
    """SmolLM2's weights as an HF folder and the three PEFT adapters."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT.parent / "tests"))
    from llm_tiny import save_real_layers
    from modelexport.zoo.assets import asset_path
    folder = work / "smollm2_hf"
    if not (folder / "config.json").is_file():
        save_real_layers(asset_path("smollm2_gguf"), folder, n_layers=30)
    for name, (r, targets, seed) in ADAPTERS.items():
        if (work / name / "adapter_config.json").is_file():
            continue
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(folder),
                               LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, lora_dropout=0.0))
        torch.manual_seed(seed)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, b_std)
        model.save_pretrained(work / name)
    return folder


def compile_bundle(folder: Path, out: Path, lora: list[Path], reuse: bool) -> dict:
    """A cold compile (or, with --reuse, the bundle a kept work folder holds): its seconds and bytes."""
    cmd = [sys.executable, "-m", "modelexport", "compile", str(folder), "-o", str(out), "--no-cache", "--force"]
    for a in lora:
        cmd += ["--lora", str(a)]
    wall = None
    if not (reuse and (out / "manifest.json").is_file()):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = round(time.perf_counter() - t0, 1)
        if proc.returncode != 0:
            raise SystemExit(f"compile failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    sizes = {}
    for f in m["files"]:
        if f["role"] in ("lora-adapter", "lora-inputs"):
            sizes[f["role"]] = sizes.get(f["role"], 0) + f["size"]
    return {"wall_s": wall, "compile_total_s": round(m["timings"]["total_s"], 1), "device_bytes": m["llm"]["device_bytes"],
            "bytes_per_parameter": m["llm"]["bytes_per_parameter"], "peft_files_bytes": sizes.get("lora-adapter", 0),
            "genie_lora_files_bytes": sizes.get("lora-inputs", 0), "lora": m["llm"].get("lora"),
            "genie_dialog": (m["llm"].get("genie") or {}).get("SM8650", {}).get("dialog_checked_on")}


def text_ids(folder: Path) -> list[int]:
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import load_tokenizer
    tok = load_tokenizer(folder / "tokenizer.json")
    text = read_text(None).text
    return tokenize(tok, text[len(text) * 3 // 4:], TOKENS)[:TOKENS]


def float_logits(folder: Path, adapter: Path | None, ids: list[int]):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def sim_logits(bundle_path: Path, adapter: str | None, ids: list[int]):
    from modelexport.backends.llm_qnn.session import apply_lora, open_forwards
    from modelexport.contract import open_bundle
    from modelexport.llm.run.static_runner import StaticRunner
    bundle = open_bundle(bundle_path)
    graphs, spec, seq = open_forwards(bundle, "htp-sim")
    if adapter is not None or bundle.manifest.llm.lora:
        apply_lora(bundle, graphs, adapter)
    t0 = time.perf_counter()
    out = StaticRunner(graphs, spec, seq).feed(ids).numpy()
    return out, time.perf_counter() - t0


def score(ref, got, base=None) -> dict:
    d = {"sqnr_db": round(sqnr_db(ref, got), 2), "top1_agreement": round(float((ref.argmax(-1) == got.argmax(-1)).mean()), 3)}
    if base is not None:   # how far the adapter moves the float model
        d["float_top1_vs_base"] = round(float((ref.argmax(-1) == base.argmax(-1)).mean()), 3)
        d["float_sqnr_vs_base_db"] = round(sqnr_db(ref, base), 2)
    return d


def sqnr_db(ref, got) -> float:
    from modelexport.core.numerics import sqnr_db as sqnr
    return sqnr(ref, got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--keep", default=None, help="work folder to keep (default: a temporary one, removed)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: measure the bundles the folder already holds")
    ap.add_argument("--b-std", type=float, default=B_STD, help=f"lora_B ~ N(0, this) (default {B_STD}: about a fine-tune's "
                    "effect; 0.1 moves the logits further than 16a4w_block's own error, so the adapter's part stands out)")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="llm-lora-"))
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    try:
        folder = make_inputs(work, args.b_std)
        ids = text_ids(folder)
        base_c = compile_bundle(folder, work / "base", [], args.reuse)
        lora_c = compile_bundle(folder, work / "lora", [work / "attn", work / "mlp"], args.reuse)
        f_base = float_logits(folder, None, ids)
        rows = {"base bundle, no adapter": score(f_base, sim_logits(work / "base", None, ids)[0])}
        seconds = {}
        sim_base = None
        for name in (None, "attn", "mlp", str(work / "later")):
            label = Path(name).name if name else None
            sim, seconds[label or "base"] = sim_logits(work / "lora", name, ids)
            ref = float_logits(folder, work / label if label else None, ids)
            row = score(ref, sim, f_base if label else None)
            if label is None:
                sim_base = sim
            else:   # the adapter's own contribution, on the simulator against the float model's; and how
                #     far the simulator's logits are from the base's float ones (an adapter not applied: as close)
                row["delta_sqnr_db"] = round(sqnr_db(ref - f_base, sim - sim_base), 2)
                row["sqnr_vs_float_base_db"] = round(sqnr_db(f_base, sim), 2)
                row["top1_vs_float_base"] = round(float((f_base.argmax(-1) == sim.argmax(-1)).mean()), 3)
            rows[f"lora bundle, {label or 'no adapter'}{' (run time, not compiled in)' if label == 'later' else ''}"] = row
        result = {"model": "SmolLM2-135M-Instruct (the bundled GGUF's weights as an HF folder)",
                  "options": "SM8650, 16a4w_block, ar1 + ar32, context 512, cold (--no-cache)",
                  "adapters": {k: {"rank": r, "targets": t, "lora_B_std": args.b_std} for k, (r, t, _) in ADAPTERS.items()},
                  "tokens": len(ids), "text": "lee_background.cor, its last quarter (held out from calibration)",
                  "compile": {"base": base_c, "with --lora attn --lora mlp": lora_c},
                  "compile_time_ratio": round(lora_c["compile_total_s"] / base_c["compile_total_s"], 3),
                  "device_bytes_ratio": round(lora_c["device_bytes"] / base_c["device_bytes"], 4),
                  "logits_vs_peft_float": rows, "simulator_feed_s": {k: round(v, 2) for k, v in seconds.items()},
                  "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in load0],
                           "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
