"""Cost of `modelexport verify --per-layer` on a SmolLM2-135M LLM bundle → bench/results/per_layer_llm.json.

    python bench/per_layer_llm.py BUNDLE          # a bundle from `modelexport compile SmolLM2... -o BUNDLE`

The bundle is copied first (per-layer records into the manifest). Side by side in one run:
- `verify --per-layer` end to end (load the source, record held-out samples through the float
  decoder, re-export the float graph, run float and QDQ with every module's output exposed);
- the plain fake-quant forward of the same QDQ graph on the same samples (what a check of the
  logits alone would cost), so the ratio is what the per-layer view adds.
Peak RSS is the child process's. The machine is a shared 2-core host; absolute numbers are noisy.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT = Path(__file__).parent / "results" / "per_layer_llm.json"


def _per_layer_child(bundle: Path, samples: int) -> dict:
    code = f"""
import json, resource, time
t0 = time.perf_counter()
from modelexport.runtime.per_layer_verify import per_layer_verify
rep, layers = per_layer_verify({str(bundle)!r}, max_samples={samples}, record=True)
pl = layers[0]
print(json.dumps({{"seconds": time.perf_counter() - t0, "hook_seconds": pl.seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "layers": len(pl.layers), "samples": pl.samples, "first_bad_layer": pl.first_bad_layer,
                  "culprit_layer": pl.culprit_layer, "suggested_override": pl.suggestion,
                  "logits_sqnr_db": pl.layers[-1].sqnr_db,
                  "residual_stream_sqnr_db": {{x.name: round(x.sqnr_db, 2) for x in pl.layers
                                               if x.name.startswith("model.layers.") and x.name.count(".") == 2}}}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fake_quant_forward(bundle: Path, samples: int) -> dict:
    """The QDQ graph alone on the same number of ar-N samples (fresh session, like per-layer's)."""
    code = f"""
import json, time
import numpy as np, onnxruntime as ort
from modelexport.contract import open_bundle
b = open_bundle({str(bundle)!r})
n = max(g.n_tokens for g in b.manifest.graphs)
g = next(g for g in b.manifest.graphs if g.n_tokens == n)
t0 = time.perf_counter()
so = ort.SessionOptions(); so.log_severity_level = 3
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
s = ort.InferenceSession(str(b.file(g.quantized_model)), so, providers=["CPUExecutionProvider"])
feed = {{}}
for i in s.get_inputs():
    shape = [d if isinstance(d, int) else 1 for d in i.shape]
    feed[i.name] = np.zeros(shape, np.int64 if "int64" in i.type else np.int32 if "int32" in i.type else np.float32)
t1 = time.perf_counter()
for _ in range({samples}):
    s.run(None, feed)
print(json.dumps({{"seconds": time.perf_counter() - t0, "session_s": t1 - t0, "runs_s": time.perf_counter() - t1}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) < 2 or not Path(sys.argv[1], "manifest.json").exists():
        raise SystemExit(__doc__)
    samples = int(os.environ.get("BENCH_SAMPLES", "2"))
    src = Path(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="mx-bench-pl-") as tmp:
        bundle = Path(tmp) / "bundle"
        shutil.copytree(src, bundle)
        load0 = os.getloadavg()
        plain = _fake_quant_forward(bundle, samples)
        pl = _per_layer_child(bundle, samples)
        out = {"bench": "per_layer_llm", "bundle": str(src),
               "model": json.loads((src / "manifest.json").read_text())["source"]["description"],
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "loadavg_start": load0, "loadavg_end": os.getloadavg(), "note": "shared 2-core host; noisy"},
               "samples": samples, "per_layer": pl, "fake_quant_forward_only": plain,
               "per_layer_vs_fake_quant_forward": round(pl["seconds"] / plain["seconds"], 2),
               "bench_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "per_layer"}, indent=1))
    print(f"per-layer: {pl['seconds']:.1f} s, {pl['layers']} modules, peak RSS {pl['peak_rss_mb']:.0f} MB; "
          f"first bad {pl['first_bad_layer']}; suggestion {pl['suggested_override']}")


if __name__ == "__main__":
    main()
