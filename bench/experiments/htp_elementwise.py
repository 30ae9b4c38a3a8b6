"""What elementwise ops cost on the HTP simulator when quantized, and where its 16-bit Log is wrong.

    .venv/bin/python bench/experiments/htp_elementwise.py     # → bench/results/htp_elementwise.json

cycles: one op between two 1x1 Convs on a [1, 8, 256, 256] map (4 random calibration inputs),
compiled for SM8650 at 8a8w, 16a8w and fp16 with today's repairs, profiled per op
(`profile --level detailed`, the simulator held on one core, the fewest of 2 runs); `op_cycles` is
every QNN op's but the two Convs', `db` the compile's own check against float. `*_written` rows are
the ops as the repairs write them (Softplus as Relu(x) + Log(1 + Exp(-|x|)), Selu as gamma * Elu,
Softsign as x / (1 + |x|)), built by hand; `"native": true` rows are those three ops with their repair
turned off: what the HTP's own kernel costs.

log_range: x → Log with x drawn log-uniformly from [lo, hi], at 16a8w: the simulator against the
QDQ model on the CPU EP, with the Log's output range as calibrated (`widen_log_ranges` off) and as
compiled (widened to quant/log_range.LOG_MIN_SPAN).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RESULT = Path(__file__).resolve().parents[1] / "results" / "htp_elementwise.json"
OPS = ["Softplus", "Softplus_written", "Selu", "Selu_written", "Softsign", "Softsign_written", "Sigmoid", "Tanh",
       "Exp", "Elu", "Erf", "HardSwish", "HardSigmoid", "Sqrt", "Sin", "Cos", "Atan", "LeakyRelu", "Abs", "Floor"]
REWRITES = {"Softplus": "softplus-as-log-exp", "Selu": "selu-as-elu", "Softsign": "softsign-as-div"}
PRECISIONS = ["8a8w", "16a8w", "fp16"]
RANGES = [(1.0, 2.0), (0.5, 0.9), (1.0, 50.0), (1.0, 60.0), (0.2, 1.0), (0.015, 1.0), (0.1, 10.0)]
SHAPE = (1, 8, 256, 256)


def _act(op: str, x: str, y: str) -> tuple[list, list]:
    """(nodes, initializers) computing y = op(x)."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    if op == "Softplus_written":
        return [helper.make_node("Abs", [x], ["ab"]), helper.make_node("Neg", ["ab"], ["nab"]),
                helper.make_node("Exp", ["nab"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"]),
                helper.make_node("Log", ["e1"], ["l"]), helper.make_node("Relu", [x], ["r"]),
                helper.make_node("Add", ["r", "l"], [y])], [one]
    if op == "Selu_written":
        gamma = numpy_helper.from_array(np.array(1.0507010221481323, np.float32), "gamma")
        return [helper.make_node("Elu", [x], ["e"], alpha=1.6732631921768188), helper.make_node("Mul", ["e", "gamma"], [y])], [gamma]
    if op == "Softsign_written":
        return [helper.make_node("Abs", [x], ["ab"]), helper.make_node("Add", ["ab", "one"], ["d"]),
                helper.make_node("Div", [x, "d"], [y])], [one]
    if op == "Sqrt":
        return [helper.make_node("Abs", [x], ["ab"]), helper.make_node("Sqrt", ["ab"], [y])], []
    return [helper.make_node(op, [x], [y])], []


def _between_convs(op: str, path: Path) -> None:
    rng = np.random.default_rng(0)
    c = SHAPE[1]
    ws = [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.5).astype(np.float32), f"w{i}") for i in (1, 2)]
    mid, inits = _act(op, "a", "b")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1"), *mid, helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2")]
    for i, n in enumerate(mid):
        n.name = f"op{i}"
    _save(nodes, ws + inits, path, SHAPE)


def _save(nodes, inits, path: Path, shape) -> None:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, str(path))


def cycles(work: Path, ops: list[str]) -> list[dict]:
    import modelexport.passes.onnx as repairs
    everything = repairs.all_repairs
    rows = []
    for op in ops:
        _between_convs(op, work / f"{op}.onnx")
        for p in PRECISIONS:
            rows.append(_one(work, op, p, False))
            if op in REWRITES and p != "fp16":
                repairs.all_repairs = lambda op=op: [r for r in everything() if r.name != REWRITES[op]]
                try:
                    rows.append(_one(work, op, p, True))
                finally:
                    repairs.all_repairs = everything
    return rows


def _one(work: Path, op: str, p: str, native: bool) -> dict:
    import modelexport
    from modelexport.profiling.ort_profile import steady_profile
    rng = np.random.default_rng(1)
    cal = [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(work / f"{op}.onnx"), output=work / f"{op}_{p}_{native}", target="SM8650", precision=p,
                            calibration=cal if p != "fp16" else None, use_cache=False)
    total, ops = steady_profile(b.path, runs=2)
    row = {"op": op, "precision": p, "native": native, "total_cycles": total,
           "op_cycles": sum(v for k, v in ops.items() if k not in ("conv1", "conv2")),
           "db": round(b.manifest.numerics["outputs"][0]["sqnr_db"], 1),
           "repairs": [r["name"] for r in b.manifest.parts[0].repairs or []]}
    print(row, flush=True)
    return row


def log_range(work: Path) -> list[dict]:
    import modelexport
    import modelexport.quant.onnx_qdq as onnx_qdq
    from modelexport.backends.ort_qnn.run import CompiledGraph, SimulatorSession
    from modelexport.core.numerics import sqnr_db
    from modelexport.quant.per_layer import _session
    widen = onnx_qdq.widen_log_ranges
    rows = []
    shape = (1, 4, 64, 64)
    _save([helper.make_node("Log", ["x"], ["y"], name="log")], [], work / "log.onnx", shape)
    for lo, hi in RANGES:
        rng = np.random.default_rng(0)
        cal = [{"x": np.exp(rng.uniform(np.log(lo), np.log(hi), shape)).astype(np.float32)} for _ in range(4)]
        row = {"x_range": [lo, hi], "log_range": [float(np.log(lo)), float(np.log(hi))]}
        for label, fn in (("calibrated", lambda *a: []), ("widened", widen)):
            onnx_qdq.widen_log_ranges = fn
            b = modelexport.compile(str(work / "log.onnx"), output=work / f"log_{lo}_{hi}_{label}", target="SM8650",
                                    precision="16a8w", calibration=cal, use_cache=False)
            pm, g = b.manifest.parts[0], b.manifest.graphs[0]
            q = _session(onnx.load(str(b.file(pm.files.quantized_model)))).run(["y"], cal[0])[0]
            got = SimulatorSession(CompiledGraph(None, "", g.target, b.file(g.epcontext_model), None, "")).run(cal[0])[0]["y"]
            row[label] = {"qdq_vs_float_db": round(sqnr_db(np.log(cal[0]["x"]), q), 1),
                          "htp_vs_qdq_db": round(sqnr_db(q, np.asarray(got, np.float32)), 1)}
        onnx_qdq.widen_log_ranges = widen
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    """--ops A,B: only those ops' cycle rows, merged into the results file (no log_range)."""
    only = sys.argv[sys.argv.index("--ops") + 1].split(",") if "--ops" in sys.argv else None
    old = json.loads(RESULT.read_text()) if only and RESULT.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = cycles(work, only or OPS)
        out = {"target": "SM8650", "shape": list(SHAPE),
               "machine": {"cpus": os.cpu_count(), "load_1min_at_start": os.getloadavg()[0]},
               "cycles": [r for r in old.get("cycles", []) if r["op"] not in (only or [])] + rows,
               "log_range": old["log_range"] if only else log_range(work)}
    RESULT.write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
