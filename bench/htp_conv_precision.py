"""What the HTP gives a quantized Conv against the fake-quant (QDQ) model that describes it.

    python bench/htp_conv_precision.py        # → bench/results/htp_conv_precision.json

One Conv (a dense 3x3, 16 → 32 channels, and a depthwise 3x3 of 16 channels, 32x32, random weights
with a per-channel offset), quantized by ONNX Runtime's QNN config at each activation / weight type,
per channel and per tensor, calibrated on 8 random inputs. Each QDQ model runs on ONNX Runtime's CPU
EP with graph optimizations off (exact fake-quant) and on the QNN EP on the x86 HTP simulator
(SM8650). SQNR in dB against the float Conv, and of the HTP against the CPU.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

RESULT = Path(__file__).parent / "results" / "htp_conv_precision.json"
TYPES = [("QUInt8", "QUInt8"), ("QUInt8", "QInt8"), ("QUInt16", "QUInt8"), ("QUInt16", "QInt8"), ("QUInt16", "QInt16")]


def _conv(path: Path, depthwise: bool) -> None:
    rng = np.random.default_rng(0)
    cout, cin, group = (16, 1, 16) if depthwise else (32, 16, 1)
    w = (rng.standard_normal((cout, cin, 3, 3)) * 0.2 + rng.uniform(-0.3, 0.3, (cout, 1, 1, 1))).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], group=group)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 32, 32])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))


def _sqnr(ref, got) -> float:
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - got) ** 2).sum(), 1e-30)))


def _one(float_path: Path, qdq: Path, act: str, weight: str, per_channel: bool, feeds: list[dict]) -> dict:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from modelexport.toolchain.ort_qnn import SessionPlan, create_session

    class Reader:
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)
    cfg = get_qnn_qdq_config(str(float_path), Reader(), activation_type=QuantType[act], weight_type=QuantType[weight],
                             per_channel=per_channel)
    quantize(str(float_path), str(qdq), cfg)
    x = feeds[0]
    ref = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"]).run(None, x)[0]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    cpu = ort.InferenceSession(str(qdq), so, providers=["CPUExecutionProvider"]).run(None, x)[0]
    htp = create_session(str(qdq), SessionPlan(provider_options={"soc_model": "57"}, disable_cpu_fallback=True)).run(None, x)[0]
    return {"activations": act, "weights": weight, "per_channel": per_channel, "cpu_vs_float_db": round(_sqnr(ref, cpu), 1),
            "htp_vs_float_db": round(_sqnr(ref, htp), 1), "htp_vs_cpu_db": round(_sqnr(cpu, htp), 1)}


def main() -> None:
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 16, 32, 32)).astype(np.float32)} for _ in range(8)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("dense", "depthwise"):
            f = Path(tmp) / f"{kind}.onnx"
            _conv(f, kind == "depthwise")
            for act, weight in TYPES:
                for pc in (True, False):
                    row = {"conv": kind} | _one(f, Path(tmp) / "q.onnx", act, weight, pc, feeds)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    RESULT.write_text(json.dumps({"target": "SM8650", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
