"""Where the compiled Gemma 3 decoder departs from its own QDQ graphs: Gemma 3 270M (the real GGUF)
cut to its first N layers, compiled as tests/test_llm_real_gemma3.py compiles its cut (ar32, context
128, optimization level 1, defaults otherwise), then `eval` over the first 32 tokens of the default
text (BOS first) at three stages: float, the QDQ graphs on the CPU (fake-quant), the compiled graphs
on the HTP simulator (htp-sim).

    python bench/experiments/llm_depth_departure.py [--layers 6,12,14,15,16,17,18] [--work DIR]
    python bench/experiments/llm_depth_departure.py --fp16-storage   # what fp16 storage alone costs

A compile that computes what its QDQ graphs compute keeps `fake-quant vs htp-sim` far above
`float vs fake-quant` at every depth; writes bench/results/llm_depth_departure.json (rows keyed by
depth and the graphs' EXPORT_VERSION: 9 before the RMSNorm fix, 10 after).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "results" / "llm_depth_departure.json"
sys.path.insert(0, str(ROOT.parent / "tests"))     # llm_tiny.save_real_layers: the cut the tests use


def one_depth(n: int, work: Path) -> dict:
    import modelexport
    from llm_tiny import save_real_layers
    from modelexport.runtime.evaluate import evaluate
    from modelexport.zoo.assets import asset_path
    cut = save_real_layers(asset_path("gemma3_270m_gguf"), work / f"cut{n}" / "hf", n)
    t0 = time.perf_counter()
    b = modelexport.compile(str(cut), output=work / f"cut{n}" / "bundle", target="SM8650", variants="ar32",
                            max_seq_len=128, optimization_level=1, force=True)
    res = evaluate(b.path, stages=["float", "fake-quant", "htp-sim"], window=32, max_tokens=32, sim_window=32,
                   sim_tokens=32, from_token=0)
    from modelexport.llm.export.stage_key import EXPORT_VERSION
    return {"layers": n, "export_version": EXPORT_VERSION, "sqnr_db": {k: v["sqnr_db"] for k, v in res["sqnr"].items()},
            "residual_scale": b.manifest.llm.residual_scale, "precision": b.manifest.precision,
            "text_span": res["text_span"], "wall_s": round(time.perf_counter() - t0, 1)}


def fp16_storage() -> dict:
    """The float decoder (all 18 layers, the stream at 1/8 as compiled) with every module's float output
    rounded to fp16, against float32, on the first 32 tokens and on tokens 5120+ (BOS first): what fp16
    storage alone costs, apart from the HTP's fp16 arithmetic."""
    import torch

    from modelexport.core.numerics import sqnr_db
    from modelexport.frontends import find_frontend
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.static_runner import StaticRunner
    from modelexport.llm.run.text import dialog_start, read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.zoo.assets import asset_path

    def to_fp16(_mod, _args, y):
        if isinstance(y, torch.Tensor) and y.is_floating_point():
            return y.half().float()
        return None

    src = str(asset_path("gemma3_270m_gguf"))
    llm = find_frontend(src).load(src)
    tok = from_transformers(llm.tokenizer)
    dec = build_static_decoder(llm.model, StaticDecoderConfig(32, 512), rms_norm="scaled", residual_scale=8.0)
    out = {}
    for start in (1, 5120):
        ids = dialog_start(tok) + tokenize(tok, read_text(None).text, start + 32)[start:start + 32]
        ref = StaticRunner.from_decoder(dec, [32, 1]).feed(ids).float().numpy()
        hooks = [m.register_forward_hook(to_fp16) for m in dec.modules() if m is not dec]
        got = StaticRunner.from_decoder(dec, [32, 1]).feed(ids).float().numpy()
        for h in hooks:
            h.remove()
        out[f"tokens_{start}+"] = round(float(sqnr_db(ref, got)), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="6,12,14,15,16,17,18")
    ap.add_argument("--work", default=None)
    ap.add_argument("--fp16-storage", action="store_true", help="only the float decoder with fp16 module outputs")
    args = ap.parse_args()
    if args.fp16_storage:
        out = json.loads(RESULT.read_text()) if RESULT.exists() else {}
        out["fp16_storage_sqnr_db"] = fp16_storage()
        print(json.dumps(out["fp16_storage_sqnr_db"]))
        RESULT.write_text(json.dumps(out, indent=2) + "\n")
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="mx-depth-"))
    os.environ.setdefault("MODELEXPORT_CACHE_DIR", str(work / "cache"))
    rows = []
    for n in (int(x) for x in args.layers.split(",")):
        rows.append(one_depth(n, work))
        print(json.dumps(rows[-1]), flush=True)
    out = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    key = lambda r: (r["layers"], r.get("export_version", 9))     # noqa: E731 - rows of earlier graphs are kept
    kept = {key(r): r for r in out.get("rows", [])} | {key(r): r for r in rows}
    out.update({"model": "Gemma 3 270M (gemma-3-270m-q4_k_m.gguf) cut to its first N layers",
                "target": "SM8650", "rows": sorted(kept.values(), key=key),
                "machine": {"cpus": os.cpu_count(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}})
    RESULT.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
