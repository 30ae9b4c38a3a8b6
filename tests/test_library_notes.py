"""Seed 004's noise: QNN_LOG_LEVEL honoured (mapped, said once); the libraries' harmless lines that read
like failures (the QNN EP's power-config error, ExecuTorch's backend_opinfo warning) filtered at their
source by a documented rule (toolchain.library_notes) while every other line stays visible."""
from __future__ import annotations

import subprocess
import sys

from conftest import assert_clean_error
from onnx_models import conv_relu

POWER = "Failed to create HTP power config id"


def test_dlc_compile_hides_power_config_lines_only(tmp_path, cli):
    model = conv_relu(tmp_path / "m.onnx")
    args = ("compile", str(model), "--format", "dlc", "-p", "8a8w", "-c", "random", "--no-cache")
    quiet = cli(*args, "-o", str(tmp_path / "a"), check=True)
    assert POWER not in quiet.stderr
    shown = cli(*args, "-o", str(tmp_path / "b"), env={"QNN_LOG_LEVEL": "INFO"}, check=True)
    assert POWER in shown.stderr                 # the line is real, and only the rule hides it


def test_filter_passes_other_native_lines():
    code = ("import os\nfrom modelexport.toolchain.library_notes import quiet_native_notes\n"
            "with quiet_native_notes():\n"
            "    os.write(2, b'[E:onnxruntime:, qnn_execution_provider.cc:3672 CreateHtpPowerConfigId] "
            f"{POWER}.\\n')\n"
            "    os.write(2, b'[E:onnxruntime:, x.cc:1 Real] a real error\\n')\n"
            "os.write(2, b'after\\n')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert POWER not in proc.stderr and "a real error\nafter" in proc.stderr


def test_pytorch_quantizer_opinfo_warning_is_dropped_not_avoided():
    code = ("import executorch.backends.qualcomm.quantizer.backend_opinfo_adapter as a\n"
            "from modelexport.core.targets import get_target\n"
            "from modelexport.quant.precision import PRECISIONS\n"
            "from modelexport.quant.pt2e_qnn import QuantPlan, build_quantizer\n"
            "build_quantizer(QuantPlan(PRECISIONS['8a8w']), get_target('SM8650'))\n"
            "print(a._WARNED_ABOUT_FALLBACK)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("True")        # ExecuTorch did log its fallback warning ...
    assert "backend_opinfo" not in proc.stderr         # ... and the rule kept it off the user's screen


def test_qnn_log_level_is_mapped_and_said_once(tmp_path, cli):
    from modelexport.toolchain.qnn_log_level import LEVELS
    assert LEVELS["DEBUG"] == (0, "debug") and LEVELS["ERROR"] == (3, "error")
    model = conv_relu(tmp_path / "m.onnx")
    cli("compile", str(model), "-o", str(tmp_path / "b"), "-c", "random", check=True)
    quiet = cli("run", str(tmp_path / "b"), "--random", "--json", check=True)
    assert "Set Qnn log level" not in quiet.stderr
    loud = cli("run", str(tmp_path / "b"), "--random", "--json", env={"QNN_LOG_LEVEL": "DEBUG"}, check=True)
    assert loud.stderr.count("note: QNN_LOG_LEVEL=DEBUG") == 1
    assert "Set Qnn log level for backend: 4" in loud.stderr       # QNN itself now logs verbosely
    assert loud.stdout.lstrip().startswith("{")                      # --json stays clean
    assert_clean_error(cli("targets", env={"QNN_LOG_LEVEL": "loud"}), "not a QNN log level", "fix:")


def test_qnn_log_level_only_adds_verbosity(monkeypatch):
    from modelexport.toolchain.qnn_log_level import executorch_log_level, ort_severity
    monkeypatch.setenv("QNN_LOG_LEVEL", "warn")
    assert ort_severity(3) == 2 and ort_severity(0) == 0            # the audit's verbose log stays verbose
    assert executorch_log_level("error") == "warn" and executorch_log_level("debug") == "debug"
    monkeypatch.delenv("QNN_LOG_LEVEL")
    assert ort_severity(3) == 3 and executorch_log_level("error") == "error"
