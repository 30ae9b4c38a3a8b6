"""Measure what ExecuTorch's QNN partitioner (the real QNN validator) accepts on the HTP, per op
and precision, and write docs/op_support.md (and docs/op_support.json).

Each row is a tiny module holding one op (or one RoPE piece); it goes through `modelexport`'s
audit — export, quantization with the precision's QnnQuantizer (random calibration: placement
does not depend on the values), QNN's export and to-edge passes, then ExecuTorch's
QnnOperatorSupport decision for every node, with the reason when it says no (op lists, op
builder refusals, and QNN's validator log). Nothing here is taken from a guide.

    .venv/bin/python scripts/op_support_table.py [--target SM8650] [--rows linear,gelu_exact] [--precisions fp16,8a8w]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp16", "8a8w", "16a8w", "16a16w", "16a4w")


def rows():
    """name → (description, factory() -> (module, example_inputs, dynamic_shapes))."""
    import torch
    from torch import nn
    F = nn.functional
    torch.manual_seed(0)
    D, S = 64, 16
    x = lambda *shape: torch.randn(*shape)  # noqa: E731

    class Op(nn.Module):
        def __init__(self, fn, **mods):
            super().__init__()
            self.fn = fn
            for k, v in mods.items():
                setattr(self, k, v)

        def forward(self, *a):
            return self.fn(self, *a)

    def rotate_half(t):
        a, b = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return torch.cat((-b, a), dim=-1)

    cos_t, sin_t = torch.randn(128, D), torch.randn(128, D)
    pos = torch.arange(S).unsqueeze(0)
    idx = torch.randint(0, D, (1, S, 8))

    class Rope(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cos", torch.randn(1, S, D))
            self.register_buffer("sin", torch.randn(1, S, D))

        def forward(self, t):
            return t * self.cos + rotate_half(t) * self.sin

    class Table(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.how = how
            self.register_buffer("cos", cos_t.clone())

        def forward(self, t, p):
            if self.how == "index":
                c = self.cos[p]                                  # aten.index.Tensor
            elif self.how == "index_select":
                c = self.cos.index_select(0, p.reshape(-1)).unsqueeze(0)
            else:
                c = torch.gather(self.cos.unsqueeze(0).expand(p.shape[0], -1, -1), 1,
                                 p.unsqueeze(-1).expand(-1, -1, D))
            return t * c

    seq = torch.export.Dim("seq", min=2, max=128)
    return {
        "linear": ("nn.Linear 64→64", lambda: (nn.Linear(D, D), (x(1, S, D),), None)),
        "conv2d": ("nn.Conv2d 16→32, 3x3", lambda: (nn.Conv2d(16, 32, 3, padding=1), (x(1, 16, 32, 32),), None)),
        "layer_norm": ("nn.LayerNorm(64)", lambda: (nn.LayerNorm(D), (x(1, S, D),), None)),
        "rms_norm": ("nn.RMSNorm(64)", lambda: (nn.RMSNorm(D), (x(1, S, D),), None)),
        "softmax": ("softmax over the last dim", lambda: (Op(lambda s, t: F.softmax(t, -1)), (x(1, S, D),), None)),
        "gelu_exact": ("GELU, exact (erf)", lambda: (nn.GELU(), (x(1, S, D),), None)),
        "gelu_tanh": ("GELU, tanh approximation", lambda: (nn.GELU(approximate="tanh"), (x(1, S, D),), None)),
        "silu": ("SiLU", lambda: (nn.SiLU(), (x(1, S, D),), None)),
        "matmul": ("q @ kᵀ (activations × activations)",
                   lambda: (Op(lambda s, q, k: q @ k.transpose(-1, -2)), (x(1, 4, S, D), x(1, 4, S, D)), None)),
        "sdpa": ("F.scaled_dot_product_attention, causal",
                 lambda: (Op(lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                          (x(1, 4, S, D), x(1, 4, S, D), x(1, 4, S, D)), None)),
        "rope_rotate_half": ("RoPE rotate_half: slice, neg, cat", lambda: (Op(lambda s, t: rotate_half(t)), (x(1, S, D),), None)),
        "rope_apply": ("RoPE x·cos + rotate_half(x)·sin (mul, add)", lambda: (Rope(), (x(1, S, D),), None)),
        "rope_table_index": ("RoPE cos table[pos] (aten.index)", lambda: (Table("index"), (x(1, S, D), pos), None)),
        "rope_table_index_select": ("RoPE cos table.index_select(pos)", lambda: (Table("index_select"), (x(1, S, D), pos), None)),
        "rope_table_gather": ("RoPE torch.gather(cos table, pos)", lambda: (Table("gather"), (x(1, S, D), pos), None)),
        "embedding": ("nn.Embedding(1000, 64)", lambda: (nn.Embedding(1000, D), (torch.randint(0, 1000, (1, S)),), None)),
        "topk_last": ("topk(k=4) over the last dim", lambda: (Op(lambda s, t: torch.topk(t, 4, dim=-1)[0]), (x(1, S, D),), None)),
        "topk_other": ("topk(k=4) over dim 1", lambda: (Op(lambda s, t: torch.topk(t, 4, dim=1)[0]), (x(1, S, D),), None)),
        "softmax_other": ("softmax over dim 1 of a 3-D tensor", lambda: (Op(lambda s, t: F.softmax(t, 1)), (x(1, S, D),), None)),
        "max_pool2d_dilated": ("max_pool2d 3x3, dilation 2", lambda: (Op(lambda s, t: F.max_pool2d(t, 3, stride=1, dilation=2)),
                                                                      (x(1, 8, 16, 16),), None)),
        "where": ("torch.where(x > 0, x, y)", lambda: (Op(lambda s, a, b: torch.where(a > 0, a, b)), (x(1, S, D), x(1, S, D)), None)),
        "index_select": ("x.index_select(1, idx)", lambda: (Op(lambda s, t, i: t.index_select(1, i)),
                                                            (x(1, S, D), torch.tensor([0, 3, 5, 7])), None)),
        "gather": ("torch.gather(x, -1, idx)", lambda: (Op(lambda s, t, i: torch.gather(t, -1, i)), (x(1, S, D), idx), None)),
        "scatter": ("x.scatter(-1, idx, src)", lambda: (Op(lambda s, t, i, v: t.scatter(-1, i, v)), (x(1, S, D), idx, x(1, S, 8)), None)),
        "index_put": ("x.index_put((rows,), values)", lambda: (Op(lambda s, t, i, v: t.index_put((i,), v)),
                                                              (x(8, D), torch.tensor([1, 4]), x(2, D)), None)),
        "dynamic_seq": ("Linear+ReLU exported with a dynamic Dim on the sequence",
                        lambda: (nn.Sequential(nn.Linear(D, D), nn.ReLU()), (x(1, S, D),), ({1: seq},))),
    }


def measure(name: str, make, precision: str, target: str) -> dict:
    from modelexport.backends.executorch_qnn.audit import audit_torch
    from modelexport.core.errors import ModelExportError
    module, example, dyn = make()
    t0 = time.perf_counter()
    try:
        rep = audit_torch(module.eval(), target, precision, example_inputs=example, dynamic_shapes=dyn)
    except ModelExportError as e:
        return {"status": "error", "error": e.problem, "seconds": round(time.perf_counter() - t0, 1)}
    except Exception as e:  # a crash of the pipeline is a finding too: record it
        return {"status": "error", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
                "seconds": round(time.perf_counter() - t0, 1)}
    nodes = [n for n in rep.nodes if n.backend in ("HTP", "CPU")]
    refused = [{"op": n.op_type, "node": n.name, "kind": (n.details or {}).get("reason_kind"), "reason": n.reason}
               for n in nodes if n.backend == "CPU"]
    return {"status": "HTP" if not refused else "CPU", "ops": sorted({n.op_type for n in nodes}), "refused": refused,
            "seconds": round(time.perf_counter() - t0, 1)}


def render(results: dict, descriptions: dict, target: str, meta: dict) -> str:
    precs = [p for p in PRECISIONS if any(p in r for r in results.values())]
    notes: list[str] = []
    note_of: dict[str, int] = {}

    def cell(r: dict | None) -> str:
        if r is None:
            return "–"
        if r["status"] == "HTP":
            return "HTP"
        if r["status"] == "error":
            keys = [r["error"]]
            label = "error"
        else:
            # one note per distinct (op, reason); node names inside QNN's words do not make it distinct
            keys = list(dict.fromkeys(f"`{x['op']}` ({x['kind']}): " + re.sub(r"aten_\w+?(_\d+)?\b", "<node>", x["reason"])
                                      for x in r["refused"]))
            label = "CPU (" + ", ".join(sorted({x["op"].replace("aten.", "").replace(".default", "") for x in r["refused"]})) + ")"
        refs = []
        for key in keys:
            if key not in note_of:
                notes.append(key)
                note_of[key] = len(notes)
            refs.append(str(note_of[key]))
        return f"**{label}** [{', '.join(refs)}]"

    lines = [f"# What the HTP takes: ExecuTorch QNN partitioner on {target}, measured", "",
             "Generated by `scripts/op_support_table.py` — do not edit by hand. Each row is a tiny module "
             "with one op, audited by `modelexport audit` (torch.export → QnnQuantizer with random calibration for "
             "quantized precisions → QNN's export and to-edge passes → ExecuTorch's `QnnOperatorSupport` per node, which "
             "asks QNN's own validator through `IsNodeSupportedByBackend`). **HTP** = every compute node accepted; "
             "**CPU** = the named op would run on the CPU (XNNPACK or portable kernels), reason in the note.", "",
             f"Measured with {meta['pairing']}, QAIRT {meta['qairt_build']}, torch {meta['torch']}, "
             f"{meta['date']}.", "",
             "This is the validator's per-node answer (what the partitioner would delegate), not a full compile of every "
             "cell; the tests and `bench/et_compile.py` compile real models end to end. Refusals with an opt-in rewrite: "
             "`sdpa` → `--rewrite causal-mask`, `topk_other` → `--rewrite topk-last-dim` (both exact). Exact GELU is "
             "accepted, so no GELU rewrite is offered.", "",
             "| op | what | " + " | ".join(precs) + " |", "| --- | --- | " + " | ".join("---" for _ in precs) + " |"]
    for name, per_prec in results.items():
        lines.append(f"| `{name}` | {descriptions.get(name, '')} | " + " | ".join(cell(per_prec.get(p)) for p in precs) + " |")
    lines += ["", "## Why (the backend's own words)", ""]
    lines += [f"{i}. {n}" for i, n in enumerate(notes, 1)]
    headline = summarize(results)
    lines += ["", "## Headline", ""] + [f"- {h}" for h in headline] + [""]
    return "\n".join(lines)


def summarize(results: dict) -> list[str]:
    out = []
    always = [n for n, r in results.items() if r and all(v["status"] == "HTP" for v in r.values())]
    out.append("accepted at every measured precision: " + ", ".join(f"`{n}`" for n in always))
    for n, r in results.items():
        bad = {p: v for p, v in r.items() if v["status"] != "HTP"}
        if bad:
            out.append(f"`{n}` not on HTP at " + ", ".join(f"{p} ({v['status']})" for p, v in bad.items()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="SM8650")
    ap.add_argument("--rows", default=None, help="comma-separated row names (default: all)")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--out", default=str(REPO / "docs" / "op_support.md"))
    ap.add_argument("--resume", action="store_true", help="keep results already in docs/op_support.json")
    args = ap.parse_args(argv)

    from modelexport.toolchain.executorch_env import ensure_executorch_qnn
    state = ensure_executorch_qnn()
    import datetime

    import torch
    table = rows()
    wanted = args.rows.split(",") if args.rows else list(table)
    precs = args.precisions.split(",")
    out_md = Path(args.out)
    out_json = out_md.with_suffix(".json")
    results: dict = {}
    if args.resume and out_json.exists():
        results = json.loads(out_json.read_text())["results"]
    meta = {"target": args.target, "pairing": state.pairing, "qairt_build": state.qairt_build, "torch": torch.__version__,
            "date": datetime.date.today().isoformat()}
    for name in wanted:
        desc, make = table[name]
        for p in precs:
            if args.resume and p in results.get(name, {}):
                continue
            r = measure(name, make, p, args.target)
            results.setdefault(name, {})[p] = r
            print(f"{name:26s} {p:7s} {r['status']:5s} {r['seconds']:6.1f}s "
                  + "; ".join(f"{x['op']}: {x['reason']}" for x in r.get("refused", [])) + r.get("error", ""), flush=True)
            out_json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    ordered = {n: results[n] for n in table if n in results}
    out_md.write_text(render(ordered, {n: d for n, (d, _) in table.items()}, args.target, meta))
    out_json.write_text(json.dumps({"meta": meta, "results": ordered}, indent=1))
    print(f"wrote {out_md} and {out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
