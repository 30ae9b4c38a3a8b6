"""Write docs/results.md from bench/results/*.json: one section per file, numbers as the JSON holds them.

usage: python scripts/results_page.py [--check]     (--check: exit 1 if docs/results.md differs)

Each table says where it comes from (the JSON file and the bench script that writes it), the
date and commit (from the JSON when it records them, else from git's last commit of the file)
and the machine (CPU count, platform, load average at the start and end when recorded).
Nothing here is typed by hand: to change a number, re-run the benchmark.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "results.md"

# (heading, file stems in order; a stem ending in * takes every file starting so)
GROUPS: list[tuple[str, list[str]]] = [
    ("ONNX", ["onnx_compile", "real_models", "real_models_auto", "real_models_before", "quant_engines", "quant_engines_dbnet",
              "profile_cost", "htp_matmul_precision", "htp_level_cycles"]),
    ("PyTorch", ["et_compile", "real_torch_models", "xnnpack_kernels"]),
    ("LLM compile by size", ["llm_sizes"]),
    ("LLM compile and quality", ["llm_export", "llm_export_16a4w_block", "llm_export_16a8w", "llm_self_check", "llm_quality",
                                 "llm_rounding", "llm_rotation", "llm_genie", "genie_speculative", "llm_prompt_lookup", "llm_lora", "llm_lora_strong", "llm_context",
                                 "llm_embedder", "llm_eval_gemma3", "llm_compile_profile", "per_layer_llm", "llm_vocab_pairs"]),
    ("LLM programs for ExecuTorch's qnn_llama_runner", ["llm_runner_check", "qnn_llama_runner_x86"]),
    ("LLM on the CPU", ["llm_cpu_decode*", "llm_cpu_profile", "attention_kernel", "linear_kernel*",
                        "gguf_kquant_cpu"]),
    ("Vision-language models", ["vlm_*"]),
    ("Sweep", ["sweep_*"]),
]

MAX_ROWS = 40
MAX_COLS = 9


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _find(d, keys: tuple[str, ...], depth: int = 2):
    """The first value under one of `keys`, searched breadth-first to `depth` levels of dicts."""
    level = [d]
    for _ in range(depth + 1):
        nxt = []
        for x in level:
            if not isinstance(x, dict):
                continue
            for k in keys:
                if k in x and not isinstance(x[k], (dict, list)):
                    return x[k]
            nxt.extend(v for v in x.values() if isinstance(v, dict))
        level = nxt
    return None


def _load(d) -> str | None:
    for start, end in (("load_avg_at_start", "load_avg_at_end"), ("load_avg_start", "load_avg_end"),
                       ("loadavg_start", "loadavg_end")):
        for where in (d, d.get("machine"), d.get("host")):
            if isinstance(where, dict) and start in where:
                def one(v):
                    return f"{v[0]:.2f}" if isinstance(v, list) and v and isinstance(v[0], (int, float)) else str(v)
                out = f"load {one(where[start])}"
                if end in where or end in d:
                    out += f" → {one(where.get(end, d.get(end)))}"
                return out
    return None


def provenance(path: Path, d) -> str:
    rel = path.relative_to(ROOT).as_posix()
    date = _find(d, ("date",)) if isinstance(d, dict) else None
    commit = _find(d, ("commit",)) if isinstance(d, dict) else None
    git_date = _git("log", "-1", "--format=%cs", "--", rel)
    git_commit = _git("log", "-1", "--format=%h", "--", rel)
    parts = [f"`{rel}`"]
    script = next((s for s in (ROOT / "bench" / f"{path.stem}.py", ROOT / "bench" / "experiments" / f"{path.stem}.py")
                   if s.exists()), None)       # a benchmark, or a concluded experiment (bench/experiments/)
    if script:
        parts.append(f"written by `{script.relative_to(ROOT).as_posix()}`")
    if date or commit:
        parts.append(f"date {date or 'not recorded'}, commit {commit or 'not recorded'} (from the JSON)")
    elif git_date:
        parts.append(f"committed {git_date} in {git_commit} (git)")
    else:
        parts.append("date and commit not recorded")
    if isinstance(d, dict):
        machine = d.get("machine") if isinstance(d.get("machine"), dict) else d.get("host")
        bits = []
        if isinstance(machine, dict):
            for k in ("cpus", "platform", "machine"):
                if k in machine and not isinstance(machine[k], (dict, list)):
                    bits.append(f"{machine[k]} CPUs" if k == "cpus" else str(machine[k]))
        elif isinstance(machine, str):
            bits.append(machine)
        load = _load(d)
        if load:
            bits.append(load)
        if bits:
            parts.append("machine: " + ", ".join(bits))
    return " · ".join(parts)


def cell(v) -> str:
    if isinstance(v, float):
        v = f"{v:.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    elif isinstance(v, list):
        v = ", ".join(cell(x) for x in v[:8]) + (", …" if len(v) > 8 else "")
    elif isinstance(v, dict):
        v = "{…}"
    elif v is None:
        v = "—"
    return str(v).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        out.append(f"\n{len(rows) - MAX_ROWS} more rows in the JSON.")
    return out


def flatten(d, prefix: str = "", depth: int = 3) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth > 1:
            rows += flatten(v, key + ".", depth - 1)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            rows.append((key, f"{len(v)} entries"))
        else:
            rows.append((key, v))
    return rows


def list_table(items: list[dict]) -> list[str]:
    cols: list[str] = []
    for it in items:
        for k, v in it.items():
            if k not in cols and not isinstance(v, (dict,)) and len(cols) < MAX_COLS:
                cols.append(k)
    return table(cols, [[it.get(c) for c in cols] for it in items])


def generic(d) -> list[str]:
    if isinstance(d, list):
        return list_table([x for x in d if isinstance(x, dict)]) if d else ["(empty)"]
    out = table(["key", "value"], [[f"`{k}`", v] for k, v in flatten(d)])
    for k, v in d.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out += ["", f"`{k}`:", ""] + list_table(v)
    return out


def real_models(d) -> list[str]:
    s = d.get("summary") or {}
    rows = [[p, v.get("models"), v.get("compiled"), v.get("tracebacks")] for p, v in s.items() if isinstance(v, dict)]
    return (table(["precision", "models", "compiled", "tracebacks"], rows)
            + ["", "Per model (placement, repairs, SQNR, compile time): [real_models.md](real_models.md)."])


def real_torch_models(d) -> list[str]:
    rows = d.get("rows") or []
    by_case: dict[str, dict] = {}
    for r in rows:
        by_case.setdefault(r.get("case"), {})[r.get("precision")] = r
    precisions = sorted({r.get("precision") for r in rows if r.get("precision")})

    def one(r):
        if not r:
            return "—"
        if not r.get("compiled"):
            return "not compiled"
        sq = r.get("sqnr_db")
        return f"{cell(r.get('htp_share'))} HTP, {cell(sq) + ' dB' if sq is not None else '—'}, {cell(r.get('compile_s'))} s"
    out = table(["model", "kind", *[f"{p}: HTP share, SQNR, compile" for p in precisions]],
                [[c, next(iter(v.values())).get("kind"), *[one(v.get(p)) for p in precisions]] for c, v in by_case.items()])
    s = d.get("summary")
    if isinstance(s, dict):
        out += ["", *table(["precision", *next(iter(s.values())).keys()],
                           [[p, *v.values()] for p, v in s.items() if isinstance(v, dict)])]
    return out


def llm_sizes(d) -> list[str]:
    rows = []
    for name, v in d.items():
        if not isinstance(v, dict) or "compile_cold" not in v:
            continue
        cold, art = v.get("compile_cold") or {}, v.get("artifacts") or {}
        cached = v.get("compile_cached") or v.get("completion_after_fix") or {}
        rows.append([name, f"{art.get('parameters', 0) / 1e6:,.0f} M" if art.get("parameters") else None,
                     art.get("n_parts"), cold.get("wall_s"), cold.get("peak_tree_rss_gb"),
                     f"{art['device_bytes'] / 2**20:,.0f} MB" if art.get("device_bytes") else None,
                     art.get("bytes_per_parameter"), cached.get("wall_s"), v.get("options")])
    rows.sort(key=lambda r: float(r[1].replace(",", "").rstrip(" M")) if r[1] else 0.0)
    est = [[name, f"{v['estimate']['n_params'] / 1e6:,.0f} M", v["estimate"].get("n_parts"),
            v["estimate"].get("peak_gb"), v["estimate"].get("disk_gb")]
           for name, v in d.items() if name.endswith("_estimate") and isinstance(v.get("estimate"), dict)]
    out = table(["model", "parameters", "parts", "cold compile s", "peak memory GB (process tree)", "on the device",
                 "bytes/param", "second compile s (cache)", "options"], rows)
    progs = [[name, v["executorch_program"]["bytes"] // 2**20, v["executorch_program"]["bytes_per_parameter"],
              v["executorch_program"]["binaries_stored"], v["executorch_program"]["build_s"],
              v["executorch_program"]["check"].get("same_tokens"), v["executorch_program"]["check"].get("worst_logits_sqnr_db")]
             for name, v in d.items() if isinstance(v, dict) and v.get("executorch_program")]
    if progs:
        out += ["", "The program for qnn_llama_runner (`--executorch-program`, included in the compile above):", "",
                *table(["model", "program MB", "bytes/param", "binaries stored", "build s",
                        "runner's loop = bundle's tokens", "worst logits dB"], progs)]
    if est:
        out += ["", "Estimates (`compile --dry-run`, from the config alone):", "",
                *table(["model", "parameters", "parts", "estimated peak GB", "estimated disk GB"], est)]
    return out


def cpu_decode(d) -> list[str]:
    eng = d.get("engines") or {}
    rows = [[name, e.get("runs"), e.get("median_decode_tok_s"), e.get("median_prefill_tok_s"), e.get("median_ttft_s")]
            for name, e in eng.items() if isinstance(e, dict)]
    out = table(["engine", "runs", "decode tok/s (median)", "prefill tok/s (median)", "time to first token s"], rows)
    ratio = d.get("decode_ratio_to_llamacpp") or d.get("decode_speedup_of_modelexport_vs")
    if isinstance(ratio, dict):
        out += ["", *table(["decode speed against llama.cpp", "ratio"], [[k, v] for k, v in ratio.items()])]
    ppl = d.get("perplexity")
    if isinstance(ppl, dict):
        out += ["", *table(["perplexity", "value"], [[k, v] for k, v in ppl.items()])]
    return out


def sweep_cell_memory(d) -> list[str]:
    rules = d.get("rules") or {}
    out = table(["kind / precision class", "base MB", "MB per model MB", "points", "sets the base"],
                [[k, r.get("base_mb"), r.get("per_model_mb"), r.get("points"), r.get("sets_the_base")]
                 for k, r in rules.items()])
    pts = d.get("points") or []
    return out + ["", *table(["kind", "model", "model MB", "precision", "peak MB", "status"],
                             [[p.get("kind"), p.get("model"), p.get("model_mb"), p.get("precision"), p.get("peak_mb"),
                               p.get("status")] for p in pts])]


def prompt_lookup(d) -> list[str]:
    costs = list((d.get("arN_cost_vs_ar1") or {}).items())
    rows = []
    for name, pr in (d.get("prompts") or {}).items():
        plain = pr.get("plain") or {}
        rows.append([f"{name} (repeats itself: {pr.get('repeats_itself')})", "plain", "", plain.get("tokens_per_step"),
                     "", "", *["1.0" for _ in costs]])
        for r in pr.get("runs") or []:
            rows.append([name, r.get("draft"), r.get("ngram"), r.get("tokens_per_step"),
                         f"{r.get('accepted')}/{r.get('drafted')}", r.get("equal_to_plain"),
                         *[(r.get("speedup") or {}).get(k) for k, _ in costs]])
    out = table(["prompt", "draft", "ngram", "tokens per step", "accepted/drafted", "= plain greedy",
                 *[f"speed-up, arN = {c} x ar1" for _, c in costs]], rows)
    return out + ["", *table(["arN cost vs ar1", "ratio"], [[k, c] for k, c in costs]),
                  "", f"Speed-up: `{d.get('speedup_formula')}`. Every run equal to plain greedy: {d.get('all_equal_to_plain')}."]


SPECIAL = {"real_models": real_models, "llm_prompt_lookup": prompt_lookup, "real_models_auto": real_models, "real_torch_models": real_torch_models,
           "llm_sizes": llm_sizes, "sweep_cell_memory": sweep_cell_memory}


def renderer(stem: str):
    if stem in SPECIAL:
        return SPECIAL[stem]
    if stem.startswith("llm_cpu_decode"):
        return cpu_decode
    return generic


def ordered_files() -> list[tuple[str, list[Path]]]:
    files = sorted(RESULTS.glob("*.json"))
    taken: set[Path] = set()
    out = []
    for heading, stems in GROUPS:
        group = []
        for s in stems:
            for f in files:
                if f not in taken and (f.stem == s or (s.endswith("*") and f.stem.startswith(s[:-1]))):
                    group.append(f)
                    taken.add(f)
        out.append((heading, group))
    rest = [f for f in files if f not in taken]
    if rest:
        out.append(("Other benchmarks", rest))
    return [(h, g) for h, g in out if g]


def render() -> str:
    groups = ordered_files()
    lines = ["# Results", "",
             "<!-- generated by scripts/results_page.py from bench/results/*.json: do not edit by hand -->", "",
             "What the benchmarks in `bench/` measured, one section per JSON file in `bench/results/`. Each says",
             "when, at which commit and on which machine it ran. Times on the x86 HTP simulator rank models and",
             "options; they are not phone latencies. The real-model corpus, model by model:",
             "[real_models.md](real_models.md).", "", "Contents:", ""]
    lines += [f"- [{h}](#{h.lower().replace(' ', '-')})" for h, _ in groups]
    for heading, files in groups:
        lines += ["", f"## {heading}"]
        for f in files:
            try:
                d = json.loads(f.read_text())
            except ValueError as e:
                lines += ["", f"### {f.stem}", "", f"`{f.relative_to(ROOT).as_posix()}` does not parse: {e}"]
                continue
            lines += ["", f"### {f.stem}", "", provenance(f, d), "", *renderer(f.stem)(d)]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/results_page.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
