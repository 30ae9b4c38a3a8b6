"""`modelexport profile`: the QNN EP's own profiler (per QNN node cycles) + ONNX Runtime's profiler
(CPU EP nodes), a Chrome/Perfetto trace, and bad bundles. Small models built here."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import assert_clean_error, run_cli
from onnx_models import conv_det


@pytest.fixture(scope="module")
def det_bundle(tmp_path_factory):
    """Conv → Det (refused by the QNN EP, runs on the CPU EP) → Relu, 8a8w for SM8650."""
    d = tmp_path_factory.mktemp("prof")
    model = conv_det(d / "conv_det.onnx")
    out = d / "bundle"
    run_cli("compile", str(model), "-o", str(out), "--precision", "8a8w", "--calibration", "random", "--json", check=True,
            env={"MODELEXPORT_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "modelexport-cache")})
    return out


def test_detailed_ranks_cpu_fallback_first_with_qnn_cycles(det_bundle, cli, cli_here, tmp_path):
    """The one `profile` run in a child process (the console entry); the rest call its entry function."""
    trace = tmp_path / "trace.json"
    proc = cli("profile", str(det_bundle), "--level", "detailed", "--runs", "3", "--trace", str(trace), "--json", check=True)
    rep = json.loads(proc.stdout)
    ops = rep["ops"]
    assert ops[0]["name"] == "/head/det/Det" and ops[0]["backend"] == "CPU fallback" and ops[0]["op_type"] == "Det"
    assert ops[0]["module_path"] == "head.det" and ops[0]["time_us"] > 0
    assert rep["cpu_fallbacks"] == ["/head/det/Det"]
    htp = [o for o in ops if o["backend"] == "HTP"]
    conv = next(o for o in htp if o["name"] == "/features/conv/Conv")
    assert conv["op_type"] == "Conv" and conv["cycles"] > 0 and conv["module_path"] == "features.conv"
    assert abs(sum(o["share"] for o in ops) - 1.0) < 1e-6
    # the QNN EP's CSV columns, as the library writes them
    assert rep["qnn_csv_columns"] == ["Msg Timestamp", "Message", "Time", "Unit of Measurement", "Timing Source",
                                      "Event Level", "Event Identifier"]
    assert rep["totals"]["qnn_accelerator_cycles_median"] > 0 and "not phone latencies" in rep["note"]
    data = json.loads(trace.read_text())
    names = {e["name"] for e in data["traceEvents"] if e.get("ph") == "X"}
    assert {"/head/det/Det", "/features/conv/Conv"} <= names
    assert any(e.get("tid") == 2 and e.get("args", {}).get("cycles") for e in data["traceEvents"])
    # an existing trace is not replaced without --force
    assert_clean_error(cli_here("profile", str(det_bundle), "--trace", str(trace)), "exists")


def test_a_split_graphs_cycles_are_its_graphs_together_per_run(tmp_path):
    """At fp16, Conv and Relu are two QNN graphs around the CPU's Det: each run's cycles are both
    graphs' sum (--precision auto costs candidates by them; the smaller graph's count alone made
    GTCRN's fp16 look 1,675x the cycles of its 8a8w split into 17 graphs)."""
    import modelexport
    from modelexport.profiling.ort_profile import profile_ort
    b = modelexport.compile(str(conv_det(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650", precision="fp16",
                            use_cache=False)
    t = profile_ort(b.path, runs=3, level="detailed").totals
    assert t["placement"]["QNNExecutionProvider"] == 2, t["placement"]
    assert len(t["qnn_accelerator_cycles_runs"]) == 3 and t["qnn_accelerator_cycles_min"] > 0


def test_basic_level_table_and_note(det_bundle, cli_here):
    proc = cli_here("profile", str(det_bundle), "--runs", "2", check=True)
    out = " ".join(proc.stdout.split())
    assert "CPU fallback" in out and "/head/det/Det" in out and "HTP graph" in out
    assert "not phone latencies" in out


def test_tampered_and_missing_files_are_integrity_errors(det_bundle, cli_here, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(det_bundle, b)
    ctx = next(b.glob("*/SM8650/*_ctx_qnn.bin"))
    data = bytearray(ctx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    ctx.write_bytes(bytes(data))
    proc = cli_here("profile", str(b))
    assert proc.returncode == 4
    assert_clean_error(proc, "does not match its manifest", "sha256")
    ctx.unlink()
    assert_clean_error(cli_here("profile", str(b)), "missing")


def test_other_qairt_build_names_both(det_bundle, cli_here, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(det_bundle, b)
    m = json.loads((b / "manifest.json").read_text())
    here = m["qairt_build"]
    m["qairt_build"] = "v2.37.0.250724175447"
    (b / "manifest.json").write_text(json.dumps(m))
    proc = cli_here("profile", str(b))
    assert_clean_error(proc, "v2.37.0.250724175447", here, "recompile")


def test_bad_level_and_runs(det_bundle, cli_here):
    assert_clean_error(cli_here("profile", str(det_bundle), "--level", "verbose"), "--level")
    assert_clean_error(cli_here("profile", str(det_bundle), "--runs", "0"), "--runs")


def test_qnn_csv_parser_splits_runs_and_names_nodes(tmp_path):
    """The EP writes every ROOT row first, then every SUB-EVENT row (one block per execute)."""
    from modelexport.profiling.qnn_csv import read_qnn_csv
    rows = ["Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier",
            "0,BACKEND,6531,US,BACKEND,ROOT,Accelerator (load binary) time",
            "0,INIT,19224,US,BACKEND,ROOT,QNN (load binary) time"]
    for cyc, us in ((700, 50), (300, 20)):
        rows += [f"0,BACKEND,{cyc},CYCLES,BACKEND,ROOT,Accelerator (execute) time (cycles)",
                 f"0,BACKEND,{us},US,BACKEND,ROOT,Accelerator (execute) time",
                 f"0,EXECUTE,{us + 1},US,BACKEND,ROOT,QNN (execute) time"]
    for k in (1, 2):
        rows += [f"0,NODE,{3 * k},CYCLES,BACKEND,SUB-EVENT,Input OpId_2 (cycles)",
                 f"0,NODE,{100 * k},CYCLES,BACKEND,SUB-EVENT,/features/features.3/conv/conv.0/conv.0.0/Conv_token_37:OpId_81 (cycles)",
                 f"0,NODE,{10 * k},CYCLES,BACKEND,SUB-EVENT,/features/features.3/Add:OpId_102 (cycles)"]
    p = tmp_path / "q.csv"
    p.write_text("\n".join(rows) + "\n")
    prof = read_qnn_csv(p)
    assert len(prof.runs) == 2 and prof.runs[0].accel_cycles == 700 and prof.runs[1].execute_us == 21
    assert [e.name for e in prof.runs[1].nodes] == ["Input", "/features/features.3/conv/conv.0/conv.0.0/Conv",
                                                    "/features/features.3/Add"]
    assert prof.runs[1].nodes[1].cycles == 200 and prof.runs[1].nodes[1].op_id == 81
    assert "QNN (load binary) time (US)" in prof.load


@pytest.mark.parametrize("args, needles", [
    (("verify", "--min-sqnr", "nan"), ("--min-sqnr must be a finite number",)),
    (("verify", "--samples", "-1"), ("--samples must be at least 1",)),
    (("verify", "--per-layer", "--samples", "0"), ("--samples must be at least 1",)),
    (("run", "--random", "--repeat", "0"), ("--repeat must be at least 1",)),
])
def test_numbers_out_of_range_are_refused_before_work(det_bundle, cli_here, args, needles):
    verb, *rest = args
    proc = cli_here(verb, str(det_bundle), *rest)
    assert_clean_error(proc, *needles)
    assert proc.returncode == 2


def test_keep_naming_a_file_is_refused(det_bundle, cli_here, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    assert_clean_error(cli_here("profile", str(det_bundle), "--keep", str(f)), "--keep", "is a file")
    assert f.read_text() == "mine"


def test_a_graph_qnn_cannot_profile_in_detail_gets_the_level_that_works(tmp_path, cli_here):
    """openWakeWord's hey_jarvis at fp16 (its If computed as both branches + Where): QNN's detailed
    profile refuses the graph (QNN_GRAPH_ERROR_SET_PROFILE); the error says so and names --level basic,
    which runs."""
    ow = pytest.importorskip("openwakeword")
    from pathlib import Path

    import modelexport
    model = Path(ow.__file__).parent / "resources" / "models" / "hey_jarvis_v0.1.onnx"
    b = modelexport.compile(str(model), output=tmp_path / "b", target="SM8650", precision="fp16")
    assert b.manifest.numerics["passed"]
    r = cli_here("profile", str(tmp_path / "b"), "--level", "detailed")
    assert_clean_error(r, "QNN could not profile this graph at level detailed")
    assert "--level basic" in r.stderr
    rep = modelexport.profile(tmp_path / "b", runs=1, level="basic")      # the Python API, the CLI's names
    assert rep.level == "basic" and rep.totals["qnn_accelerator_us_median"] > 0
