"""Cost of profiling and of `verify --per-layer` on the real MobileNetV2 → bench/results/profile_cost.json.

- run time on the HTP simulator (one warm-up, then N runs, median) with QNN profiling off, basic, detailed
  (same session set-up otherwise; ONNX Runtime's own profiler is on whenever QNN profiling is);
- `modelexport profile` end to end at basic and detailed;
- `verify` vs `verify --per-layer` (MobileNetV2 16a4w, 2 stored samples), and the override the per-layer
  diff suggests, applied: output SQNR before/after.
Simulator times rank ops within one model; they are not phone latencies. The machine is shared
(2 cores, other jobs running), so absolute numbers are noisy.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path


RUNS = int(os.environ.get("BENCH_RUNS", "5"))


def main() -> None:
    import modelexport
    from modelexport.profiling.ort_profile import time_runs
    from modelexport.runtime.runners import profile_bundle
    from modelexport.quant.per_layer import per_layer
    from modelexport.backends.ort_qnn.verify import stored_samples
    from modelexport.zoo.imagenet import save_sample_photos
    from modelexport.zoo.mobilenet_v2 import export_onnx
    out: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "note": "shared 2-core host; noisy",
                             "loadavg_at_start": os.getloadavg()},
                 "note": "simulator times rank ops within one model; they are not phone latencies"}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model = export_onnx(d / "mobilenet_v2.onnx")
        calib = d / "calib"
        save_sample_photos(calib)
        b8 = modelexport.compile(str(model), output=d / "b8", target="SM8650", precision="8a8w", calibration=str(calib)).path
        runs = {}
        for level in ("off", "basic", "detailed"):
            runs[level] = time_runs(b8, RUNS, level)
        base = runs["off"]["median_s"]
        for level in ("basic", "detailed"):
            runs[level]["slowdown_vs_off"] = round(runs[level]["median_s"] / base, 3) if base else None
        out["mobilenet_v2_8a8w_run"] = runs
        prof = {}
        for level in ("basic", "detailed"):
            t0 = time.perf_counter()
            rep = profile_bundle(b8, RUNS, level)
            prof[level] = {"seconds": round(time.perf_counter() - t0, 3), "rows": len(rep.rows),
                           "htp_nodes_profiled": rep.totals["htp_nodes_profiled"],
                           "qnn_execute_us_median": rep.totals["qnn_execute_us_median"],
                           "qnn_accelerator_cycles_median": rep.totals["qnn_accelerator_cycles_median"],
                           "top3": [{"name": r.name, "op_type": r.op_type, "share": round(r.share, 4), "cycles": r.cycles}
                                    for r in rep.rows[:3]]}
        out["mobilenet_v2_8a8w_profile_cmd"] = prof
        # per-layer on 16a4w, then the suggested override
        b4 = modelexport.compile(str(model), output=d / "b4", target="SM8650", precision="16a4w", calibration=str(calib)).path
        t0 = time.perf_counter()
        v = modelexport.verify(b4)
        t_verify = time.perf_counter() - t0
        bundle = modelexport.contract.open_bundle(b4)
        t0 = time.perf_counter()
        pl = per_layer(b4 / "mobilenet_v2/model.onnx", b4 / "mobilenet_v2/model.qdq.onnx",
                       stored_samples(bundle, "mobilenet_v2"), 5.0, "16a4w", "mobilenet_v2")
        t_pl = time.perf_counter() - t0
        spec = pl.suggestion.split("'")[1]
        bo = modelexport.compile(str(model), output=d / "b4o", target="SM8650", precision="16a4w", calibration=str(calib),
                                 overrides=[spec]).path
        vo = modelexport.verify(bo)
        plo = per_layer(bo / "mobilenet_v2/model.onnx", bo / "mobilenet_v2/model.qdq.onnx",
                        stored_samples(bundle, "mobilenet_v2"), 5.0, "16a4w", "mobilenet_v2")
        at = {x.name: x.sqnr_db for x in plo.layers}
        out["mobilenet_v2_16a4w_per_layer"] = {
            "verify_s": round(t_verify, 3), "per_layer_extra_s": round(t_pl, 3), "layers": len(pl.layers), "samples": pl.samples,
            "first_bad_layer": pl.first_bad_layer, "culprit_layer": pl.culprit_layer, "suggested_override": pl.suggestion,
            "before": {"output_sqnr_db_compiled": round(v.graphs[0].outputs[0].sqnr_db, 3),
                       "argmax_agreement": v.graphs[0].outputs[0].argmax_agreement,
                       "first_bad_layer_sqnr_db": round(next(x.sqnr_db for x in pl.layers if x.name == pl.first_bad_layer), 3),
                       "fake_quant_output_sqnr_db": round(pl.layers[-1].sqnr_db, 3)},
            "after_override": {"output_sqnr_db_compiled": round(vo.graphs[0].outputs[0].sqnr_db, 3),
                               "argmax_agreement": vo.graphs[0].outputs[0].argmax_agreement,
                               "first_bad_layer_sqnr_db": round(at.get(pl.first_bad_layer, float("nan")), 3),
                               "fake_quant_output_sqnr_db": round(plo.layers[-1].sqnr_db, 3),
                               "new_first_bad_layer": plo.first_bad_layer}}
    # SmolLM2-135M --per-layer needs a compiled LLM bundle (tens of minutes): bench/per_layer_llm.py BUNDLE
    llm = Path(__file__).parent / "results" / "per_layer_llm.json"
    out["smollm2_135m_per_layer"] = (json.loads(llm.read_text())["per_layer"] | {"source": "bench/results/per_layer_llm.json"}
                                     if llm.exists() else "not measured: run bench/per_layer_llm.py BUNDLE")
    res = Path(__file__).parent / "results" / "profile_cost.json"
    res.parent.mkdir(exist_ok=True)
    res.write_text(json.dumps(out, indent=2))
    json.dump(out, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
