"""Peak memory of one sweep cell against the model's size: what `sweeping/resources.py` declares
to Ray for ONNX and PyTorch cells.

A cell is measured as a Ray task runs it: `sweeping.cells.run_cell` (compile for one target and
precision, then the format's verify when the compile recorded no numerics) in a fresh Python
process, with its own empty compile cache (a cold compile: the cache would only lower it). The
peak is the largest sum of RSS over that process and every process it started (the QNN EP's and
the quantizer's spawned workers), sampled every 50 ms: what the machine must hold at once (shared
library pages are counted once per process, so this errs high, the side Ray's reservation should
err on).

Model bytes: an ONNX file's size (+ external data); a PyTorch model's parameter and buffer bytes
(known to the sweep for a `.pt2` by its file size; for a `model.py:FACTORY` only after it is built).

    PYTHONPATH=src .venv/bin/python bench/sweep_cell_memory.py [--only NAME ...]
    → bench/results/sweep_cell_memory.json (every point, and the fitted rule per kind)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULT = ROOT / "results" / "sweep_cell_memory.json"
sys.path.insert(0, str(ROOT.parent / "tests"))
MB = 2**20
TARGET = "SM8650"
PRECISIONS = ("fp16", "8a8w")
# (name, kind, how to make it): real ONNX models of zoo/real_onnx.py from 28 KB to 69 MB, MobileNetV2;
# PyTorch: the tests' MLP, MLPerf Tiny ResNet8, MobileNetV2 (ImageNet weights), a shrunk ViT, and a wide
# MLP (5 x Linear(2048, 2048), 84 MB of float weights) for a point at a size none of the others has
ONNX_MODELS = ("mtcnn_pnet", "ppocr_cls", "ppocr_det", "nudenet_320n", "minilm_l3")
TORCH_MODELS = ("mlp", "resnet8", "mobilenet_v2", "vit", "wide_mlp")

TORCH_FACTORY = """
import sys
sys.path.insert(0, {bench!r})
sys.path.insert(0, {tests!r})


def build():
    if {name!r} == "wide_mlp":
        import torch
        torch.manual_seed(0)
        layers = [m for _ in range(5) for m in (torch.nn.Linear(2048, 2048), torch.nn.ReLU())]
        return torch.nn.Sequential(*layers).eval(), (torch.randn(1, 2048),)
    if {name!r} == "mlp":
        import torch
        from et_models import MLP
        ns = {{}}
        exec(MLP, ns)
        return ns["build"]()
    from real_torch_models import CASES
    return next(c for c in CASES if c.name == {name!r}).build()
"""

CELL = """
import json, sys
from pathlib import Path
import modelexport
from modelexport.sweeping.cells import plan_cells, run_cell
from modelexport.sweeping.matrix import load_matrix
cell = plan_cells(load_matrix(sys.argv[1]))[0]
out = run_cell(cell.job(Path(sys.argv[2]), True, modelexport.compile))
print(json.dumps(out))
"""


def _onnx_model(name: str, work: Path) -> tuple[dict, int]:
    from modelexport.zoo.real_onnx import get, model_path
    m = get(name)
    path = model_path(m)
    size = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.stem + "*.data"))
    entry = {"path": str(path), "name": name, "calibration": "random"}
    if m.input_shapes:
        entry["input_shapes"] = {k: list(v) for k, v in m.input_shapes.items()}
    if m.input_values:
        entry["input_values"] = {k: v for k, v in m.input_values.items()}
    return entry, size


def _torch_model(name: str, work: Path) -> tuple[dict, int]:
    py = work / f"{name}.py"
    py.write_text(TORCH_FACTORY.format(bench=str(ROOT), tests=str(ROOT.parent / "tests"), name=name))
    sys.path.insert(0, str(work))
    import importlib
    module, _ = importlib.import_module(name).build()
    size = sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])
    return {"path": f"{py}:build", "name": name, "calibration": "random"}, size


def _tree_rss(pid: int) -> tuple[int, int]:
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total, len(procs)


def measure(entry: dict, precision: str, work: Path) -> dict:
    matrix = work / f"{entry['name']}_{precision}.json"
    matrix.write_text(json.dumps({"models": [entry], "targets": [TARGET], "precisions": [precision]}))
    env = dict(os.environ, MODELEXPORT_CACHE_DIR=str(work / f"cache_{entry['name']}_{precision}"))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CELL, str(matrix), str(work / "out")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, most = 0, 0
    while proc.poll() is None:
        rss, n = _tree_rss(proc.pid)
        peak, most = max(peak, rss), max(most, n)
        time.sleep(0.05)
    out, err = proc.communicate()
    try:
        outcome = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        outcome = {"status": "crashed", "reason": err[-400:]}
    return {"peak_mb": round(peak / MB, 1), "processes": most, "wall_s": round(time.perf_counter() - t0, 1),
            "status": outcome.get("status"), "reason": outcome.get("reason")}


def fit(points: list[dict]) -> dict:
    """base + k x model bytes: least squares over the points, then the base raised until every
    point is under the line (a reservation must not fall short), rounded up to 64 MB."""
    import numpy as np
    done = [p for p in points if p["status"] == "compiled"]
    if len({p["model"] for p in done}) < 2:
        return {}
    xs = np.array([p["model_mb"] for p in done])
    ys = np.array([p["peak_mb"] for p in done])
    k = max(float(np.polyfit(xs, ys, 1)[0]), 0.0)
    base = 64 * int(np.ceil(float(max(ys - k * xs)) / 64))
    worst = done[int(np.argmax(ys - k * xs))]
    return {"base_mb": base, "per_model_mb": round(k, 2), "models": sorted({p["model"] for p in done}),
            "points": len(done), "max_model_mb": float(xs.max()), "sets_the_base": f"{worst['model']} {worst['precision']}"}


# One rule per kind and precision class: quantizing calibrates on the model's activations, which
# file size does not see.
def rules_of(rows: list[dict]) -> dict:
    return {f"{kind}/{cls}": fit([r for r in rows if r["kind"] == kind and (r["precision"] == "fp16") == (cls == "float")])
            for kind in ("onnx", "torch") for cls in ("float", "quantized")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", help="measure these models again; the others' points stay")
    ap.add_argument("--refit", action="store_true", help="only fit the rules again on the stored points")
    args = ap.parse_args(argv)
    old = json.loads(RESULT.read_text()) if RESULT.exists() and (args.only or args.refit) else {}
    rows, runs = [], old.get("runs", [])
    if not args.refit:
        load0 = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="cell_memory_") as tmp:
            work = Path(tmp)
            for kind, names, make in (("onnx", ONNX_MODELS, _onnx_model), ("torch", TORCH_MODELS, _torch_model)):
                for name in names:
                    if args.only and name not in args.only:
                        continue
                    entry, size = make(name, work)
                    for precision in PRECISIONS:
                        r = measure(entry, precision, work)
                        row = {"kind": kind, "model": name, "model_mb": round(size / MB, 3), "precision": precision, **r}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
        runs = runs + [{"date": time.strftime("%Y-%m-%d %H:%M"), "models": sorted({r["model"] for r in rows}),
                        "load_avg_start": round(load0, 2), "load_avg_end": round(os.getloadavg()[0], 2)}]
    # --only / --refit: the other models' points stay
    rows = [r for r in old.get("points", []) if r["model"] not in {x["model"] for x in rows}] + rows
    rules = rules_of(rows)
    RESULT.write_text(json.dumps({
        "what": "peak RSS (sum over the cell's process tree) of one sweep cell, cold cache, vs model bytes",
        "target": TARGET, "host": platform.node(), "python": platform.python_version(),
        "runs": runs, "rules": rules, "points": rows}, indent=2) + "\n")
    print(json.dumps(rules, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
