"""What holds the memory of `compile --format pte`: SmolLM2-135M (the Q4_1 GGUF) cut to its first N
layers through the compile's own steps (`_round_weights`, `quantize_methods` with the rounded weights
pinned, `lower_methods`: one to_edge, a copy of the edge program, two partition + QNN compiles), the
process's RSS after each step and its peak during it (VmHWM, reset before each step through
/proc/self/clear_refs), and the bytes the converted method graphs hold that no node reads.

    --mode before   the converted graphs keep the float parameters conversion leaves unread (the
                    pinned 4-bit linears a float copy per method), as the compile did before
    --mode after    they are dropped right after conversion (`quantize_methods`), as it does now

usage: python bench/experiments/llm_pte_memory.py --layers 4 --mode before|after [--rounding nearest]
Writes bench/results/llm_pte_memory.json (merged per layer count and mode)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent            # bench/
RESULT = ROOT / "results" / "llm_pte_memory.json"
sys.path.insert(0, str(HERE))   # the sibling llm_pte_stages.py


def _status_mb(key: str) -> float:
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) / 1024


@contextmanager
def step(rows: dict, name: str):
    """RSS after the step and its peak during it (VmHWM reset first: `5` > clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t = time.perf_counter()
    yield
    rows[name] = {"wall_s": round(time.perf_counter() - t, 1), "peak_rss_mb": round(_status_mb("VmHWM")),
                  "rss_after_mb": round(_status_mb("VmRSS"))}
    print(f"{name}: {rows[name]}", flush=True)


def unread_bytes(gm) -> int:
    """Bytes of the parameters and buffers of a graph module that no get_attr node reads."""
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    return sum(t.numel() * t.element_size() for name, t in [*gm.named_parameters(), *gm.named_buffers()]
               if name not in read)


def run(n_layers: int, mode: str, rounding: str, n_samples: int, variants: list[int], seq: int) -> dict:
    from llm_pte_stages import cut_model
    from modelexport.backends.executorch_qnn.specs import qnn_ready
    from modelexport.backends.llm_pte.compile import _round_weights, lower_methods
    from modelexport.backends.llm_qnn.calibration import calibration_samples
    from modelexport.backends.llm_qnn.compile import _quality_options
    from modelexport.backends.spec import LlmCompileOptions
    from modelexport.core.targets import get_target
    from modelexport.llm.model.pte_methods import constant_methods, method_name
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder, split_rope_lookups
    from modelexport.llm.run.text import read_text, tokenize
    from modelexport.llm.run.tokenizers import from_transformers
    from modelexport.quant import llm_pt2e
    rows: dict = {}
    soc = get_target("SM8650")
    if mode == "before":
        llm_pt2e._drop_unused_tensors = lambda gm: None      # noqa: SLF001 (the code before the change)
    with step(rows, "load"):
        qnn_ready()
        llm = cut_model(n_layers)
        tok = from_transformers(llm.tokenizer, chat_template=llm.chat_template, eos_ids=llm.eos_token_ids())
        text = read_text(None)
    with step(rows, "calibration"):
        kv: dict = {}
        samples = calibration_samples(llm.model, tokenize(tok, text.text, seq * (n_samples + 2)), variants, seq,
                                      n_samples, kv)
    plan = llm_pt2e.llm_quant_plan("16a4w_block", None, None)
    with step(rows, f"rounding ({rounding})"):
        opts = LlmCompileOptions(rounding=rounding)
        rounded = _round_weights(llm.model, tok, text, seq, plan, _quality_options(opts, plan.precision.name, {}),
                                 opts, lambda *a: None)[0]
    with step(rows, "quantize both methods (rounded weights pinned)"):
        decs = {method_name(n): build_static_decoder(llm.model, StaticDecoderConfig(n, seq)) for n in variants}
        for d in decs.values():
            split_rope_lookups(d, llm_pt2e.MAX_ROPE_GATHER)
        graphs, inputs, _ = llm_pt2e.quantize_methods(decs, {method_name(n): samples[n] for n in variants}, kv,
                                                      plan, soc, rounded, {})
        del rounded
    unread = {m: unread_bytes(g) for m, g in graphs.items()}
    consts = constant_methods(decs[method_name(1)].spec, seq, max(variants), tok.bos_id, bool(tok.add_bos),
                              list(tok.eos_ids))
    steps: dict = {}
    with step(rows, "lower (to_edge once, shared program + twin)"):
        programs = lower_methods(graphs, inputs, soc, consts, plan.uses_block, steps)
    rows["lower (to_edge once, shared program + twin)"]["steps_wall_s"] = steps
    return {"n_layers": n_layers, "mode": mode, "rounding": rounding, "variants": [f"ar{n}" for n in variants],
            "seq": seq, "steps": rows, "unread_tensor_bytes": unread,
            "float_model_bytes": sum(p.numel() * p.element_size() for p in llm.model.parameters()),
            "pte_bytes": {k: len(v) for k, v in programs.items()}, "load_avg_at_end": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, action="append", required=True)
    ap.add_argument("--mode", choices=("before", "after"), default="after")
    ap.add_argument("--rounding", default="nearest")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--prefill", type=int, default=32)
    a = ap.parse_args()
    for n in a.layers:
        r = run(n, a.mode, a.rounding, a.samples, [1, a.prefill], a.seq)
        r["host"] = {"cpus": os.cpu_count(), "shared": "2 cores shared with the lead and other helpers"}
        print(json.dumps(r, indent=1), flush=True)
        results = json.loads(RESULT.read_text()) if RESULT.is_file() else {}    # read late: runs may overlap
        results[f"{n}_layers_{a.mode}"] = r
        RESULT.parent.mkdir(exist_ok=True)
        RESULT.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
