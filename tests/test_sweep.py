"""`modelexport sweep`: a small matrix (two tiny ONNX models, a tiny PyTorch module, and a model
with a CPU fallback compiled under strict; two targets, two precisions) run locally through the CLI
and on a Ray instance this file starts (on the local run's compile cache), giving the same table; a
re-run that only does the missing cells; bad matrices and an unreachable cluster. Also: one LLM cell
(perplexity ratio, decode ceiling), one quantization shared by both targets of the PyTorch model, a
failed cell's fix in the matrix's words, and the measured memory rule Ray declares."""
from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from et_models import MLP, write
from onnx_models import conv_det, conv_relu

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TARGETS = ("SM8650", "SM8750")
PRECISIONS = ("fp16", "8a8w")
MODELS = ("conv8", "conv4", "mlp", "det")
# what must not depend on where a cell ran
SAME_EVERYWHERE = ("status", "htp_share", "cpu_fallbacks", "parameters", "numerics", "ship", "error")
# ...but the bytes of two compiles of one ONNX cell differ by a few: ONNX Runtime names the EPContext
# node's partition with a per-process hash (`QNNExecutionProvider_QNNExecutionProvider_<hash>_1_0`), the
# context binary itself is the same
EPCONTEXT_NAME_SLACK = 16


def _same_table(a: dict, b: dict) -> None:
    assert [(r["target"], r["model"], r["precision"]) for r in a["cells"]] == \
        [(r["target"], r["model"], r["precision"]) for r in b["cells"]]
    for x, y in zip(a["cells"], b["cells"]):
        cell = (x["model"], x["target"], x["precision"])
        assert {k: x.get(k) for k in SAME_EVERYWHERE} == {k: y.get(k) for k in SAME_EVERYWHERE}, cell
        assert (x.get("bytes") is None) == (y.get("bytes") is None), cell
        if x.get("bytes") is not None:
            assert abs(x["bytes"] - y["bytes"]) <= (EPCONTEXT_NAME_SLACK if x["kind"] == "onnx" else 0), cell
    assert a["ship"] == b["ship"]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sweep_models")
    conv_relu(d / "conv8.onnx")
    conv_relu(d / "conv4.onnx", channels=4)
    conv_det(d / "det.onnx")
    write(d, "mlp", MLP)
    (d / "matrix.yaml").write_text(
        "models:\n"
        "  - {path: conv8.onnx, calibration: random}\n"
        "  - {path: conv4.onnx, calibration: random}\n"
        "  - {path: mlp.py:build, calibration: random}\n"
        "  - {path: det.onnx, calibration: random, options: {strict: true}}\n"
        f"targets: [{', '.join(TARGETS)}]\n"
        f"precisions: [{', '.join(PRECISIONS)}]\n")
    return d / "matrix.yaml"


def _own_cache(tmp_path_factory, name: str) -> dict[str, str]:
    return {"MODELEXPORT_CACHE_DIR": str(tmp_path_factory.getbasetemp() / f"sweep-cache-{name}")}


@pytest.fixture(scope="module")
def local(matrix, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sweep_local") / "out"
    proc = run_cli("sweep", str(matrix), "-o", str(out), "--workers", "2", "--json",
                   env=_own_cache(tmp_path_factory, "local"), check=True)
    assert "Traceback" not in proc.stderr, proc.stderr
    return {"out": out, "results": json.loads(proc.stdout), "log": proc.stderr}


@pytest.fixture(scope="module")
def on_ray(matrix, local, tmp_path_factory) -> dict:
    """The same matrix on Ray, on the local run's compile cache (test time: each cell still runs in a
    Ray task, through the same compile, verify and table; only the QNN stages are cache hits)."""
    ray = pytest.importorskip("ray")
    import modelexport
    out = tmp_path_factory.mktemp("sweep_ray") / "out"
    with pytest.MonkeyPatch.context() as mp:     # Ray's workers inherit this process's environment
        for k, v in _own_cache(tmp_path_factory, "local").items():
            mp.setenv(k, v)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 2**20)
        try:
            results = modelexport.sweep(matrix, out, ray="auto")
        finally:
            ray.shutdown()
    return {"out": out, "results": results}


def _by_cell(results: dict) -> dict[tuple, dict]:
    return {(r["model"], r["target"], r["precision"]): r for r in results["cells"]}


def test_every_cell_is_compiled_or_failed_with_its_reason(local):
    res, out = local["results"], local["out"]
    cells = _by_cell(res)
    assert len(cells) == len(MODELS) * len(TARGETS) * len(PRECISIONS) == res["summary"]["cells"]
    assert res["summary"] == {"cells": 16, "compiled": 12, "failed": 4, "reused": 0, "ran": 16, "discarded_partials": 0}
    for (model, target, precision), r in cells.items():
        if model == "det":      # Det has no QNN op: it falls back to the CPU, which strict refuses
            assert r["status"] == "failed" and r["error"] == "StrictFallbackError" and r["exit_code"] == 3
            assert "/head/det/Det" in r["reason"] and r["fix"] and r["bundle"] is None
            assert not (out / model / target / precision).exists()
            continue
        assert r["status"] == "compiled" and not r["reused"], r
        m = json.loads((out / r["bundle"] / "manifest.json").read_text())
        assert m["targets"] == [target] and m["precision"] == precision
        assert r["htp_share"] == 1.0 and r["cpu_fallbacks"] == 0
        # numerics from the bundle itself: compile's own check (.pte), verify's (context binaries)
        worst = min(o["sqnr_db"] for o in m["numerics"]["outputs"])
        assert r["sqnr_db"] == round(worst, 2) and r["threshold_db"] == m["numerics"]["threshold_db"]
        assert r["numerics"] in ("passed", "below pass mark")
        assert r["bytes"] > 0 and r["parameters"] > 0 and r["bytes_per_param"] == round(r["bytes"] / r["parameters"], 4)
        assert r["runtime"] == ("ExecuTorch (QNN delegate)" if model == "mlp" else "ONNX Runtime (QNN EP)")
    assert cells[("conv8", "SM8650", "fp16")]["parameters"] == 8 * 3 * 3 * 3 + 8
    assert cells[("mlp", "SM8650", "fp16")]["parameters"] == 64 * 128 + 128 + 128 * 32 + 32
    assert not list(out.glob("*/*/.*partial*")), "a temporary cell folder was left behind"
    # one quantization feeds every target: of the PyTorch model's 8a8w cells (each its own process),
    # one quantized it and the other lowered the cached program (the manifests say which)
    quantized = {t: json.loads((out / "mlp" / t / "8a8w" / "manifest.json").read_text())["cache"] for t in TARGETS}
    assert sorted(c["quantize_hit"] for c in quantized.values()) == [False, True], quantized
    assert json.loads((out / "mlp" / "SM8650" / "fp16" / "manifest.json").read_text())["cache"].get("quantize_hit") is None
    assert "Traceback" not in local["log"] and "cells done" in local["log"] and "failed" in local["log"]


def test_results_are_sorted_so_what_to_ship_per_soc_is_on_top(local):
    res, out = local["results"], local["out"]
    rows = res["cells"]
    assert [r["target"] for r in rows] == sorted((r["target"] for r in rows), key=TARGETS.index)
    for target in TARGETS:
        mine = [r for r in rows if r["target"] == target]
        statuses = [r["status"] for r in mine]
        assert statuses == sorted(statuses, key=["compiled", "failed"].index)     # failed cells last
        for model in ("conv8", "conv4", "mlp"):
            cells = [r for r in mine if r["model"] == model]
            keys = [(r["tier"], -r["htp_share"], r["bytes"]) for r in cells]
            assert keys == sorted(keys)
            passed = [r for r in cells if r["numerics"] == "passed"]
            assert [r["ship"] for r in cells] == [r is (passed[0] if passed else None) for r in cells]
            assert res["ship"][target][model] == (passed[0]["precision"] if passed else None)
        assert res["ship"][target]["det"] is None
    written = json.loads((out / "results.json").read_text())
    assert written["cells"] == rows
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("target,model,precision,status,ship") and len(csv_lines) == 1 + len(rows)
    page = (out / "report.html").read_text()
    assert "What to ship per SoC" in page and "Failed cells (4)" in page and "conv8/SM8650/fp16/report.html" in page


def test_ray_gives_the_same_table_as_the_local_run(local, on_ray):
    res = on_ray["results"]
    assert res["run"]["executor"] == "ray" and res["run"]["slots"] == 2
    assert res["summary"] == local["results"]["summary"]
    _same_table(local["results"], res)


def test_a_rerun_only_does_the_missing_cells(local, tmp_path):
    import modelexport
    out = tmp_path / "out"
    shutil.copytree(local["out"], out)
    (out / ".sweep.lock").unlink(missing_ok=True)
    shutil.rmtree(out / "conv4" / "SM8750" / "8a8w")                       # a cell deleted
    killed = out / "mlp" / "SM8650" / ".fp16.partial-0123abcd"              # and one a killed run left half-written
    (killed / "bundle").mkdir(parents=True)
    (killed / "bundle" / "model.pte").write_bytes(b"half")
    kept = {p: p.stat().st_mtime_ns for p in out.glob("*/*/*/manifest.json")}
    res = modelexport.sweep(local["results"]["matrix"], out, workers=1)
    s = res["summary"]
    assert (s["ran"], s["reused"], s["discarded_partials"]) == (1 + 4, 11, 1)   # the deleted cell + the failed ones
    cells = _by_cell(res)
    assert cells[("conv4", "SM8750", "8a8w")]["status"] == "compiled" and not cells[("conv4", "SM8750", "8a8w")]["reused"]
    assert all(r["reused"] for k, r in cells.items() if k[0] != "det" and k != ("conv4", "SM8750", "8a8w"))
    assert all(r["status"] == "failed" for k, r in cells.items() if k[0] == "det")         # reported again, not dropped
    assert not killed.exists()
    assert all(p.stat().st_mtime_ns == t for p, t in kept.items()), "a complete cell was rewritten"
    _same_table(local["results"], res)


KILLER = """
import os
import signal


def build():
    os.kill(os.getpid(), signal.SIGKILL)     # as a crash in native code would end the worker
"""


def test_a_cell_that_kills_its_worker_runs_again_alone_then_is_reported(matrix, tmp_path):
    import modelexport
    write(tmp_path, "killer", KILLER)
    (tmp_path / "m.yaml").write_text(f"models: ['{tmp_path / 'killer.py'}:build', {{path: '{matrix.parent / 'conv8.onnx'}', "
                                     "calibration: random}]\ntargets: [SM8650]\nprecisions: [8a8w]\n")
    res = modelexport.sweep(tmp_path / "m.yaml", tmp_path / "out", workers=2)
    cells = _by_cell(res)
    dead = cells[("killer", "SM8650", "8a8w")]
    assert dead["status"] == "failed" and "worker process died" in dead["reason"] and "2 times" in dead["reason"]
    assert dead["fix"].startswith("compile it alone")
    # the other cell, lost with the broken pool or not, ends compiled
    assert cells[("conv8", "SM8650", "8a8w")]["status"] == "compiled"
    assert not list((tmp_path / "out").glob("*/*/.*partial*"))


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory) -> Path:
    """A folder with tiny_hf (a 1-layer tiny Llama with its tokenizer) and calib.txt."""
    from llm_tiny import write_tiny_llm_folder
    return write_tiny_llm_folder(tmp_path_factory.mktemp("sweep_llm"), n_layers=1)


def test_an_llm_cell_declares_its_up_front_estimate_to_ray(tiny_llm, tmp_path):
    """The CPUs and memory a Ray task of an LLM cell asks for are compile --dry-run's, per precision."""
    from modelexport.backends.llm_qnn.compile import plan_llm
    from modelexport.sweeping.cells import plan_cells
    from modelexport.sweeping.matrix import load_matrix
    from modelexport.sweeping.resources import cell_resources
    for name in ("tiny_hf", "calib.txt"):
        (tmp_path / name).symlink_to(tiny_llm / name)
    (tmp_path / "m.yaml").write_text("models: [{path: tiny_hf, calibration: calib.txt, options: {max_seq_len: 64}}]\n"
                                     "targets: [SM8650]\nprecisions: [16a4w_block, 16a8w]\n")
    cells = plan_cells(load_matrix(tmp_path / "m.yaml"))
    assert [(c.model.kind, c.precision.name) for c in cells] == [("llm", "16a4w_block"), ("llm", "16a8w")]
    for cell in cells:
        need = cell_resources(cell)
        plan = plan_llm(tmp_path / "tiny_hf", cell.precision.name, max_seq_len=64)
        assert (need.num_cpus, need.memory_bytes) == (plan["jobs"], plan["estimate"]["peak_bytes"])
        assert "job_estimate" in need.source


def test_an_llm_cell_compiles_through_the_sweep_with_its_quality_and_decode_ceiling(tiny_llm, tmp_path):
    """One LLM cell (a 1-layer tiny Llama, one ar1 graph, 16a4w with a perplexity budget) on one
    target: its row reads what the LLM manifest records."""
    import modelexport

    from modelexport.core.targets import get_target
    for name in ("tiny_hf", "calib.txt"):
        (tmp_path / name).symlink_to(tiny_llm / name)
    (tmp_path / "m.yaml").write_text(
        "models: [{path: tiny_hf, calibration: calib.txt,\n"
        "          options: {variants: ar1, max_seq_len: 64, calibration_samples: 2, rounding: nearest}}]\n"
        "targets: [SM8650]\nprecisions: [{name: 16a4w, max_ppl_ratio: 1.5}]\n")
    res = modelexport.sweep(tmp_path / "m.yaml", tmp_path / "out", workers=1)
    (r,) = res["cells"]
    assert r["status"] == "compiled" and r["kind"] == "llm", r
    m = json.loads((tmp_path / "out" / r["bundle"] / "manifest.json").read_text())
    assert m["llm"]["variants"] == [1] and m["llm"]["max_seq_len"] == 64 and m["precision"] == "16a4w"
    assert r["htp_share"] == 1.0 and r["cpu_fallbacks"] == 0 and r["runtime"]
    assert r["parameters"] == m["parameters"] > 0 and r["bytes"] > 0
    assert r["bytes_per_param"] == round(r["bytes"] / r["parameters"], 4)
    recipe = m["llm"]["quality_recipe"]          # the budget's perplexities on held-out text
    assert r["ppl_ratio"] == round(recipe["ratio"], 4) and recipe["max_ppl_ratio"] == 1.5
    # compile's own check of the logits against float, and the quality budget: both must pass
    logits = m["numerics"]["outputs"][0]["sqnr_db"]
    assert r["sqnr_db"] == logits and r["threshold_db"] == m["numerics"]["threshold_db"] == 5.0
    assert r["numerics"] == ("passed" if recipe["ratio"] <= 1.5 and logits >= 5.0 else "below pass mark")
    ceiling = get_target("SM8650").dram_gbps * 1e9 / m["llm"]["weight_bytes_per_token"]
    assert r["decode_ceiling_tok_s"] == round(ceiling, 1) > 0


def test_a_failed_cells_fix_is_written_as_the_matrix_writes_it(tmp_path):
    """A model with a dynamic input and no input_shapes: the fix names the matrix key, not the CLI flag."""
    import modelexport
    conv_relu(tmp_path / "dyn.onnx", dynamic=True)
    (tmp_path / "m.yaml").write_text("models: [{path: dyn.onnx, calibration: random}]\ntargets: [SM8650]\nprecisions: [8a8w]\n")
    (r,) = modelexport.sweep(tmp_path / "m.yaml", tmp_path / "out", workers=1)["cells"]
    assert r["status"] == "failed" and r["error"] == "InputError" and "dynamic" in r["reason"]
    assert "input_shapes: {x: [N, 3, 16, 16]}" in r["fix"] and "--input-shape" not in r["fix"], r["fix"]


def test_parameters_are_counted_in_constant_nodes_and_subgraphs(tmp_path):
    """bytes/param needs the parameter count: paddle2onnx models (RapidOCR's) hold every weight in a
    Constant node and have no initializer; control-flow models keep some in If / Loop bodies."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from modelexport.sweeping.results import _onnx_parameters
    w = numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "w")
    branch = lambda v: helper.make_graph(   # noqa: E731
        [helper.make_node("Constant", [], [f"k{v}"], value=numpy_helper.from_array(np.full(4, v, np.float32)))],
        f"b{v}", [], [helper.make_tensor_value_info(f"k{v}", TensorProto.FLOAT, [4])])
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["w"], value=w),
         helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("If", ["c"], ["k"], then_branch=branch(1), else_branch=branch(2))],
        "paddle_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                        helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.zeros(8, np.float32), "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    assert _onnx_parameters(tmp_path / "m.onnx") == 8 * 3 * 3 * 3 + 8 + 4 + 4


def test_onnx_and_pytorch_cells_declare_memory_from_the_measured_rule(matrix):
    """The memory a Ray task of an ONNX / PyTorch cell reserves follows the rule fitted on measured
    cells, and that rule lies above every measured point (bench/sweep_cell_memory.py)."""
    from modelexport.sweeping.cells import plan_cells
    from modelexport.sweeping.matrix import load_matrix
    from modelexport.sweeping.resources import MB, MEMORY_RULES, TORCH_FACTORY_MB, cell_resources
    need = {(c.model.name, c.precision.name): cell_resources(c) for c in plan_cells(load_matrix(matrix))}
    size = (matrix.parent / "conv8.onnx").stat().st_size
    for precision, quantized in (("fp16", False), ("8a8w", True)):
        conv, mlp = need[("conv8", precision)], need[("mlp", precision)]
        assert conv.num_cpus == 1 and "measured on" in conv.source
        assert conv.memory_bytes == MEMORY_RULES[("onnx", quantized)].bytes_for(size)
        assert mlp.memory_bytes == MEMORY_RULES[("torch", quantized)].bytes_for(TORCH_FACTORY_MB * MB) and "assumed" in mlp.source
    measured = json.loads((Path(__file__).parents[1] / "bench" / "results" / "sweep_cell_memory.json").read_text())
    points = [p for p in measured["points"] if p["status"] == "compiled"]
    assert {(p["kind"], p["precision"]) for p in points} == {(k, p) for k in ("onnx", "torch") for p in ("fp16", "8a8w")}
    for p in points:
        rule = MEMORY_RULES[(p["kind"], p["precision"] != "fp16")]
        assert rule.bytes_for(int(p["model_mb"] * MB)) >= p["peak_mb"] * MB, p


def test_a_bad_matrix_lists_every_problem_at_once_before_any_work(matrix, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"models: ['{matrix.parent / 'conv8.onnx'}', missing.onnx]\n"
                   "targets: [SM8650, SM9999]\nprecisions: [fp16, 9a9w]\nshard: 3\n")
    proc = run_cli("sweep", str(bad), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert_clean_error(proc, "4 problems", "unknown key 'shard'", "'missing.onnx' does not exist",
                       "unknown target 'SM9999'", "unknown precision '9a9w'", "fix:")
    assert not (tmp_path / "out").exists()


def test_an_unreachable_ray_cluster_is_one_message_and_nothing_starts(matrix, tmp_path):
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = run_cli("sweep", str(matrix), "-o", str(tmp_path / "out"), "--ray", f"127.0.0.1:{port}")
    assert proc.returncode == 2
    assert_clean_error(proc, f"cannot reach a Ray cluster at 127.0.0.1:{port}", "nothing was started", "--workers")
    assert not (tmp_path / "out").exists()


def test_the_report_verb_redraws_the_sweep_page(local, tmp_path):
    out = tmp_path / "page.html"
    proc = run_cli("report", str(local["out"]), "-o", str(out), "--json", check=True)
    assert json.loads(proc.stdout)["report"] == str(out)
    page = out.read_text()
    assert "What to ship per SoC" in page and "SM8750: compiled cells" in page
