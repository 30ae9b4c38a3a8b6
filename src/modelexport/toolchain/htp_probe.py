"""A real probe: build a tiny ONNX graph, run it on the HTP simulator, check who ran it.

Run as `python -m modelexport.toolchain.htp_probe` (doctor does so in a child process, so a
crash inside the native library cannot take the caller down). Prints one JSON object.
"""
from __future__ import annotations

import json
import sys
import time

from .ort_qnn import EP_NAME, SessionPlan, create_session, node_assignment

PROBE_SOC_MODEL = 57  # SM8650


def tiny_model_bytes() -> bytes:
    import onnx
    from onnx import TensorProto, helper
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="probe_matmul"),
             helper.make_node("Relu", ["h"], ["y"], name="probe_relu")]
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], [((i * 7) % 5 - 2) / 4 for i in range(64)])
    graph = helper.make_graph(nodes, "htp_probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model.SerializeToString()


def run_probe() -> dict:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    data = tiny_model_bytes()
    t0 = time.perf_counter()
    sess = create_session(data, SessionPlan(provider_options={"soc_model": PROBE_SOC_MODEL,
                                                              "enable_htp_fp16_precision": 1}))
    t_session = time.perf_counter() - t0
    placement = node_assignment(sess)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    w = numpy_helper.to_array(onnx.load_from_string(data).graph.initializer[0])
    got = sess.run(None, {"x": x})[0]
    err = float(np.abs(got - np.maximum(x @ w, 0)).max())
    on_qnn = [n for n, _ in placement.get(EP_NAME, [])]
    return {"nodes": 2, "on_qnn": on_qnn, "placement": {k: [n for n, _ in v] for k, v in placement.items()},
            "max_abs_error": err, "session_s": round(t_session, 3),
            "ok": len(on_qnn) == 2 and err < 0.05}


if __name__ == "__main__":
    try:
        print(json.dumps(run_probe()))
    except Exception as e:  # reported as a failed check by doctor
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
