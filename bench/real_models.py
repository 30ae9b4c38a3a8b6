"""Every real ONNX model of zoo/real_onnx.py through audit → compile (fp16, 8a8w; SM8650) → verify.

Each (model, precision) runs in its own process, as a user's command would: a crash of a native
library is recorded as such instead of ending the run. Calibration and verification use the
model's real input where the package ships one (a photo), else random inputs (recorded).
Writes bench/results/real_models.json: compiled or not (with the audit's named nodes and fixes
when not), share of nodes on the HTP, SQNR, compile time, the repairs that ran.

--precisions may name `auto` (--precision auto --min-sqnr 25; the search's candidates are recorded).

usage: python bench/real_models.py [--only NAME ...] [--precisions fp16,8a8w,auto] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULT = ROOT / "results" / "real_models.json"
TARGET = "SM8650"
AUTO_BUDGET_DB = 25


def one(name: str, precision: str, work: Path) -> dict:
    """audit → compile → verify of one model at one precision, in this process."""
    import modelexport
    from modelexport.core.errors import ModelExportError
    from modelexport.zoo.real_onnx import get, input_label, model_path, real_inputs
    m = get(name)
    path = model_path(m)
    shapes = {k: v for k, v in m.input_shapes.items()}
    values = dict(m.input_values) or None
    row: dict = {"model": name, "precision": precision, "kind": m.kind, "package": m.package, "quirk": m.quirk}
    loaded = None
    try:
        from modelexport.backends.ort_qnn.repair import load_repaired
        loaded = load_repaired(path, shapes or None, values)
        first = loaded.inputs[0].name
        samples = real_inputs(m, first, work / "speech")
        if samples is not None and len(loaded.inputs) > 1:
            samples = None                   # a photo or a sentence feeds single-input models only
        calib = samples or "random"
        row["input"] = input_label(m) if samples else "random"
        row["repairs"] = loaded.repairs
    except ModelExportError as e:
        return row | {"stage": "load", "compiled": False, "error": e.problem, "fix": e.fix}
    t0 = time.perf_counter()
    try:
        rep = modelexport.audit(str(path), target=TARGET, precision=precision, input_shapes=shapes or None,
                                input_values=values)
        tot = rep.totals()
        row["audit"] = {"by_backend": tot["by_backend"], "cpu_nodes": [
            {"node": n.name, "op": n.op_type, "reason": (n.reason or "")[:300], "fix": n.fix} for n in rep.nodes if n.backend == "CPU"][:10],
            "notes": rep.notes, "seconds": round(time.perf_counter() - t0, 1)}
    except ModelExportError as e:
        row["audit"] = {"error": e.problem, "fix": e.fix}
    t0 = time.perf_counter()
    auto = {"min_sqnr": [str(AUTO_BUDGET_DB)]} if precision == "auto" else {}
    try:
        b = modelexport.compile(str(path), output=work / f"{name}_{precision}", target=TARGET, precision=precision,
                                calibration=calib if precision != "fp16" or samples else None,
                                input_shapes=shapes or None, input_values=values, force=True, use_cache=False, **auto)
    except ModelExportError as e:
        row |= {"stage": "compile", "compiled": False, "error": e.problem, "fix": e.fix,
                "compile_s": round(time.perf_counter() - t0, 1)}
        if not (auto and (work / f"{name}_{precision}" / "manifest.json").is_file()):
            return row
        from modelexport.contract import open_bundle
        b = open_bundle(work / f"{name}_{precision}")     # auto keeps its best candidate when none meets the budget
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    row["compiled"] = row.get("stage") != "compile"
    man = b.manifest
    num = man.numerics or {}
    row["self_check"] = {"passed": num.get("passed"), "outputs": [o.get("sqnr_db") for o in num.get("outputs", [])],
                         "first_bad_layer": num.get("first_bad_layer"), "input_floor_db": num.get("input_floor_db")}
    if man.precision_search:
        s = man.precision_search
        row["auto"] = {"flags": s["flags"], "passed": s["passed"], "cycles_vs_8a8w": s["cycles_vs_8a8w"],
                       "candidates": [{k: c[k] for k in ("flags", "worst_sqnr_db", "cycles", "cpu_nodes", "refused")}
                                      for c in s["candidates"]]}
    pl = man.placement[man.parts[0].name][TARGET]
    on, cpu = pl["htp_nodes"], len(pl["cpu_fallbacks"])
    row["htp_share"] = round(on / max(1, on + cpu), 4)
    row["cpu_fallbacks"] = pl["cpu_fallbacks"][:10]
    row["manifest_repairs"] = man.parts[0].repairs
    try:
        v = modelexport.verify(b.path).to_dict()
        outs = v["graphs"][0]["outputs"]
        row["verify"] = {"passed": v["passed"], "inputs": v["graphs"][0]["inputs"],
                         "sqnr_db": [o.get("sqnr_db") for o in outs], "cosine": [o.get("cosine") for o in outs]}
    except ModelExportError as e:
        row["verify"] = {"error": e.problem, "fix": e.fix}
    return row


def _write(rows: list[dict], args) -> dict:
    done = {"target": TARGET, "machine": {"cpus": os.cpu_count()}, "rows": rows}
    out = Path(args.out)
    if args.only and out.exists():                # a partial run updates its rows only
        mine = {(r["model"], r["precision"]) for r in rows}
        done["rows"] = [r for r in json.loads(out.read_text()).get("rows", []) if (r["model"], r["precision"]) not in mine] + rows
    done["summary"] = {p: {"models": sum(1 for r in done["rows"] if r["precision"] == p),
                           "compiled": sum(1 for r in done["rows"] if r["precision"] == p and r.get("compiled")),
                           "tracebacks": sum(1 for r in done["rows"] if r["precision"] == p and r.get("traceback"))}
                       for p in dict.fromkeys(r["precision"] for r in done["rows"])}   # every row's, a partial run too
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(done, indent=1, default=str))
    return done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--precisions", default="fp16,8a8w")
    ap.add_argument("--one", nargs=2, metavar=("NAME", "PRECISION"))
    ap.add_argument("--out", default=str(RESULT), help="the results file (default bench/results/real_models.json)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds one model at one precision may take")
    args = ap.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory(prefix="bench-real-") as work:
            print("@@ROW@@" + json.dumps(one(*args.one, Path(work)), default=str))
        return
    from modelexport.zoo.real_onnx import REAL_ONNX
    rows = []
    for m in REAL_ONNX:
        if args.only and m.name not in args.only:
            continue
        for prec in args.precisions.split(","):
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, __file__, "--one", m.name, prec], capture_output=True, text=True,
                                      env=dict(os.environ), timeout=args.timeout)
            except subprocess.TimeoutExpired as e:
                proc = subprocess.CompletedProcess(e.cmd, -9, "", f"timed out after {args.timeout:g} s")
            _, marker, tail = proc.stdout.rpartition("@@ROW@@")
            out = tail.strip().partition("\n")[0] if marker else ""        # a library may print after it
            row = json.loads(out) if out else {"model": m.name, "precision": prec, "compiled": False,
                                                 "error": f"process died (exit {proc.returncode})", "stderr": proc.stderr[-800:]}
            row["traceback"] = "Traceback (most recent call last)" in proc.stderr
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            _write(rows, args)                   # after every row: a long run stopped midway keeps what it measured
            print(f"{m.name:18s} {prec:5s} compiled={row.get('compiled')} htp={row.get('htp_share')} "
                  f"sqnr={row.get('verify', {}).get('sqnr_db')} {row.get('error', '')[:120]}", flush=True)
    print(json.dumps(_write(rows, args)["summary"]))


if __name__ == "__main__":
    main()
