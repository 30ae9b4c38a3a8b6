"""ExecuTorch's own qnn_llama_runner (built by ./build.sh) on a bundle's `--executorch-program` host twin,
on the x86 HTP simulator, beside modelexport's Python imitation of that runner (RunnerLoop) on the same
prompt ids: the tokens and the logits of every step. Writes bench/results/qnn_llama_runner_x86.json.

    bash bench/experiments/qnn_llama_runner_x86/build.sh EXECUTORCH_CHECKOUT     # once
    python bench/experiments/qnn_llama_runner_x86/run.py BUNDLE [--question Q] [--new-tokens 32] [--name KEY]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import torch  # noqa: F401  (before ExecuTorch's Qualcomm modules)

from modelexport.backends.llm_qnn.executorch_runner import RunnerLoop
from modelexport.contract import open_bundle
from modelexport.llm.run.tokenizers import load_tokenizer
from modelexport.toolchain.executorch_env import ensure_executorch_qnn

RESULT = Path(__file__).resolve().parents[2] / "results" / "qnn_llama_runner_x86.json"
WORK = Path(os.environ.get("WORK", "/tmp/qnn_llama_runner_x86"))


def run_cpp(pte: Path, tokenizer: Path, version: str, ids: list[int], seq_len: int, eval_mode: int) -> dict:
    """One run; eval mode 1 (hybrid: prefill_forward + kv_forward) writes text, 0 (kv_forward only) the logits."""
    state = ensure_executorch_qnn()
    run = WORK / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "prompt.bin").write_bytes(np.asarray(ids, np.uint64).tobytes())
    sp = Path(np.__file__).parents[1]
    env = {**os.environ, "QNN_SDK_ROOT": str(state.qnn_sdk_root),
           "LD_LIBRARY_PATH": f"{state.qnn_sdk_root}/lib/x86_64-linux-clang:{sp}/onnxruntime_qnn.libs"}
    cmd = [str(WORK / "out" / "qnn_llama_runner"), "--model_path", str(pte), "--tokenizer_path", str(tokenizer),
           "--decoder_model_version", version, "--eval_mode", str(eval_mode), "--seq_len", str(seq_len), "--temperature", "0",
           "--tokenized_prompt", str(run / "prompt.bin"), "--output_path", str(run / "outputs.txt"),
           "--performance_output_path", str(run / "speed.txt")]
    (run / "logits.bin").unlink(missing_ok=True)
    if eval_mode == 0:   # the runner dumps logits in kv mode only
        cmd += ["--dump_logits_path", str(run / "logits.bin")]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    out = {"command": " ".join(cmd[:1] + [c if "/" not in c else Path(c).name for c in cmd[1:]]), "rc": p.returncode,
           "wall_s": round(time.perf_counter() - t0, 1)}
    if p.returncode:
        out["stderr_tail"] = p.stderr[-2000:]
        return out
    out["text"] = (run / "outputs.txt").read_text(errors="replace")
    out["speed"] = (run / "speed.txt").read_text(errors="replace") if (run / "speed.txt").exists() else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--question", default="What is the capital of France?")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--name", help="the entry's key in the results (default: the bundle folder's name)")
    a = ap.parse_args()
    b = open_bundle(a.bundle)
    target, e = next(iter(b.manifest.llm.executorch.items()))
    tok_path = b.file("tokenizer/tokenizer.json")
    tok = load_tokenizer(tok_path)
    ids = tok.encode_chat([{"role": "user", "content": a.question}])
    hybrid = run_cpp(b.file(e.host_twin), tok_path, e.decoder_model_version, ids, len(ids) + a.new_tokens, 1)
    t0 = time.perf_counter()
    trace = RunnerLoop(b.file(e.host_twin)).generate(ids, a.new_tokens, e.eos_ids)
    ours = {"token_ids": trace.tokens, "text": tok.decode(trace.tokens), "wall_s": round(time.perf_counter() - t0, 1)}
    hybrid["python_text_in_runner_output"] = ours["text"].strip() in hybrid.get("text", "")
    # kv mode: the runner's logits of every step against the Python loop's, raw (uint16 as the graph gives them)
    n_kv = min(a.new_tokens, 8)
    kv = run_cpp(b.file(e.host_twin), tok_path, e.decoder_model_version, ids, len(ids) + n_kv, 0)
    if kv.get("rc") == 0:
        vocab = b.manifest.llm.spec.vocab_size
        rows = np.fromfile(WORK / "run" / "logits.bin", np.uint16).reshape(-1, vocab)
        mine = np.concatenate(RunnerLoop(b.file(e.host_twin)).generate(ids, n_kv, e.eos_ids, prefill=False).logits)
        n = min(len(rows), len(mine))
        kv.update(rows_compared=n, max_abs_diff=int(np.abs(rows[:n].astype(np.int64) - mine[:n].astype(np.int64)).max()))
    cpp = {"hybrid": hybrid, "kv_logits": kv}
    paris = {"qnn_llama_runner": "paris" in hybrid.get("text", "").lower(), "python": "paris" in ours["text"].lower()}
    out = {"bundle": str(b.path), "target": target, "parameters": b.manifest.parameters, "program": e.file,
           "host_twin": e.host_twin, "decoder_model_version": e.decoder_model_version, "question": a.question,
           "prompt_ids": len(ids), "qnn_llama_runner": cpp, "python_runner_loop": ours, "paris": paris}
    results = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    results[a.name or Path(a.bundle).name] = out
    RESULT.write_text(json.dumps(results, indent=2))
    print(json.dumps(out, indent=1)[:3000])


if __name__ == "__main__":
    main()
