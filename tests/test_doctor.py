import json

from modelexport.toolchain.qairt import find_qairt


def test_qairt_from_wheel_reports_real_build():
    q = find_qairt()
    assert q.source == "onnxruntime-qnn wheel"
    assert q.build_id.startswith("v2.51.0."), q.build_id
    assert q.core_api.startswith("2.") and q.htp_api.startswith("5.")
    assert q.lib("htp").name == "libQnnHtp.so" and q.lib("system").exists()


def test_doctor_json_probe_ran_on_qnn(cli):
    proc = cli("doctor", "--json")
    data = json.loads(proc.stdout)  # stdout must be pure JSON (native banners go to stderr)
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["htp-simulator"]["status"] == "OK", checks["htp-simulator"]
    assert "probe_matmul" in checks["htp-simulator"]["detail"] and "2/2" in checks["htp-simulator"]["detail"]
    assert checks["qairt"]["status"] == "OK" and "v2.51.0" in checks["qairt"]["detail"]
    assert checks["adb"]["required"] is False
    assert data["ok"] is True and proc.returncode == 0


def test_probe_placement_is_what_the_library_reports():
    from modelexport.toolchain.htp_probe import run_probe
    r = run_probe()
    assert r["placement"] == {"QNNExecutionProvider": ["probe_matmul", "probe_relu"]}
    assert r["max_abs_error"] < 0.05


def test_broken_qnn_sdk_root_is_a_clear_error(cli, tmp_path):
    proc = cli("doctor", "--json", env={"QNN_SDK_ROOT": str(tmp_path / "nope")})
    data = json.loads(proc.stdout)
    qairt = next(c for c in data["checks"] if c["name"] == "qairt")
    assert qairt["status"] == "FAIL" and "QNN_SDK_ROOT" in qairt["detail"] and qairt["fix"]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
