"""Compile's own numerics check of an ONNX part, before the bundle is written.

The compiled EPContext model runs on the HTP simulator beside the float model on the CPU EP, on
the part's verify samples; each output is scored as `verify` scores it. Below the precision's pass
mark the first layer that falls below is found on the CPU: against the QDQ model for a quantized
compile, against the fp16 twin (quant/fp16_twin.py) for fp16, with why its values do not fit
float16. The result is manifest.numerics; `--strict-numerics` refuses the bundle on it (exit 7).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .run import CompiledGraph, SimulatorSession
from .verify import check_output

NUMERICS_SAMPLES = 4
WIDER = {"8a8w": "16a8w", "16a8w": "16a16w", "16a4w": "16a8w"}     # the override a bad layer is offered


def check_part(part, epcontext: Path, target: str, provider_options: dict | None = None,
               threshold: float | None = None) -> dict[str, Any]:
    """→ manifest.numerics for one compiled part on one target (pass mark: `threshold`, else the precision's)."""
    threshold = part.precision.min_sqnr_db if threshold is None else threshold
    samples = part.verify_inputs.samples[:NUMERICS_SAMPLES]
    checks = measure(Path(part.work["float"]), epcontext, target, samples, lambda name: threshold)
    num: dict[str, Any] = {
        "outputs": [_row(c) for c in checks], "threshold_db": threshold, "samples": len(samples),
        "passed": all(c.passed for c in checks), "inputs": part.verify_inputs.kind, "part": part.name, "target": target,
        "reference": "float ONNX on the CPU EP", "runtime": "the HTP simulator (libQnnHtp.so)"}
    if not num["passed"]:
        floor = input_floor(Path(part.work["float"]), samples)
        if floor is not None and floor < threshold:
            num["input_floor_db"] = floor      # the float model itself: no compile can pass this mark here
        else:
            num["first_bad_layer"] = first_bad_layer(part, samples, threshold, provider_options)
    return num


def input_floor(float_path: Path, samples: list[dict]) -> float | None:
    """The float model's worst output SQNR when only its float inputs are rounded to float16 (on
    the CPU EP, nothing compiled): the least any HTP graph changes. Below the pass mark, the model
    is unstable on these inputs (voicefilter's int8 LSTMs on random normal frames: 8.3 dB; on
    log-mel-like frames 39 dB); None when no input is float."""
    import onnxruntime as ort

    from ...core.numerics import sqnr_db
    if not any(np.issubdtype(np.asarray(v).dtype, np.floating) for s in samples for v in s.values()):
        return None
    ref = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
    worst = float("inf")
    for s in samples:
        rounded = {k: (np.asarray(v).astype(np.float16).astype(np.asarray(v).dtype)
                       if np.issubdtype(np.asarray(v).dtype, np.floating) else v) for k, v in s.items()}
        for a, b in zip(ref.run(None, s), ref.run(None, rounded)):
            if np.issubdtype(np.asarray(a).dtype, np.floating) and np.asarray(a).size:
                worst = min(worst, sqnr_db(np.asarray(a, np.float64), np.asarray(b, np.float64)))
    return None if worst == float("inf") else float(worst)


def measure(float_path: Path, epcontext: Path, target: str, samples: list[dict], threshold_of) -> list:
    """Each output of the compiled graph on the simulator against the float model on the CPU EP
    (verify's OutputCheck per output; `threshold_of(output name)` is its pass mark)."""
    import onnxruntime as ort
    ref = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
    sim = SimulatorSession(CompiledGraph(None, "", target, epcontext, None, ""))
    names = [o.name for o in ref.get_outputs()]
    refs: dict[str, list] = {n: [] for n in names}
    gots: dict[str, list] = {n: [] for n in names}
    for s in samples:
        for n, r in zip(names, ref.run(names, s)):
            refs[n].append(r)
        got, _ = sim.run(s)
        for n in names:
            gots[n].append(np.asarray(got[n], dtype=np.float32))
    return [check_output(n, refs[n], gots[n], threshold_of(n)) for n in names]


def _row(c) -> dict[str, Any]:
    sq = c.sqnr_db if np.isfinite(c.sqnr_db) else (999.0 if c.sqnr_db > 0 else None)
    return {"name": c.name, "sqnr_db": sq, "cosine": c.cosine, "max_abs_error": c.max_abs_error,
            **({"argmax_agreement": c.argmax_agreement} if c.argmax_agreement is not None else {}),
            **({"note": c.note} if c.note else {})}


def first_bad_layer(part, samples: list[dict], threshold: float, provider_options: dict | None = None
                    ) -> dict[str, Any] | None:
    """The first layer below the pass mark on the CPU (QDQ or fp16 twin vs float) and why; when the
    CPU finds none, the first layer where the HTP simulator departs from the CPU (bisection, one
    compile per probe); None when neither can name one."""
    try:
        found = _first_bad(part, samples, threshold)
        if found is None and provider_options is not None:
            found = htp_departure(part, samples[:1], threshold, provider_options)
        return found
    except Exception as e:    # best effort: onnxruntime's own Fail (not a RuntimeError), a graph the CPU EP refuses
        return {"error": f"per-layer localisation failed: {type(e).__name__}: {str(e)[:300]}"}


def _first_bad(part, samples, threshold) -> dict[str, Any] | None:
    import tempfile

    import onnx

    from ...quant.fp16_twin import fp16_twin
    from ...quant.per_layer import per_layer
    float_path = Path(part.work["float"])
    with tempfile.TemporaryDirectory() as tmp:
        if part.work.get("qdq"):
            other, against = Path(part.work["qdq"]), "the QDQ (fake-quant) model on the CPU EP"
        else:
            other, against = Path(tmp) / "fp16_twin.onnx", "the fp16 twin (float16 storage emulated on the CPU EP)"
            onnx.save(fp16_twin(onnx.load(str(float_path))), str(other))
        wider = WIDER.get(part.precision.name)
        rep = per_layer(float_path, other, samples, threshold, part.precision.name, part.name, wider or "16a16w")
    if not wider:
        rep.suggestion = None
    if rep.first_bad_layer is None:
        return None
    bad = next(x for x in rep.layers if x.name == rep.first_bad_layer)
    out: dict[str, Any] = {"layer": bad.name, "node": bad.node, "op_type": bad.op_type, "sqnr_db": bad.sqnr_db,
                           "measured_against": against}
    if part.precision.quantized:
        out["suggested_override"] = rep.suggestion
    else:
        out["cause"] = _fp16_cause(float_path, bad.node, samples)
    return out


def _fp16_cause(float_path: Path, node_name: str, samples: list[dict]) -> str:
    """Why the node's output or inputs do not survive float16, from their float values."""
    import onnx

    from ...quant.fp16_twin import fp16_cause
    from ...quant.per_layer import _session, _with_outputs
    m = onnx.load(str(float_path))
    node = next((n for n in m.graph.node if n.name == node_name), None)
    if node is None:
        return ""
    inits = {t.name for t in m.graph.initializer}
    tensors = [t for t in [*node.output, *node.input] if t and t not in inits]
    sess = _session(_with_outputs(m, tensors))
    values: dict[str, list] = {t: [] for t in tensors}
    for s in samples:
        for t, v in zip(tensors, sess.run(tensors, s)):
            if np.issubdtype(np.asarray(v).dtype, np.floating):
                values[t].append(v)
    for t in tensors:                       # its own output first, then what feeds it
        why = fp16_cause(values[t], node.op_type) if values[t] else ""
        if why:
            return f"{'its output' if t in node.output else 'its input ' + t}: {why}"
    return ""


MAX_PROBES = 10
PROBE_BUDGET_S = 120.0       # a large model's probes stop here, with the range narrowed so far
PROBE_LEVEL = "1"            # probes are prepared at optimization level 1: quicker, the same numerics


def htp_departure(part, samples: list[dict], threshold: float, provider_options: dict) -> dict[str, Any] | None:
    """Bisect the layers for the first whose value on the HTP simulator (the layer made a graph
    output, the graph compiled again) falls below the pass mark against the same graph on the CPU
    EP: where the HTP computes an op differently from ONNX Runtime."""
    import onnx

    from ...quant.per_layer import _session, _with_outputs, layer_plan
    graph_path = Path(part.work.get("qdq") or part.work["float"])
    model = onnx.load(str(graph_path))
    plan = layer_plan(onnx.load(str(part.work["float"])), model, lambda n: n.name or n.output[0])   # node by node
    if not plan:
        return None
    tensors = [t for _, _, t in plan]
    cpu = dict(zip(tensors, _session(_with_outputs(model, tensors)).run(tensors, samples[0])))
    usable = [i for i, t in enumerate(tensors) if np.issubdtype(np.asarray(cpu[t]).dtype, np.floating)]
    quick = dict(provider_options, htp_graph_finalization_optimization_mode=PROBE_LEVEL)
    lo, hi, probes, found = 0, len(usable) - 1, 0, None
    t0 = time.perf_counter()
    while lo <= hi and probes < MAX_PROBES and time.perf_counter() - t0 < PROBE_BUDGET_S:
        mid = (lo + hi) // 2
        i = usable[mid]
        db = _htp_db(graph_path, tensors[i], cpu[tensors[i]], samples[0], quick)
        probes += 1
        if db < threshold:
            found, hi = (i, db), mid - 1
        else:
            lo = mid + 1
    if found is None:
        return None
    i, db = found
    name, node, _ = plan[i]
    exact = lo > hi
    return {"layer": name, "node": node.name, "op_type": node.op_type, "sqnr_db": db, "htp_departure": True,
            "probes": probes, "exact": exact,
            "measured_against": f"the same graph on the CPU EP, the layer made an output of the graph compiled again "
                                f"for the simulator ({probes} probes" + ("" if exact else f"; stopped after "
                                f"{PROBE_BUDGET_S:.0f} s: the departure is at or before this node") + ")"}


def _htp_db(graph_path: Path, tensor: str, cpu_value, sample: dict, provider_options: dict) -> float:
    import tempfile

    import onnx
    from onnx import helper

    from ...core.numerics import sqnr_db
    from ...toolchain.ort_qnn import SessionPlan, create_session
    m = onnx.load(str(graph_path))
    if tensor not in {o.name for o in m.graph.output}:
        m.graph.output.append(helper.make_empty_tensor_value_info(tensor))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save(m, str(path))
        got = create_session(str(path), SessionPlan(provider_options=provider_options)).run([tensor], sample)[0]
    return sqnr_db(cpu_value, np.asarray(got, dtype=np.float32))
