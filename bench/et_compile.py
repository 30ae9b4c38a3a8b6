"""MobileNetV2 → .pte (QNN delegate, SM8650) through modelexport vs the same steps written as a
plain ExecuTorch script (the seeds' flow), in one run: lowering time and peak RSS per process,
cold vs cached, .pte size, and the simulator run time of the result.

Every variant runs in a fresh child process (imports included, as a user's command would), one
after another; peak RSS is the child's own (os.wait4). Both sides calibrate on the same two
sample photos. modelexport's wall time also covers what the plain script does not do (saving the
float reference, reading the binaries back, the numerics check on the simulator); its
per-step timings (quantize, lower, to_executorch) are the like-for-like comparison.

    .venv/bin/python bench/et_compile.py [--precisions 8a8w,fp16]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "et_compile.json"

FACTORY = '''
import torch
from modelexport.zoo.mobilenet_v2 import mobilenet_v2


def build():
    return mobilenet_v2(), (torch.zeros(1, 3, 224, 224),)
'''

PLAIN = r'''
import json, sys, time
from pathlib import Path
import numpy as np
t_start = time.perf_counter()
from modelexport.toolchain.executorch_env import ensure_executorch_qnn   # the ABI adapter: both sides need it
ensure_executorch_qnn()
import torch
from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
from executorch.backends.qualcomm.utils.utils import (generate_htp_compiler_spec, generate_qnn_executorch_compiler_spec,
                                                      to_edge_transform_and_lower_to_qnn)
from executorch.exir import ExecutorchBackendConfig
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from modelexport.zoo.mobilenet_v2 import mobilenet_v2

precision, calib, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
model, example = mobilenet_v2(), (torch.zeros(1, 3, 224, 224),)
t_imports = time.perf_counter() - t_start
t0 = time.perf_counter()
if precision != "fp16":
    quantizer = QnnQuantizer(soc_model=QcomChipset.SM8650)
    quantizer.set_default_quant_config(getattr(QuantDtype, "use_" + precision), is_conv_per_channel=True,
                                       is_linear_per_channel=True)
    prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    with torch.no_grad():
        for f in sorted(calib.glob("*.npy")):
            prepared(torch.from_numpy(np.load(f)))
    model = convert_pt2e(prepared)
t1 = time.perf_counter()
specs = generate_qnn_executorch_compiler_spec(soc_model=QcomChipset.SM8650,
                                              backend_options=generate_htp_compiler_spec(use_fp16=precision == "fp16"))
edge = to_edge_transform_and_lower_to_qnn(model, example, specs)
t2 = time.perf_counter()
program = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=True, segment_alignment=16384))
t3 = time.perf_counter()
out.write_bytes(program.buffer)
print("RESULT=" + json.dumps({"imports_s": round(t_imports, 3), "quantize_s": round(t1 - t0, 3), "lower_s": round(t2 - t1, 3),
                              "to_executorch_s": round(t3 - t2, 3), "steps_s": round(t3 - t0, 3), "pte_bytes": len(program.buffer)}))
'''


def run_measured(cmd: list[str], env: dict) -> dict:
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child: exec the command with stdout/stderr to files
        out = open(env["_BENCH_OUT"], "w")
        err = open(env["_BENCH_ERR"], "w")
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        os.chdir(str(REPO))
        os.execve(cmd[0], cmd, {k: v for k, v in env.items() if not k.startswith("_BENCH_")})
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    return {"returncode": os.waitstatus_to_exitcode(status), "wall_s": round(wall, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "stdout": Path(env["_BENCH_OUT"]).read_text(),
            "stderr": Path(env["_BENCH_ERR"]).read_text()[-3000:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default="8a8w,fp16")
    ap.add_argument("--runs", type=int, default=3, help="simulator runs of each .pte")
    args = ap.parse_args(argv)

    from modelexport.zoo.imagenet import save_sample_photos
    work = Path(tempfile.mkdtemp(prefix="et_compile_bench_"))
    (work / "mnv2.py").write_text(FACTORY)
    (work / "plain.py").write_text(PLAIN)
    calib = work / "calib"
    photos = save_sample_photos(calib)
    adapter_cache = Path(os.environ.get("MODELEXPORT_CACHE_DIR", Path.home() / ".cache" / "modelexport"))
    base_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "_BENCH_OUT": str(work / "out.txt"),
                "_BENCH_ERR": str(work / "err.txt")}
    py = sys.executable
    results: dict = {"machine": {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg(), "python": platform.python_version()},
                     "model": "MobileNetV2 (ImageNet weights), 1x3x224x224, SM8650", "calibration": "2 sample photos",
                     "variants": {}}
    if OUT.exists():   # a run of some precisions keeps the others' results
        results["variants"] = json.loads(OUT.read_text()).get("variants", {})
    for precision in args.precisions.split(","):
        r: dict = {}
        # 1. the seeds' plain ExecuTorch script
        plain = run_measured([py, str(work / "plain.py"), precision, str(calib), str(work / f"plain_{precision}.pte")],
                             {**base_env, "MODELEXPORT_CACHE_DIR": str(adapter_cache)})
        assert plain["returncode"] == 0, plain["stderr"]
        steps = json.loads(next(x for x in plain["stdout"].splitlines() if x.startswith("RESULT="))[7:])
        r["plain_executorch"] = {"wall_s": plain["wall_s"], "peak_rss_mb": plain["peak_rss_mb"], **steps}
        # 2. modelexport, cold (an empty compile cache; the adapter is already built) and cached
        cache = work / f"cache_{precision}"
        adapter = cache / "qnn-adapter"
        if (adapter_cache / "qnn-adapter").exists() and not adapter.exists():
            cache.mkdir()
            os.symlink(adapter_cache / "qnn-adapter", adapter)   # share the built adapter, not compile results
        for label in ("cold", "cached"):
            out = work / f"me_{precision}_{label}"
            me = run_measured([py, "-m", "modelexport", "compile", f"{work / 'mnv2.py'}:build", "--precision", precision,
                               "--calibration", str(calib), "--target", "SM8650", "-o", str(out), "--json"],
                              {**base_env, "MODELEXPORT_CACHE_DIR": str(cache)})
            assert me["returncode"] == 0, me["stderr"]
            res = json.loads(me["stdout"][me["stdout"].index("{"):])
            t = res["timings"].get("mnv2.SM8650", {})
            pte = next(f for f in res["files"] if f["path"].endswith(".pte"))
            r[f"modelexport_{label}"] = {"wall_s": me["wall_s"], "peak_rss_mb": me["peak_rss_mb"], **t,
                                         "steps_s": round(sum(t.get(k, 0) for k in ("quantize_s", "lower_s", "to_executorch_s")), 3),
                                         "pte_bytes": pte["size"], "cache": res["cache"] | {"root": None},
                                         "placement": res["placement"]["summary"]}
        cold, plain_r = r["modelexport_cold"], r["plain_executorch"]
        r["ratio_modelexport_over_plain"] = {
            "wall": round(cold["wall_s"] / plain_r["wall_s"], 3),
            "steps (quantize+lower+to_executorch)": round(cold["steps_s"] / plain_r["steps_s"], 3) if plain_r["steps_s"] else None,
            "lower": round(cold["lower_s"] / plain_r["lower_s"], 3),
            "peak_rss": round(cold["peak_rss_mb"] / plain_r["peak_rss_mb"], 3)}
        r["cached_over_cold_wall"] = round(r["modelexport_cached"]["wall_s"] / cold["wall_s"], 3)
        # 3. the .pte on this host's HTP simulator (executorch.runtime, QnnBackend)
        import modelexport
        bundle = work / f"me_{precision}_cold"
        runs = modelexport.run(bundle, {"x": photos["coffee"]}, repeat=args.runs)
        r["simulator"] = {"load_s": round(runs.load_seconds, 4), "run_s": [round(x, 4) for x in runs.run_seconds],
                          "top1_coffee": int(runs.outputs["output_0"].argmax())}
        num = json.loads((bundle / "manifest.json").read_text())["numerics"]
        r["numerics"] = {o["name"]: {k: o[k] for k in ("sqnr_db", "cosine", "max_abs_error", "argmax_agreement") if k in o}
                         for o in num["outputs"]}
        r["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        r["load_avg_at_end"] = os.getloadavg()
        results["variants"][precision] = r
        print(precision, json.dumps({k: v for k, v in r.items() if k.startswith("ratio") or k == "simulator"}), flush=True)
    results["machine"]["load_avg_end"] = os.getloadavg()
    results["notes"] = ("Simulator times say nothing about a phone. The machine is shared (see load averages): compare "
                        "ratios within this run, not absolute times across runs.")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
