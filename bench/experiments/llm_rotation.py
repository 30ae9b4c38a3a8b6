"""Does a rotation of the residual stream help 4-bit weights? (issue 20, item 3) Measured on the real
SmolLM2-135M-Instruct (Q4_1 GGUF, float32), weights only (the 4-bit linears replaced by exactly the
integers and scales the graphs would get; activations float), as bench/llm_quality.py measures the
roundings.

The rotation (QuaRot / SpinQuant's R1): each RMSNorm's gain is folded into the linears that read
it, and the residual stream is multiplied by an orthogonal Q, folded into every weight that reads it
(W Q) or writes it (Q^T W). A gain-less RMSNorm commutes with Q, so the float model is unchanged.
The embedding stays as stored and tied to the head: the stream is rotated once after the lookup
and back before the final norm (two small [hidden, hidden] MatMuls a token, which the HTP takes).
The point: Q spreads a few large input channels over all of them, so 4-bit blocks lose less.

    python bench/experiments/llm_rotation.py [--roundings nearest,gptq] [--seeds 0,1]
Writes bench/results/llm_rotation.json.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]    # bench/
RESULT = ROOT / "results" / "llm_rotation.json"
BLOCK = 32                                  # 16a4w_block's blocks


def random_orthogonal(n: int, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def rotate(model, q) -> None:
    """Fold the norms' gains and the rotation `q` [hidden, hidden] into the model's weights, in place;
    hooks rotate the embedding's output and undo it before the final norm."""
    import torch
    with torch.no_grad():
        for layer in model.model.layers:
            for norm, readers in ((layer.input_layernorm, (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                          layer.self_attn.v_proj)),
                                  (layer.post_attention_layernorm, (layer.mlp.gate_proj, layer.mlp.up_proj))):
                g = norm.weight.detach().clone()
                for lin in readers:                      # y = n(x) diag(g) W^T  ->  W' = W diag(g) Q
                    lin.weight.copy_((lin.weight * g[None, :]) @ q)
                norm.weight.fill_(1.0)
            for writer in (layer.self_attn.o_proj, layer.mlp.down_proj):   # out Q = a W^T Q -> W' = Q^T W
                writer.weight.copy_(q.T @ writer.weight)
    model.model.embed_tokens.register_forward_hook(lambda m, a, out: out @ q)
    model.model.norm.register_forward_pre_hook(lambda m, a: (a[0] @ q.T, *a[1:]))


def main() -> None:
    import numpy as np
    import torch

    from modelexport.frontends import find_frontend
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.weight_quality import onnx_weight, perplexity, windows
    from modelexport.quant.input_moments import record_input_moments
    from modelexport.quant.weight_rounding import ROUNDING_TOKENS, ROUNDINGS
    from modelexport.zoo.assets import asset_path

    ap = argparse.ArgumentParser()
    ap.add_argument("--roundings", default="nearest,gptq")
    ap.add_argument("--seeds", default="0")
    args = ap.parse_args()
    torch.set_num_threads(2)
    gguf = asset_path("smollm2_gguf")
    base = find_frontend(str(gguf)).load(str(gguf))
    text = tokenize(base.tokenizer, read_text(None).text, 5120)
    ids, held = text[:ROUNDING_TOKENS], text[4096:5120]      # moments' span; held out, same text
    out = {"model": gguf.name, "precision": "16a4w_block (weights only, blocks of 32)", "moments_tokens": len(ids),
           "held_out": "lee_background.cor tokens 4096-5119", "reference": "lee_background.cor first 1024 tokens",
           "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()},
           "rows": {}}
    variants = [("none", None)] + [(f"rotated (random orthogonal, seed {s})", int(s)) for s in args.seeds.split(",")]
    for label, seed in variants:
        model = base.model if seed is None else copy.deepcopy(base.model)
        if seed is not None:
            rotate(model, random_orthogonal(model.config.hidden_size, seed))
        names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
        fl = {"ppl_reference": perplexity(model, ids[:1024], 512), "ppl_held_out": perplexity(model, held, 512)}
        out["rows"][f"{label}/float"] = {k: round(v, 3) for k, v in fl.items()}
        t = time.perf_counter()
        mom = record_input_moments(model, windows(ids, 512), lambda m, x: m(input_ids=x), lambda n: n in set(names))
        moments_s = time.perf_counter() - t
        ws = [onnx_weight(model, n) for n in names]
        kurt = [float(((w - w.mean()) ** 4).mean() / (w.var() ** 2)) for w in ws]
        for r in args.roundings.split(","):
            t, cpu = time.perf_counter(), time.process_time()
            bws = ROUNDINGS[r].round_all(ws, [mom.get(n) for n in names], [BLOCK] * len(ws))
            row = {"rounding_s": round(time.perf_counter() - t, 1), "rounding_cpu_s": round(time.process_time() - cpu, 1),
                   "moments_s": round(moments_s, 1), "mean_weight_kurtosis": round(float(np.mean(kurt)), 2)}
            deq = {n: bw.dequantized(BLOCK) for n, bw in zip(names, bws)}
            for k, span in (("reference", ids[:1024]), ("held_out", held)):
                row[f"ppl_{k}"] = round(perplexity(model, span, 512, deq), 3)
                row[f"ratio_{k}"] = round(row[f"ppl_{k}"] / fl[f"ppl_{k}"], 4)
            out["rows"][f"{label}/{r}"] = row
            print(label, r, row, flush=True)
            RESULT.write_text(json.dumps(out, indent=2))
    out["host"]["load_avg_at_end"] = os.getloadavg()
    RESULT.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
