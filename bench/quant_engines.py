"""Quantization engines side by side on real ONNX models: ONNX Runtime's static QDQ quantizer (what
modelexport uses: MinMax; and its Percentile / Entropy calibrators) against Qualcomm's AIMET
(aimet-onnx: tf / tf_enhanced / percentile range setting, cross-layer equalisation, AdaRound,
sequential MSE), at 8a8w and 16a8w.

Every engine of a model quantizes the same float graph (the repaired model a compile quantizes,
after ONNX Runtime's `qnn_preprocess_model` when that changes it: the graph ONNX Runtime's quantizer
really sees) on the same calibration samples; every QDQ model is scored on the same held-out
samples: SQNR (modelexport.core.numerics.sqnr_db: 10 log10(sum ref^2 / sum (ref - got)^2), per
output over all held-out samples, the worst output) of the QDQ model on ONNX Runtime's CPU EP, and,
where it loads, of the same QDQ model compiled by the QNN EP for the HTP simulator (libQnnHtp.so,
SM8650 = soc_model 57, v75), both against the float model on the CPU EP. Image models calibrate on
16 of scikit-image's 20 photos and are scored on 4 others (the model's own corpus photo and 3
more), preprocessed as the corpus row's ImageInput says; other models on random inputs as
modelexport makes them (token ids below the embedding table's size, masks of ones).

AIMET lives in its own venv (it pins nothing the project uses, but brings torch, pandas, bokeh,
panel ...): this script runs in the project's venv and calls itself in that venv for the AIMET
engines (`--aimet-python`). Each quantization and each simulator run is its own process, with a
time limit; a failure is recorded with its first line.

    .venv/bin/python bench/quant_engines.py [--only ppocr_det mtcnn_onet] [--engines ort_minmax,aimet_tf]
        [--precisions 8a8w,16a8w] [--aimet-python /tmp/aimet-venv/bin/python] [--out PATH]

The AIMET venv (bench/quant_engines.md has the results and the reading):
    python3.11 -m venv /tmp/aimet-venv
    /tmp/aimet-venv/bin/pip install aimet-onnx==2.42.0 onnxruntime==1.32.0 onnx==1.23.2 numpy==2.4.6 torch==2.13.0
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
RESULT = ROOT / "results" / "quant_engines.json"
TARGET = "SM8650"
HTP_OPTIMIZATION_LEVEL = 1          # QNN graph finalization: the quick level (the numerics are the level's-independent)
DEFAULT_MODELS = ("mtcnn_onet", "doc_orientation", "minilm_l3", "nudenet_320n", "open_nsfw", "ppocr_det", "layout_cdla")
N_CALIB, N_HELD = 16, 4
HELD_OUT_PHOTOS = ("coffee.png", "motorcycle_left.png", "retina.jpg", "brick.png")   # + the row's own photo
ENTROPY_BINS = (512, 128)           # histogram bins, quantized bins (TensorRT uses 2048: ORT's Python KL search
                                    # takes ~3 s per tensor there, ~0.6 s at 512)
PERCENTILE = 99.99                  # both engines' percentile calibration (AIMET's default 100 is min-max)
ADAROUND_ITERATIONS = 50            # AIMET recommends 10,000 per layer: this is a quick, few-iteration run
ADAROUND_SAMPLES = 4                # of the calibration samples, for AdaRound's per-layer activations (all for the ranges)
ADAROUND_TIMEOUT = 300
SEQ_MSE_CANDIDATES = 20             # AIMET's default
SEQ_MSE_SAMPLES = 4                 # of the calibration samples, for the per-layer search (all for the ranges)
PRECISIONS = {"8a8w": {"ort": ("QUInt8", "QUInt8"), "aimet": ("int8", "int8")},
              "16a8w": {"ort": ("QUInt16", "QUInt8"), "aimet": ("int16", "int8")}}
# the HTP v75 config of AIMET with only the supergroups ONNX Runtime's QNN EP fuses (Conv/ConvTranspose
# followed by Relu/Clip, its ConvActivationFusion): with the others (Conv+PRelu, Conv+HardSwish,
# Add+Relu ...) AIMET leaves the Conv's output unquantized and the QNN EP runs that Conv in float16
KEPT_SUPERGROUPS = ("Conv+Relu", "Conv+Clip", "ConvTranspose+Relu")
# ONNX Runtime engines that quantize a float graph AIMET rewrote first: engine -> (AIMET step, its graph)
FLOAT_PREP = {"ort_minmax_bnfold": ("bnfold", "float.bnfold.onnx"), "ort_minmax_cle": ("cle", "float.cle.onnx"),
              "ort_percentile_cle": ("cle", "float.cle.onnx")}

ENGINES = {
    "ort_minmax": ("ort", "ONNX Runtime quantize_static, MinMax: modelexport's own quantize_onnx (today's path)"),
    "ort_percentile": ("ort", f"ONNX Runtime, CalibrationMethod.Percentile ({PERCENTILE})"),
    "ort_entropy_qs": ("ort", "ONNX Runtime, CalibrationMethod.Entropy through quantize_static (its fixed 128 "
                              "bins into 128: the same ranges as MinMax)"),
    "ort_entropy": ("ort", "ONNX Runtime's EntropyCalibrater with 512 bins into 128 (create_calibrator), "
                           "its ranges into the same quantizer"),
    "ort_minmax_bnfold": ("ort", "ONNX Runtime MinMax on the graph with AIMET's BatchNorm folding "
                                 "(fold_all_batch_norms_to_weight): what AIMET's graph prep alone gives"),
    "ort_minmax_cle": ("ort", "ONNX Runtime MinMax on the float graph after AIMET's equalize_model (cross-layer "
                              "equalisation as a float-to-float step in front of today's path)"),
    "ort_percentile_cle": ("ort", f"ONNX Runtime Percentile ({PERCENTILE}) on the graph after AIMET's equalize_model"),
    "aimet_tf": ("aimet", "AIMET QuantizationSimModel, quant_scheme tf (min-max), after BN folding"),
    "aimet_tf_enhanced": ("aimet", "AIMET, quant_scheme tf_enhanced (SQNR-searched ranges), after BN folding"),
    "aimet_percentile": ("aimet", f"AIMET, quant_scheme percentile ({PERCENTILE} on activations), after BN folding"),
    "aimet_cle": ("aimet", "AIMET equalize_model (BN fold, ReLU6->ReLU, cross-layer scaling, high-bias fold) "
                           "then tf_enhanced"),
    "aimet_adaround": ("aimet", f"AIMET apply_adaround ({ADAROUND_ITERATIONS} iterations per layer, on the first "
                                f"{ADAROUND_SAMPLES} calibration samples) on tf_enhanced, after BN folding"),
    "aimet_seq_mse": ("aimet", f"AIMET apply_seq_mse ({SEQ_MSE_CANDIDATES} candidates, on the first {SEQ_MSE_SAMPLES} "
                               "calibration samples) on tf, after BN folding"),
}


# ----------------------------------------------------------------------------- samples (npz) ----

def save_samples(path: Path, samples: list[dict]) -> None:
    import numpy as np
    np.savez(path, **{f"{i}__{k}": v for i, s in enumerate(samples) for k, v in s.items()})


def load_samples(path: Path) -> list[dict]:
    import numpy as np
    z = np.load(path)
    out: dict[int, dict] = {}
    for key in z.files:
        i, _, name = key.partition("__")
        out.setdefault(int(i), {})[name] = z[key]
    return [out[i] for i in sorted(out)]


def first_line(e: BaseException | str) -> str:
    text = str(e).strip() or type(e).__name__
    return (f"{type(e).__name__}: " if isinstance(e, BaseException) else "") + text.splitlines()[0][:400]


# --------------------------------------------------------------- workers (one job per process) ----

def _ort_quantize(job: dict) -> dict:
    """ONNX Runtime's quantizer as modelexport drives it (quant/onnx_qdq.py): qnn_preprocess_model,
    get_qnn_qdq_config with the precision's types and per-channel weights, quantize."""
    import logging
    import warnings

    from modelexport.quant.calibration import CalibrationSet
    from modelexport.quant.onnx_qdq import quantize_onnx
    from modelexport.quant.precision import get_precision

    samples = load_samples(Path(job["calib"]))
    calib = CalibrationSet(samples, job["calib_kind"], job["calib"])
    prec = get_precision(job["precision"])
    src, out = Path(job["model"]), Path(job["out"])
    method = {"ort_minmax": "MinMax", "ort_minmax_bnfold": "MinMax", "ort_minmax_cle": "MinMax",
              "ort_percentile": "Percentile", "ort_percentile_cle": "Percentile",
              "ort_entropy": "Entropy", "ort_entropy_qs": "Entropy"}[job["engine"]]
    t0 = time.perf_counter()
    if method == "MinMax":                      # modelexport's own function, exactly as a compile calls it
        info = quantize_onnx(src, out, prec, calib, per_channel=True)
        info.pop("preprocessed_model", None)
        return {"seconds": round(time.perf_counter() - t0, 3), "info": info}
    from onnxruntime.quantization import CalibrationMethod, quantize

    from modelexport.quant.ort_qnn import qnn_quantization
    qnn = qnn_quantization()
    act, weight = prec.quant_types()
    pre = out.with_name(out.stem + ".pre.onnx")
    root = logging.getLogger()
    root.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        changed = qnn.qnn_preprocess_model(str(src), str(pre))
        model_in = pre if changed else src
        config = qnn.get_qnn_qdq_config(str(model_in), calib.reader(), calibrate_method=CalibrationMethod[method],
                                        activation_type=act, weight_type=weight, per_channel=True)
        if method == "Percentile":
            config.extra_options["CalibPercentile"] = PERCENTILE
        if job["engine"] == "ort_entropy":
            # quantize_static builds its EntropyCalibrater with 128 bins and 128 quantized bins (it passes no
            # bin counts): one candidate threshold, the whole histogram, i.e. exactly MinMax's ranges. The
            # calibrator's own API takes them: ranges from 2048 bins into 128, into ONNX Runtime's quantizer
            # through its calibration cache (modelexport's quantize_with_ranges).
            from onnxruntime.quantization.calibrate import create_calibrator

            from modelexport.quant.minmax_ranges import quantize_with_ranges
            with tempfile.TemporaryDirectory(prefix="entropy-") as d:
                cal = create_calibrator(str(model_in), config.op_types_to_quantize, str(Path(d) / "augmented.onnx"),
                                        calibrate_method=CalibrationMethod.Entropy,
                                        extra_options={"num_bins": ENTROPY_BINS[0], "num_quantized_bins": ENTROPY_BINS[1]})
                cal.collect_data(calib.reader())
                ranges = cal.compute_data()
                del cal
            quantize_with_ranges(str(model_in), str(out), config, ranges)
        else:
            quantize(str(model_in), str(out), config)
    if pre.exists():
        pre.unlink()
    return {"seconds": round(time.perf_counter() - t0, 3),
            "info": {"preprocessed": bool(changed), "calibration_method": method, "per_channel": True,
                     "activation_type": prec.activation_type, "weight_type": prec.weight_type,
                     **({"percentile": PERCENTILE} if method == "Percentile" else {}),
                     **({"entropy_bins": list(ENTROPY_BINS)} if job["engine"] == "ort_entropy" else {})}}


def _aimet_config(work: Path) -> str:
    import aimet_onnx
    base = Path(aimet_onnx.__file__).parent / "common" / "quantsim_config" / "htp_quantsim_config_v75.json"
    cfg = json.loads(base.read_text())
    cfg["supergroups"] = [g for g in cfg["supergroups"] if "+".join(g["op_list"]) in KEPT_SUPERGROUPS]
    path = work / "aimet_htp_v75_qnn_ep.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _aimet_quantize(job: dict) -> dict:
    """One AIMET engine: float ONNX + calibration samples → QDQ ONNX (sim.to_onnx_qdq)."""
    import logging

    import onnx

    logging.getLogger().setLevel(logging.WARNING)
    import aimet_onnx
    from aimet_onnx import QuantizationSimModel, apply_adaround, apply_seq_mse
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    from aimet_onnx.cross_layer_equalization import equalize_model

    engine = job["engine"]
    samples = load_samples(Path(job["calib"]))
    out = Path(job["out"])
    t0 = time.perf_counter()
    model = onnx.load(job["model"])
    info: dict = {"aimet_onnx": aimet_onnx.__version__}
    if engine == "bnfold":                       # the float graph with AIMET's BN folding, for ort_minmax_bnfold
        conv_bn, bn_conv = fold_all_batch_norms_to_weight(model)
        onnx.save(model, str(out))
        return {"seconds": round(time.perf_counter() - t0, 3), "info": {**info, "bn_folded": len(conv_bn) + len(bn_conv)}}
    if engine == "cle":                          # the float graph after cross-layer equalisation, for ort_*_cle
        equalize_model(model)
        onnx.save(model, str(out))
        return {"seconds": round(time.perf_counter() - t0, 3), "info": {**info, "cle": True}}
    act, param = PRECISIONS[job["precision"]]["aimet"]
    if engine == "aimet_cle":
        equalize_model(model)
        info["cle"] = True
    else:
        conv_bn, bn_conv = fold_all_batch_norms_to_weight(model)
        info["bn_folded"] = len(conv_bn) + len(bn_conv)
    scheme = {"aimet_tf": "tf", "aimet_seq_mse": "tf", "aimet_percentile": "percentile"}.get(engine, "tf_enhanced")
    info |= {"quant_scheme": scheme, "param_type": param, "activation_type": act,
             "config": f"htp_v75 with supergroups {list(KEPT_SUPERGROUPS)} only"}
    sim = QuantizationSimModel(model, param_type=param, activation_type=act, quant_scheme=scheme,
                               config_file=_aimet_config(out.parent), path=str(out.parent / f"{out.stem}.sim"))
    if engine == "aimet_percentile":
        for name in sim.activation_names:
            q = sim.qc_quantize_op_dict.get(name)
            if q is not None:
                q._tensor_quantizer.setPercentileValue(PERCENTILE)     # no public setter in aimet-onnx 2.42
        info["percentile"] = PERCENTILE
    if engine == "aimet_adaround":
        t1 = time.perf_counter()
        n = job.get("adaround_samples", ADAROUND_SAMPLES)
        apply_adaround(sim, samples[:n], num_iterations=job.get("adaround_iterations", ADAROUND_ITERATIONS))
        info |= {"adaround_iterations": job.get("adaround_iterations", ADAROUND_ITERATIONS), "adaround_samples": n,
                 "adaround_seconds": round(time.perf_counter() - t1, 3)}
    if engine == "aimet_seq_mse":
        t1 = time.perf_counter()
        n = job.get("seq_mse_samples", SEQ_MSE_SAMPLES)
        apply_seq_mse(sim, samples[:n], num_candidates=SEQ_MSE_CANDIDATES)
        info |= {"seq_mse_candidates": SEQ_MSE_CANDIDATES, "seq_mse_samples": n,
                 "seq_mse_seconds": round(time.perf_counter() - t1, 3)}
    sim.compute_encodings(samples)
    qdq = sim.to_onnx_qdq(export_int32_bias=True, prequantize_constants=True)
    onnx.save(qdq, str(out))
    return {"seconds": round(time.perf_counter() - t0, 3), "info": info}


def _htp_run(job: dict) -> dict:
    """The QDQ model compiled by the QNN EP for the simulator; outputs of the held-out samples (npz)."""
    import numpy as np

    from modelexport.core.targets import get_target
    from modelexport.toolchain.htp_options import compile_provider_options
    from modelexport.toolchain.ort_qnn import EP_NAME, SessionPlan, create_session, node_assignment
    opts = compile_provider_options(get_target(TARGET), None, HTP_OPTIMIZATION_LEVEL)
    t0 = time.perf_counter()
    # severity 0: the EP logs each QNN op it builds with its tensors' types (float ops counted from it)
    sess = create_session(job["model"], SessionPlan(provider_options=opts, log_severity=0))
    load_s = time.perf_counter() - t0
    placement = {ep: len(v) for ep, v in node_assignment(sess).items()}
    if not placement.get(EP_NAME):
        raise RuntimeError(f"nothing was placed on the QNN EP: {placement}")
    names = [o.name for o in sess.get_outputs()]
    outs = {}
    t0 = time.perf_counter()
    for i, s in enumerate(load_samples(Path(job["held"]))):
        for n, v in zip(names, sess.run(names, s)):
            outs[f"{i}__{n}"] = np.asarray(v)
    np.savez(job["outputs"], **outs)
    return {"load_s": round(load_s, 2), "run_s": round(time.perf_counter() - t0, 2), "placement": placement}


class JobTimeout(Exception):
    pass


def _one(job: dict) -> dict:
    import signal

    def alarm(*_):
        raise JobTimeout(f"timed out after {job['timeout']:.0f} s")
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(int(job["timeout"]))
    t0 = time.perf_counter()
    try:
        res = {"quantize_ort": _ort_quantize, "quantize_aimet": _aimet_quantize, "htp": _htp_run}[job["kind"]](job)
    except BaseException as e:  # recorded, not raised: the next job goes on
        import traceback
        res = {"error": first_line(e), "traceback": traceback.format_exc()[-3000:]}
    finally:
        signal.alarm(0)
    res["job_wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def worker(batch_path: str) -> None:
    """Each job of the batch in turn (one import of the engine for all), its result written as it ends."""
    jobs = json.loads(Path(batch_path).read_text())
    t0 = time.perf_counter()
    for job in jobs:
        if job["kind"] == "quantize_aimet":
            import aimet_onnx  # noqa: F401  (once, outside the jobs' seconds: torch + aimet take ~12 s)
        print(f"@@ job {job['tag']} (process up {time.perf_counter() - t0:.1f} s)", flush=True)
        Path(job["result"]).write_text(json.dumps(_one(job), default=str))


MEMORY_GB = 12     # a worker's address space: ONNX Runtime's histogram calibrators hold every activation of
                   # every calibration sample at once; past this they fail instead of swapping the shared host


def _limit_memory() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_GB << 30, MEMORY_GB << 30))


def run_jobs(python: str, jobs: list[dict], work: Path, memory_limit: bool = True) -> dict[str, dict]:
    """{tag: result} of the jobs run in one process of `python` (again in a new one from the job after a
    job that killed its process); each job has 'tag' and 'timeout'."""
    results: dict[str, dict] = {}
    pending = list(jobs)
    round_no = 0
    while pending:
        round_no += 1
        for j in pending:
            j["result"] = str(work / f"{j['tag']}.result.json")
        batch = work / f"batch{round_no}.{pending[0]['tag']}.json"
        batch.write_text(json.dumps(pending))
        log = work / f"batch{round_no}.{pending[0]['tag']}.log"
        t0 = time.perf_counter()
        died = None
        try:
            with open(log, "w") as f:
                proc = subprocess.run([python, __file__, "--worker", str(batch)], stdout=f, stderr=subprocess.STDOUT,
                                      timeout=sum(j["timeout"] for j in pending) + 60,
                                      env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=str(ROOT.parent),
                                      preexec_fn=_limit_memory if memory_limit else None)
            if proc.returncode:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                died = f"process died (exit {proc.returncode}): {' | '.join(tail)[:400]}"
        except subprocess.TimeoutExpired:
            died = "the worker process hung past its jobs' time limits"
        wall = time.perf_counter() - t0
        rest, blamed = [], False
        for j in pending:
            rp = Path(j["result"])
            if rp.exists():
                res = json.loads(rp.read_text())
                res["log"] = str(log)
                results[j["tag"]] = res
            elif died and not blamed:          # the job the process died in
                results[j["tag"]] = {"error": died, "log": str(log), "wall_s": round(wall, 1)}
                blamed = True
            else:
                rest.append(j)
        if rest and not died:
            for j in rest:
                results[j["tag"]] = {"error": "no result (the worker ended without one)", "log": str(log)}
            rest = []
        pending = rest
    return results


# ------------------------------------------------------------------- the parent (project venv) ----

def float_ops_on_htp(log_text: str) -> dict[str, str]:
    """{QNN node: op type} of the QNN ops the EP built with a float output, other than Dequantize:
    ops the HTP runs in float16, outside the quantized graph."""
    import re
    found: dict[str, str] = {}
    cur, section = None, None
    head = re.compile(r"CreateQnnNode\] Qnn_OpConfig node name: (\S+) package_name: \S+ QNN_op_type: (\S+)")
    for line in log_text.splitlines():
        m = head.search(line)
        if m:
            cur, section = (m.group(1), m.group(2)), None
            continue
        if cur is None:
            continue
        s = line.strip()
        if s in ("node_inputs:", "node_outputs:", "node_params:"):
            section = s
        elif not s:
            cur = None
        elif section == "node_outputs:" and s.startswith("name=") and cur[1] != "Dequantize" \
                and re.search(r"dataType=QNN_DATATYPE_FLOAT_(16|32)\b", s):
            found[cur[0]] = cur[1]
    return found


def photo_array(m, photo: Path, input_name: str) -> dict:
    """zoo.real_onnx.real_input's preprocessing, for any photo."""
    from modelexport.zoo.real_onnx import photo_input
    return photo_input(m, photo, input_name)


def prepare(name: str, work: Path, photos: Path) -> dict:
    """The float graph every engine gets, the calibration and held-out samples, the float reference."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from modelexport.backends.ort_qnn.repair import load_repaired
    from modelexport.frontends.onnx_index_inputs import index_limits
    from modelexport.quant.calibration import random_samples
    from modelexport.quant.ort_qnn import qnn_quantization
    from modelexport.zoo import real_onnx as z
    from modelexport.zoo.assets import PHOTOS

    m = z.get(name)
    loaded = load_repaired(z.model_path(m), m.input_shapes or None, dict(m.input_values) or None, quantized=True)
    repaired = work / "float.onnx"
    onnx.save(loaded.model, str(repaired))
    # the graph ONNX Runtime's quantizer quantizes: qnn_preprocess_model's output where it changes anything
    # (every engine gets this one; ORT's own preprocessing then finds nothing more to do)
    pre = work / "float.pre.onnx"
    import logging
    logging.getLogger().setLevel(logging.ERROR)        # "Node of type Mul does not have a name" per node
    changed = qnn_quantization().qnn_preprocess_model(str(repaired), str(pre))
    if changed:
        # its "onnx.infer" metadata makes ONNX Runtime's own preprocessing (run again by its engines) fail
        # (`ret_metaprops.update(model.metadata_props)`: TypeError); modelexport's repairs detach metadata too
        g = onnx.load(str(pre))
        del g.metadata_props[:]
        onnx.save(g, str(pre))
    graph = pre if changed else repaired
    inputs = loaded.inputs
    info: dict = {"model": name, "kind": m.kind, "package": m.package, "inputs": [i.to_dict() for i in inputs],
                  "repairs": [r.get("name") for r in (loaded.repairs or [])], "qnn_preprocessed": bool(changed)}
    if m.image is not None and len(inputs) == 1:
        own = m.image.asset
        held_names = [own] + [p for p in HELD_OUT_PHOTOS if p != own][:N_HELD - 1]
        calib_names = [p for p in PHOTOS if p not in held_names][:N_CALIB]
        calib = [photo_array(m, photos / p, inputs[0].name) for p in calib_names]
        held = [photo_array(m, photos / p, inputs[0].name) for p in held_names]
        ref = z.real_input(m, inputs[0].name)
        assert np.array_equal(ref[inputs[0].name], held[0][inputs[0].name]), "photo preprocessing differs from real_input"
        info["data"] = {"kind": "photos", "calibration": calib_names, "held_out": held_names,
                        "preprocessing": {k: getattr(m.image, k) for k in ("size", "layout", "mean", "std", "crop", "bgr")}}
    else:
        limits = index_limits(loaded.model)
        calib = random_samples(inputs, N_CALIB, seed=0, limits=limits)
        held = random_samples(inputs, N_HELD, seed=1, limits=limits)
        info["data"] = {"kind": "random (modelexport.quant.calibration.random_samples: standard normal floats, "
                                "integer ids below the table size the graph indexes, attention masks of ones)",
                        "calibration_seed": 0, "held_out_seed": 1, "index_limits": limits}
    save_samples(work / "calib.npz", calib)
    save_samples(work / "held.npz", held)
    sess = ort.InferenceSession(str(repaired), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    refs = {n: [] for n in names}
    for s in held:
        for n, v in zip(names, sess.run(names, s)):
            refs[n].append(np.asarray(v))
    float_outputs = [n for n in names if np.issubdtype(refs[n][0].dtype, np.floating)]
    info["outputs"] = names
    info["scored_outputs"] = float_outputs
    info["graph"] = graph.name
    return {"info": info, "graph": graph, "refs": {n: refs[n] for n in float_outputs}, "held": held}


def score(refs: dict, got: dict) -> dict:
    """Per float output, SQNR over all held-out samples (stacked); the worst output."""
    import numpy as np

    from modelexport.core.numerics import sqnr_db
    per = {}
    for n, rs in refs.items():
        r = np.stack([np.asarray(x, np.float64) for x in rs])
        g = np.stack([np.asarray(x, np.float64).reshape(np.asarray(rr).shape) for x, rr in zip(got[n], rs)])
        per[n] = sqnr_db(r, g)
    worst = min(per.values()) if per else None
    clean = lambda v: None if v is None else (v if np.isfinite(v) else (999.0 if v > 0 else -999.0))
    return {"worst": clean(worst), "per_output": {k: clean(round(v, 3) if np.isfinite(v) else v) for k, v in per.items()}}


def cpu_outputs(qdq: Path, held: list[dict], names: list[str], optimized: bool) -> dict:
    """The QDQ model on the CPU EP. Not optimized (ORT_DISABLE_ALL): every QuantizeLinear /
    DequantizeLinear runs as written, the exact fake-quant arithmetic. Optimized (the default level):
    ONNX Runtime fuses the QDQ groups into its integer kernels (QLinearConv, ...), whose uint8 x int8
    products can saturate on x86 without VNNI: that is ONNX Runtime's CPU kernel, not the quantization."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(qdq), so, providers=["CPUExecutionProvider"])
    got = {n: [] for n in names}
    for s in held:
        for n, v in zip(names, sess.run(names, s)):
            got[n].append(v)
    return got


def _round(v):
    return None if v is None else round(v, 2)


def run_model(name: str, args, aimet_python: str | None) -> list[dict]:
    t_model = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix=f"quant-engines-{name}-", dir=args.work)
    try:
        return _run_model(name, args, aimet_python, Path(tmp), t_model)
    finally:
        if not args.keep_work:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)


def _run_model(name: str, args, aimet_python: str | None, work: Path, t_model: float) -> list[dict]:
    import numpy as np
    from collections import Counter

    from modelexport.zoo.assets import photo_folder
    photos = photo_folder(work / "photos")
    try:
        prep = prepare(name, work, photos)
    except Exception as e:
        return [{"model": name, "engine": None, "precision": None, "error": f"prepare: {first_line(e)}"}]
    info = prep["info"]
    info["work"] = str(work)
    print(f"== {name}: graph {info['graph']}, {info['data']['kind'][:6]} data, outputs {info['scored_outputs']} "
          f"({time.perf_counter() - t_model:.0f} s)", flush=True)
    engines = [e for e in ENGINES if not args.engines or e in args.engines]
    calib = str(work / "calib.npz")
    rows: list[dict] = []
    jobs = {"aimet": [], "ort": [], "ort_after": []}
    for step, graph in sorted({FLOAT_PREP[e] for e in engines if e in FLOAT_PREP}):
        if aimet_python is not None:
            jobs["aimet"].append({"kind": "quantize_aimet", "engine": step, "tag": step, "model": str(prep["graph"]),
                                  "calib": calib, "out": str(work / graph), "precision": "8a8w",
                                  "timeout": args.timeout})
    for prec in args.precisions:
        for engine in engines:
            family = ENGINES[engine][0]
            row = {"model": name, "engine": engine, "precision": prec, "family": family, "sqnr_cpu_db": None,
                   "sqnr_htp_db": None, "seconds": None, "error": None}
            rows.append(row)
            if family == "aimet" and aimet_python is None:
                row["error"] = "no AIMET venv (--aimet-python)"
                continue
            if engine == "aimet_adaround" and prec not in args.adaround_precisions:
                row["error"] = (f"not run at {prec}: --adaround-precisions {','.join(args.adaround_precisions)} "
                                "(AdaRound's minutes per model; the 10-minute model budget)")
                continue
            tag = f"{engine}.{prec}"
            job = {"kind": f"quantize_{family}", "engine": engine, "precision": prec, "tag": tag, "calib": calib,
                   "model": str(work / FLOAT_PREP[engine][1] if engine in FLOAT_PREP else prep["graph"]),
                   "calib_kind": info["data"]["kind"][:6], "out": str(work / f"{tag}.qdq.onnx"),
                   "adaround_iterations": args.adaround_iterations, "adaround_samples": args.adaround_samples,
                   "seq_mse_samples": args.seq_mse_samples, "timeout": args.adaround_timeout if engine == "aimet_adaround" else args.timeout}
            row["_tag"] = tag
            jobs["ort_after" if engine in FLOAT_PREP else family].append(job)
    results: dict[str, dict] = {}
    if jobs["ort"]:
        results |= run_jobs(sys.executable, jobs["ort"], work)
    if jobs["aimet"]:       # SeqMSE and AdaRound, the longest, last: their time limits cannot cost the others
        jobs["aimet"].sort(key=lambda j: {"aimet_seq_mse": 1, "aimet_adaround": 2}.get(j["engine"], 0))
        results |= run_jobs(aimet_python, jobs["aimet"], work)
    for step, graph in sorted({FLOAT_PREP[e] for e in engines if e in FLOAT_PREP}):
        r = results.get(step, {"error": "no AIMET venv (--aimet-python)"})
        info[step] = {k: r.get(k) for k in ("seconds", "info", "error")}
        if "error" not in r:
            got = cpu_outputs(work / graph, prep["held"], list(prep["refs"]), optimized=True)
            info[step]["float_sqnr_db"] = _round(score(prep["refs"], got)["worst"])
            after = [j for j in jobs["ort_after"] if FLOAT_PREP[j["engine"]][0] == step]
            results |= run_jobs(sys.executable, after, work)
    for row in rows:
        tag = row.pop("_tag", None)
        if tag is None:
            continue
        step = FLOAT_PREP.get(row["engine"], ("",))[0]
        r = results.get(tag) or {"error": f"not run: AIMET's {step} failed ({info.get(step, {}).get('error')})"}
        row |= {"seconds": r.get("seconds"), "job_wall_s": r.get("job_wall_s"), "info": r.get("info")}
        if "error" in r:
            row["error"] = r["error"]
            if r.get("traceback"):
                row["traceback_tail"] = r["traceback"][-800:]
            print(f"   {row['engine']:18s} {row['precision']:5s} ERROR {row['error'][:160]}", flush=True)
            continue
        qdq = work / f"{tag}.qdq.onnx"
        try:
            s = score(prep["refs"], cpu_outputs(qdq, prep["held"], list(prep["refs"]), optimized=False))
            row["sqnr_cpu_db"], row["sqnr_cpu_per_output"] = _round(s["worst"]), s["per_output"]
            s = score(prep["refs"], cpu_outputs(qdq, prep["held"], list(prep["refs"]), optimized=True))
            row["sqnr_cpu_ort_kernels_db"] = _round(s["worst"])
        except Exception as e:
            row["error"] = f"CPU EP run of the QDQ model: {first_line(e)}"
        row["_qdq"] = str(qdq)
        print(f"   {row['engine']:18s} {row['precision']:5s} cpu {row['sqnr_cpu_db']} dB (ORT kernels "
              f"{row.get('sqnr_cpu_ort_kernels_db')})  {row['seconds']} s", flush=True)
    # the HTP simulator: per precision today's path and the best other ONNX Runtime and AIMET engines on
    # the CPU always; the others, best on the CPU first, while the model's budget lasts
    todo = [r for r in rows if r.get("_qdq")]
    cpu = lambda r: r["sqnr_cpu_db"] if r["sqnr_cpu_db"] is not None else -1e9
    always = {id(r) for r in todo if r["engine"] == "ort_minmax"}
    for prec in args.precisions:
        for fam in ("ort", "aimet"):
            cands = [r for r in todo if r["precision"] == prec and r["family"] == fam and r["engine"] != "ort_minmax"]
            if cands:
                always.add(id(max(cands, key=cpu)))
    todo.sort(key=lambda r: (id(r) not in always, -cpu(r)))
    for row in todo:
        spent = time.perf_counter() - t_model
        if not args.htp or (spent > args.model_budget and id(row) not in always):
            row["htp_note"] = "not run: --no-htp" if not args.htp else \
                f"not run: the model's {args.model_budget:.0f} s budget was spent ({spent:.0f} s)"
            continue
        tag = f"{row['engine']}.{row['precision']}.htp"
        outs = work / f"{tag}.npz"
        r = run_jobs(sys.executable, [{"kind": "htp", "tag": tag, "model": row["_qdq"], "held": str(work / "held.npz"),
                                       "outputs": str(outs), "timeout": args.htp_timeout}], work, memory_limit=False)[tag]
        log = Path(r["log"]).read_text(errors="replace") if Path(r.get("log", "")).is_file() else ""
        fl = float_ops_on_htp(log)
        row["htp"] = {k: r.get(k) for k in ("load_s", "run_s", "placement", "job_wall_s")} | {"float_ops": len(fl)}
        if fl:
            row["htp"]["float_op_types"] = dict(Counter(fl.values()).most_common(8))
        if "error" in r:
            row["htp_error"] = r["error"]
        else:
            z = np.load(outs)
            got = {n: [z[f"{i}__{n}"] for i in range(len(prep["held"]))] for n in prep["refs"]}
            s = score(prep["refs"], got)
            row["sqnr_htp_db"], row["sqnr_htp_per_output"] = _round(s["worst"]), s["per_output"]
        print(f"   htp {row['engine']:18s} {row['precision']:5s} {row['sqnr_htp_db']} dB  float ops {len(fl)} "
              f"{row.get('htp_error', '')[:120]}", flush=True)
    for row in rows:
        row.pop("_qdq", None)
    info["wall_s"] = round(time.perf_counter() - t_model, 1)
    if rows:
        rows[0]["model_info"] = info
    return rows


def htp_rescore(work: Path, args) -> None:
    """--htp-rescore WORK: the simulator part again, on the QDQ models a kept work folder holds (--keep-work),
    for --engines x --precisions; updates those rows' simulator fields in --out."""
    import numpy as np
    import onnxruntime as ort
    from collections import Counter
    held = load_samples(work / "held.npz")
    out = json.loads(Path(args.out).read_text())
    name = next(m for m, i in out["models"].items() if i.get("work") == str(work))
    scored = out["models"][name]["scored_outputs"]
    ref_sess = ort.InferenceSession(str(work / "float.onnx"), providers=["CPUExecutionProvider"])
    refs = {n: [] for n in scored}
    for smp in held:
        for n, v in zip(scored, ref_sess.run(scored, smp)):
            refs[n].append(np.asarray(v))
    for row in out["rows"]:
        if row["model"] != name or row["engine"] not in (args.engines or []) or row["precision"] not in args.precisions:
            continue
        tag = f"{row['engine']}.{row['precision']}"
        qdq = work / f"{tag}.qdq.onnx"
        if row.get("sqnr_cpu_db") is None or not qdq.exists():
            continue
        r = run_jobs(sys.executable, [{"kind": "htp", "tag": tag + ".htp2", "model": str(qdq), "held": str(work / "held.npz"),
                                       "outputs": str(work / f"{tag}.htp2.npz"), "timeout": args.htp_timeout}], work,
                     memory_limit=False)[tag + ".htp2"]
        log = Path(r["log"]).read_text(errors="replace") if Path(r.get("log", "")).is_file() else ""
        fl = float_ops_on_htp(log)
        row["htp"] = {k: r.get(k) for k in ("load_s", "run_s", "placement", "job_wall_s")} | {"float_ops": len(fl)}
        if fl:
            row["htp"]["float_op_types"] = dict(Counter(fl.values()).most_common(8))
        row.pop("htp_note", None)
        row["htp_rescored"] = True
        if "error" in r:
            row["htp_error"] = r["error"]
        else:
            z = np.load(work / f"{tag}.htp2.npz")
            sc = score(refs, {n: [z[f"{i}__{n}"] for i in range(len(held))] for n in refs})
            row["sqnr_htp_db"], row["sqnr_htp_per_output"] = _round(sc["worst"]), sc["per_output"]
        print(f"   htp {name} {row['engine']:18s} {row['precision']:5s} {row['sqnr_htp_db']} dB  float ops {len(fl)} "
              f"{row.get('htp_error', '')[:120]}", flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))


def _write(rows: list[dict], args, aimet: dict) -> None:
    out = Path(args.out)
    keep, models = [], {}
    if out.exists() and (args.only or args.engines or args.precisions != ["8a8w", "16a8w"]):
        old = json.loads(out.read_text())           # a partial run replaces its own rows only
        mine = {(r["model"], r["engine"], r["precision"]) for r in rows}
        keep = [r for r in old.get("rows", []) if (r["model"], r["engine"], r["precision"]) not in mine]
        models = old.get("models", {})
    models |= {r["model"]: r["model_info"] for r in rows if r.get("model_info")}
    done = {"target": TARGET, "htp_optimization_level": HTP_OPTIMIZATION_LEVEL, "calibration_samples": N_CALIB,
            "held_out_samples": N_HELD, "engines": {k: v[1] for k, v in ENGINES.items()}, "aimet": aimet,
            "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
            "models": models,
            "rows": [{k: v for k, v in r.items() if k != "model_info"} for r in keep + rows]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(done, indent=1, default=str))


def table(path: Path) -> str:
    """The markdown tables of a results file: per model and engine, and the median gain over ort_minmax."""
    import statistics
    d = json.loads(Path(path).read_text())
    rows = d["rows"]
    precs = [p for p in PRECISIONS if any(r["precision"] == p for r in rows)]
    models = list(dict.fromkeys(r["model"] for r in rows))
    engines = [e for e in ENGINES if any(r["engine"] == e for r in rows)]
    by = {(r["model"], r["engine"], r["precision"]): r for r in rows}
    fmt = lambda v: "" if v is None else f"{v:.1f}"

    def cell(r, key):
        if r is None:
            return "-"
        if r.get(key) is None:
            if str(r.get("error") or "").startswith("not run"):
                return "n/r"
            return "err" if r.get("error") and key == "sqnr_cpu_db" else ("n/r" if key == "sqnr_htp_db" else "err")
        return fmt(r[key])
    head = "| model | engine | " + " | ".join(f"{p} CPU | {p} HTP | {p} s" for p in precs) + " |"
    out = [head, "|" + "---|" * (2 + 3 * len(precs))]
    for m in models:
        for e in engines:
            cells = []
            for p in precs:
                r = by.get((m, e, p))
                cells += [cell(r, "sqnr_cpu_db"), cell(r, "sqnr_htp_db"), fmt(r.get("seconds")) if r else "-"]
            out.append(f"| {m} | {e} | " + " | ".join(cells) + " |")
    out += ["", "Median (and min / max) gain in dB over ort_minmax, over the models where both ran:", "",
            "| engine | " + " | ".join(f"{p} CPU | {p} HTP" for p in precs) + " |", "|" + "---|" * (1 + 2 * len(precs))]
    for e in engines:
        cells = []
        for p in precs:
            for key in ("sqnr_cpu_db", "sqnr_htp_db"):
                g = [by[(m, e, p)][key] - by[(m, "ort_minmax", p)][key] for m in models
                     if (m, e, p) in by and (m, "ort_minmax", p) in by
                     and by[(m, e, p)].get(key) is not None and by[(m, "ort_minmax", p)].get(key) is not None]
                cells.append(f"{statistics.median(g):+.1f} ({min(g):+.1f} / {max(g):+.1f}), n={len(g)}" if g else "-")
        out.append(f"| {e} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def aimet_versions(python: str) -> dict:
    code = ("import json, importlib.metadata as md; print(json.dumps({p: md.version(p) for p in "
            "('aimet-onnx', 'onnxruntime', 'onnx', 'numpy', 'torch', 'onnxruntime-qnn') "
            "if __import__('importlib.util').util.find_spec(p.replace('-', '_'))}))")
    try:
        return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120).stdout)
    except Exception as e:
        return {"error": first_line(e)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="model names (default: %s)" % ", ".join(DEFAULT_MODELS))
    ap.add_argument("--engines", type=lambda s: [x for x in s.split(",") if x], default=None,
                    help="comma-separated engine names (default all: %s)" % ", ".join(ENGINES))
    ap.add_argument("--precisions", type=lambda s: s.split(","), default=["8a8w", "16a8w"])
    ap.add_argument("--aimet-python", default=os.environ.get("AIMET_PYTHON", "/tmp/aimet-venv/bin/python"))
    ap.add_argument("--adaround-iterations", type=int, default=ADAROUND_ITERATIONS)
    ap.add_argument("--adaround-samples", type=int, default=ADAROUND_SAMPLES)
    ap.add_argument("--seq-mse-samples", type=int, default=SEQ_MSE_SAMPLES)
    ap.add_argument("--adaround-timeout", type=float, default=ADAROUND_TIMEOUT)
    ap.add_argument("--adaround-precisions", type=lambda s: s.split(","), default=["8a8w"],
                    help="precisions AdaRound runs at (default 8a8w: it takes minutes per model)")
    ap.add_argument("--keep-work", action="store_true", help="keep each model's work folder (QDQ models, logs)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one quantization")
    ap.add_argument("--htp-timeout", type=float, default=300, help="seconds for one simulator compile + run")
    ap.add_argument("--model-budget", type=float, default=600,
                    help="seconds per model after which further simulator runs are skipped (today's path and the "
                         "best other engine of each family on the CPU always run)")
    ap.add_argument("--no-htp", dest="htp", action="store_false")
    ap.add_argument("--work", default=None, help="parent folder of the temporary work folders")
    ap.add_argument("--out", default=str(RESULT))
    ap.add_argument("--table", action="store_true", help="print the markdown tables of --out and exit")
    ap.add_argument("--htp-rescore", metavar="WORK", help="run the simulator part again on a kept work folder's QDQ "
                    "models (--engines, --precisions) and update --out")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.table:
        print(table(Path(args.out)))
        return
    if args.htp_rescore:
        htp_rescore(Path(args.htp_rescore), args)
        return
    bad = [e for e in args.engines or [] if e not in ENGINES]
    if bad:
        ap.error(f"unknown engine(s) {bad}: choose from {', '.join(ENGINES)}")
    aimet_python = args.aimet_python if args.aimet_python and Path(args.aimet_python).exists() else None
    aimet = aimet_versions(aimet_python) if aimet_python else {"error": f"{args.aimet_python} does not exist"}
    aimet["python"] = aimet_python
    rows: list[dict] = []
    for name in args.only or DEFAULT_MODELS:
        rows += run_model(name, args, aimet_python)
        _write(rows, args, aimet)        # after every model: a long run stopped midway keeps what it measured
    _write(rows, args, aimet)


if __name__ == "__main__":
    main()
