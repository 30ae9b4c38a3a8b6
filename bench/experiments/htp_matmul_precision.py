"""What precision the HTP gives a MatMul of two 16-bit activations (attention's q.k^T and p.v).

    python bench/experiments/htp_matmul_precision.py        # → bench/results/htp_matmul_precision.json

One QDQ MatMul of SmolLM2's attention shapes (q [1,3,32,64] . k^T [1,3,64,128], random normal
activations), each input and the output quantized as the LLM graphs quantize activations (uint16,
min-max), run by ONNX Runtime's CPU EP (the fake-quant graph) and by the QNN EP on the x86 HTP
simulator (SM8650, level 1). Variants: which input is 16- or 8-bit, and the MatMul left in float
(its output not quantized, so the HTP runs it in fp16). SQNR of each vs the float product.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RESULT = Path(__file__).resolve().parent.parent / "results" / "htp_matmul_precision.json"


def _qparams(x: np.ndarray, bits: int):
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / (2 ** bits - 1)
    return np.float32(scale), int(round(-lo / scale))


def _qdq(name: str, x: np.ndarray, bits: int, out: str):
    scale, zp = _qparams(x, bits)
    dtype = np.uint8 if bits == 8 else np.uint16
    inits = [numpy_helper.from_array(np.array(scale), f"{name}_s"), numpy_helper.from_array(np.array(zp, dtype), f"{name}_z")]
    nodes = [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [out])]
    return inits, nodes


def _model(a, b, a_bits: int, b_bits: int, out_bits: int | None, path: Path) -> Path:
    ia, na = _qdq("a", a, a_bits, "ad")
    ib, nb = _qdq("b", b, b_bits, "bd")
    inits, nodes = ia + ib, na + nb
    if out_bits:
        io, no = _qdq("y", a @ b, out_bits, "out")
        inits, nodes = inits + io, nodes + [helper.make_node("MatMul", ["ad", "bd"], ["y"])] + no
    else:
        nodes.append(helper.make_node("MatMul", ["ad", "bd"], ["out"]))
    graph = helper.make_graph(nodes, "matmul", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape),
                                                helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return round(float(10 * np.log10((ref * ref).sum() / max(((ref - got) ** 2).sum(), 1e-30))), 1)


def main() -> int:
    import tempfile

    import onnxruntime as ort

    from modelexport.core.targets import get_target
    from modelexport.toolchain.htp_options import compile_provider_options
    from modelexport.toolchain.ort_qnn import SessionPlan, create_session
    options = compile_provider_options(get_target("SM8650"), None, 1)     # the compile's options, level 1
    rng = np.random.default_rng(0)
    a = rng.normal(0, 2, (1, 3, 32, 64)).astype(np.float32)
    b = rng.normal(0, 2, (1, 3, 64, 128)).astype(np.float32)
    ref = a @ b
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for a_bits, b_bits, out_bits in ((16, 16, 16), (16, 8, 16), (8, 16, 16), (16, 16, None)):
            path = _model(a, b, a_bits, b_bits, out_bits, Path(d) / f"m{a_bits}_{b_bits}_{out_bits}.onnx")
            feed = {"a": a, "b": b}
            cpu = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
            htp = create_session(path, SessionPlan(provider_options=options)).run(None, feed)[0]
            rows.append({"a_bits": a_bits, "b_bits": b_bits, "output": f"uint{out_bits}" if out_bits else "float",
                         "cpu_qdq_vs_float_db": _sqnr(ref, cpu), "htp_vs_float_db": _sqnr(ref, htp),
                         "htp_vs_cpu_qdq_db": _sqnr(cpu, htp)})
            print(json.dumps(rows[-1]), flush=True)
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps({"shapes": {"a": list(a.shape), "b": list(b.shape)}, "target": "SM8650 (x86 HTP simulator)",
                                  "onnxruntime": ort.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
