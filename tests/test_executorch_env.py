"""ExecuTorch's Qualcomm backend on the onnxruntime-qnn QAIRT (2.51) through the ABI adapter.

Real libraries end to end: the adapter is compiled with gcc, ExecuTorch lowers a tiny 8a8w
Linear/ReLU module for five SoCs, the embedded context binaries name the requested target, and
the .pte runs on this host's HTP simulator through executorch.runtime.
"""
from __future__ import annotations

import json
import operator
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from modelexport.core.errors import ToolchainError
from modelexport.core.targets import get_target
from modelexport.toolchain.executorch_env import (
    adapter_status, build_adapter, ensure_executorch_qnn, loaded_by_name, read_build_id)
from modelexport.toolchain.executorch_env import environment as et_env


def _load_adapter_at_collection() -> None:
    """The adapter must own the name libQnnHtp.so before anything in the process loads QAIRT's
    real libQnnHtp.so. Collection imports every test module before any test runs, in every
    worker, so loading it here keeps tests of other files that load QAIRT in-process (doctor's
    find_qairt, ONNX Runtime sessions) from coming first. The build goes to a private temp
    cache, as conftest's cache folder does not exist yet."""
    import atexit
    import shutil
    import tempfile

    from modelexport.toolchain.executorch_env import load_adapter_first
    cache = tempfile.mkdtemp(prefix="modelexport-adapter-")
    atexit.register(shutil.rmtree, cache, True)
    before = os.environ.get("MODELEXPORT_CACHE_DIR")
    os.environ["MODELEXPORT_CACHE_DIR"] = cache
    try:
        load_adapter_first()
    except ToolchainError:
        pass  # the qnn_env fixture raises it again, where a test can report it
    finally:
        if before is None:
            os.environ.pop("MODELEXPORT_CACHE_DIR", None)
        else:
            os.environ["MODELEXPORT_CACHE_DIR"] = before


_load_adapter_at_collection()

TARGETS = ("SM8450", "SM8550", "SM8650", "SM8750", "SM8850")
REPO = Path(__file__).resolve().parents[1]
# The HTP preparer writes its settings as text into the context binary, target included.
_SETTINGS = re.compile(rb"soc_type=(\w+);arch=(\d+);")


@pytest.fixture(scope="module")
def qnn_env(tmp_path_factory):
    """The process set up for ExecuTorch's QNN backend; QNN_SDK_ROOT restored afterwards."""
    before = os.environ.get("QNN_SDK_ROOT")
    with pytest.MonkeyPatch.context() as mp:  # conftest's cache folder, set before module fixtures
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        state = ensure_executorch_qnn()
    yield state
    if before is None:
        os.environ.pop("QNN_SDK_ROOT", None)
    else:
        os.environ["QNN_SDK_ROOT"] = before


@pytest.fixture(scope="module")
def tiny(qnn_env):
    import torch

    class TinyMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(16, 32)
            self.down = torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    return TinyMLP().eval(), (torch.randn(1, 16),)


@pytest.fixture(scope="module")
def quantized_8a8w(tiny):
    import torch
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model, example = tiny
    quantizer = QnnQuantizer()
    quantizer.set_default_quant_config(QuantDtype.use_8a8w)
    prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    for _ in range(8):
        prepared(torch.randn(1, 16))
    prepared(*example)
    return convert_pt2e(prepared)


def _lower(module, example, soc: str, use_fp16: bool):
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (generate_htp_compiler_spec,
                                                          generate_qnn_executorch_compiler_spec,
                                                          to_edge_transform_and_lower_to_qnn)
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=getattr(QcomChipset, soc), backend_options=generate_htp_compiler_spec(use_fp16=use_fp16))
    return to_edge_transform_and_lower_to_qnn(module, example, specs)


@pytest.fixture(scope="module")
def lowered_8a8w(tiny, quantized_8a8w):
    """soc -> (edge program, .pte bytes), lowered once per SoC for the whole module."""
    done: dict[str, tuple] = {}

    def get(soc: str):
        if soc not in done:
            edge = _lower(quantized_8a8w, tiny[1], soc, use_fp16=False)
            done[soc] = (edge, edge.to_executorch().buffer)
        return done[soc]
    return get


def _context_binaries(pte: bytes) -> list[bytes]:
    import executorch.backends.qualcomm.python.PyQnnManagerAdaptor as PyQnnManagerAdaptor
    from executorch.exir._serialize._program import deserialize_pte_binary
    program = deserialize_pte_binary(pte).program
    return [PyQnnManagerAdaptor.StripProtocol(program.backend_delegate_data[d.processed.index].data).tobytes()
            for plan in program.execution_plan for d in plan.delegates if d.id == "QnnBackend"]


def _run_on_host(pte: bytes, example):
    from executorch.runtime import Runtime
    method = Runtime.get().load_program(pte).load_method("forward")
    return method.execute(list(example))[0]


@pytest.mark.parametrize("soc", TARGETS)
def test_8a8w_lowers_to_one_qnn_delegate_built_for_the_requested_soc(soc, lowered_8a8w):
    import torch
    edge, pte = lowered_8a8w(soc)
    gm = edge.exported_program().graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    delegates = [n for n in calls if n.target is torch.ops.higher_order.executorch_call_delegate]
    assert len(delegates) == 1, gm.graph
    assert all(n is delegates[0] or n.target is operator.getitem for n in calls), gm.graph  # nothing left on CPU
    assert getattr(gm, delegates[0].args[0].target).backend_id == "QnnBackend"

    (binary,) = _context_binaries(pte)
    found = _SETTINGS.search(binary)
    assert found, "no target settings in the context binary"
    assert found[1].decode() == soc
    assert int(found[2]) == get_target(soc).htp_arch


def test_8a8w_pte_runs_on_this_host_through_the_adapter(tiny, quantized_8a8w, lowered_8a8w, qnn_env):
    _, example = tiny
    _, pte = lowered_8a8w("SM8650")
    calls_before = adapter_status()["device_create_calls"]
    out = _run_on_host(pte, example)
    assert adapter_status()["device_create_calls"] > calls_before  # the runtime went through it too
    # Against the quantized graph run by torch, so only the backend's error is measured
    # (a few 8-bit steps), not the quantization's.
    assert (out - quantized_8a8w(*example)).abs().max().item() < 0.03


def test_fp16_pte_matches_eager_on_this_host(tiny):
    model, example = tiny
    edge = _lower(model, example, "SM8750", use_fp16=True)
    pte = edge.to_executorch().buffer
    (binary,) = _context_binaries(pte)
    assert _SETTINGS.search(binary)[1] == b"SM8750"
    out = _run_on_host(pte, example)
    assert (out - model(*example)).abs().max().item() < 5e-3


def test_state_and_status_report_the_pairing(qnn_env):
    assert qnn_env.mode == "adapter" and qnn_env.qairt_source == "onnxruntime-qnn wheel"
    assert qnn_env.pairing.startswith("executorch 1.5.1 (QNN 2.37 ABI) ↔ QAIRT 2.51")
    assert qnn_env.pairing.endswith("via adapter") and qnn_env.verified
    assert os.environ["QNN_SDK_ROOT"] == str(qnn_env.qnn_sdk_root)
    assert loaded_by_name("libQnnHtp.so") == qnn_env.adapter_library
    status = adapter_status()
    assert status["ok"] and status["built"] and status["loads"] and status["active_in_process"]
    assert status["pairing"] == qnn_env.pairing and status["qairt_build"] == qnn_env.qairt_build
    assert ensure_executorch_qnn() is qnn_env  # cheap and stable on repeat


def test_sdk_root_is_laid_out_as_executorch_expects(qnn_env):
    lib_dir = qnn_env.qnn_sdk_root / "lib" / "x86_64-linux-clang"
    real_dir = qnn_env.real_library.parent
    assert (lib_dir / "libQnnHtp.so").resolve() == qnn_env.adapter_library.resolve()
    assert (lib_dir / "libQnnHtpPrepare.so").resolve() == (real_dir / "libHtpPrepare.so").resolve()
    assert (lib_dir / "libQnnSystem.so").resolve() == (real_dir / "libQnnSystem.so").resolve()
    dynamic = subprocess.run(["readelf", "-d", str(qnn_env.adapter_library)], capture_output=True, text=True)
    if dynamic.returncode == 0:
        assert "Library soname: [libQnnHtp.so]" in dynamic.stdout and "NODELETE" in dynamic.stdout


def test_onnxruntime_qnn_ep_still_runs_on_htp_with_the_adapter_loaded(qnn_env):
    import numpy as np
    from onnx import TensorProto, helper

    from modelexport.toolchain.ort_qnn import SessionPlan, create_session, node_assignment
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    calls_before = adapter_status()["device_create_calls"]
    session = create_session(model.SerializeToString(),
                             SessionPlan(provider_options={"soc_model": "57", "enable_htp_fp16_precision": "1"}))
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], np.maximum(x, 0), atol=1e-2)
    assert [op for _, op in node_assignment(session).get("QNNExecutionProvider", [])] == ["Relu"]
    # ONNX Runtime speaks 2.51 and got the real table: the adapted deviceCreate was not used.
    assert adapter_status()["device_create_calls"] == calls_before


_BUILD_IN_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from modelexport.toolchain.executorch_env.adapter import build_adapter, read_build_id
    real = Path(sys.argv[1])
    b = build_adapter(real, read_build_id(real))
    print("RESULT=" + json.dumps({"library": str(b.library), "built": b.built}))
""")


def test_two_processes_building_at_once_share_one_atomic_build(qnn_env, tmp_path):
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_IN_CHILD, str(qnn_env.real_library)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT="))[7:]))
    assert results[0]["library"] == results[1]["library"]
    assert sorted(r["built"] for r in results) == [False, True]
    build_dir = Path(results[0]["library"]).parents[3]
    assert [p.name for p in build_dir.iterdir()] == [Path(results[0]["library"]).parents[2].name]  # no temp leftovers
    assert build_dir.name == qnn_env.qairt_build


def test_without_a_compiler_the_error_says_how_to_fix_it(qnn_env, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-gcc"))
    with pytest.raises(ToolchainError) as e:
        build_adapter(qnn_env.real_library, read_build_id(qnn_env.real_library))
    assert "gcc" in e.value.problem and "apt-get install gcc" in e.value.fix
    assert not list((tmp_path / "qnn-adapter").glob(f"{qnn_env.qairt_build}/*"))


@pytest.mark.parametrize("build_id, forced, expected", [
    ("v2.37.1.250807093845", None, False),    # executorch 1.5.1's own ABI: a user's SDK, used directly
    ("v2.51.0.260929181845", None, True),     # the onnxruntime-qnn wheel: adapter
    ("v2.44.0.250101000000", None, ToolchainError),  # untested pairing: say so
    ("v2.44.0.250101000000", "1", True),
    ("v2.51.0.260929181845", "0", False),
])
def test_which_qairt_builds_get_the_adapter(build_id, forced, expected, monkeypatch):
    if forced is None:
        monkeypatch.delenv("MODELEXPORT_QNN_ADAPTER", raising=False)
    else:
        monkeypatch.setenv("MODELEXPORT_QNN_ADAPTER", forced)
    if expected is ToolchainError:
        with pytest.raises(ToolchainError, match="not been paired"):
            et_env._needs_adapter(build_id)
    else:
        assert et_env._needs_adapter(build_id) is expected


_ORT_FIRST_IN_CHILD = textwrap.dedent("""
    from onnx import TensorProto, helper
    from modelexport.core.errors import ToolchainError
    from modelexport.toolchain.executorch_env import ensure_executorch_qnn
    from modelexport.toolchain.ort_qnn import SessionPlan, create_session, node_assignment
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    sess = create_session(model.SerializeToString(), SessionPlan(provider_options={"soc_model": "57"}))
    print("PLACEMENT=" + ",".join(node_assignment(sess)))
    try:
        ensure_executorch_qnn()
        print("RESULT=ok")
    except ToolchainError as e:
        print("RESULT=" + e.problem + " | " + e.fix)
""")

_REAL_LIBRARY_FIRST_IN_CHILD = textwrap.dedent("""
    import ctypes
    import onnxruntime_qnn, pathlib
    ctypes.CDLL(str(pathlib.Path(onnxruntime_qnn.__file__).parent / "libQnnHtp.so"))  # a user's code, before us
    from modelexport.core.errors import ToolchainError
    from modelexport.toolchain.executorch_env import ensure_executorch_qnn
    try:
        ensure_executorch_qnn()
        print("RESULT=ok")
    except ToolchainError as e:
        print("RESULT=" + e.problem + " | " + e.fix)
""")


def _child(code, tmp_path_factory):
    env = {**os.environ, "MODELEXPORT_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "modelexport-cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("QNN_SDK_ROOT", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    return proc.stdout + proc.stderr[-2000:]


def test_onnxruntime_first_then_executorch_works(qnn_env, tmp_path_factory):
    # modelexport's ORT sessions claim the name libQnnHtp.so for the adapter first, so using the
    # ONNX path before the ExecuTorch path in one process is fine, and ORT still runs on HTP.
    out = _child(_ORT_FIRST_IN_CHILD, tmp_path_factory)
    assert "PLACEMENT=QNNExecutionProvider" in out and "RESULT=ok" in out, out


def test_real_library_loaded_first_is_a_clear_error_not_a_14001(qnn_env, tmp_path_factory):
    out = _child(_REAL_LIBRARY_FIRST_IN_CHILD, tmp_path_factory)
    result = next((line for line in out.splitlines() if line.startswith("RESULT=")), out)
    assert "was loaded into this process before" in result and "load_adapter_first()" in result, result
