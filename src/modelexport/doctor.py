"""`modelexport doctor`: the environment check users run first.

Each check returns OK / WARN / FAIL with a fix when it is not OK. Checks are data (a list of
functions), so adding one is one function. Required checks failing → non-zero exit.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from .core.errors import ModelExportError
from .toolchain.qairt import find_qairt

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None
    required: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


# (package, predicate on version, what is expected)
PACKAGE_EXPECTATIONS: list[tuple[str, Callable[[str], bool], str]] = [
    ("torch", lambda v: v.split("+")[0] == "2.13.0", "2.13.0 (CPU build)"),
    ("executorch", lambda v: v == "1.5.1", "1.5.1"),
    ("torchao", lambda v: v.startswith("0.18."), "0.18.x (what executorch 1.5.1 wants)"),
    ("onnxruntime", lambda v: tuple(map(int, v.split(".")[:2])) >= (1, 24), ">= 1.24.2 (onnxruntime-qnn 2.7.0 needs it)"),
    ("onnxruntime-qnn", lambda v: v == "2.7.0", "2.7.0 (QAIRT 2.51)"),
    ("onnx", lambda v: True, "any"),
]

_checks: list[Callable[[], Check | list[Check]]] = []


def check(fn: Callable[[], Check | list[Check]]):
    _checks.append(fn)
    return fn


@check
def python_version() -> Check:
    v = sys.version.split()[0]
    ok = sys.version_info[:2] == (3, 11)
    return Check("python", OK if ok else FAIL, v, None if ok else "use Python 3.11 (the pinned wheels are cp311)")


@check
def packages() -> list[Check]:
    out = []
    for pkg, fits, expected in PACKAGE_EXPECTATIONS:
        try:
            v = version(pkg)
        except PackageNotFoundError:
            out.append(Check(pkg, FAIL, "not installed", "run `make setup` (installs the pinned set)"))
            continue
        good = fits(v)
        out.append(Check(pkg, OK if good else FAIL, v if good else f"{v}, expected {expected}",
                         None if good else f"run `make setup` to install the pinned {pkg} {expected}"))
    return out


@check
def qairt() -> Check:
    try:
        q = find_qairt()
    except ModelExportError as e:
        return Check("qairt", FAIL, e.problem, e.fix)
    return Check("qairt", OK, f"QAIRT {q.build_id} from {q.source} (core API {q.core_api}, HTP API {q.htp_api}) at {q.lib_dir}")


@check
def htp_simulator_probe() -> Check:
    try:
        proc = subprocess.run([sys.executable, "-m", "modelexport.toolchain.htp_probe"],
                              capture_output=True, text=True, timeout=300)
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
        result = json.loads(line) if line else {"ok": False, "error": (proc.stderr or "no output").strip()[-300:]}
    except subprocess.TimeoutExpired:
        result = {"ok": False, "error": "the probe did not finish in 300 s"}
    if result.get("ok"):
        return Check("htp-simulator", OK, f"tiny graph ran on the HTP simulator; QNN EP ran {len(result['on_qnn'])}/2 nodes "
                     f"({', '.join(result['on_qnn'])}), max abs error {result['max_abs_error']:.4f}")
    detail = result.get("error") or f"QNN EP ran {result.get('on_qnn')} of 2 nodes; placement {result.get('placement')}"
    return Check("htp-simulator", FAIL, detail,
                 "reinstall onnxruntime==1.32.0 and onnxruntime-qnn==2.7.0 (make setup); check QNN_SDK_ROOT if set")


@check
def gcc() -> Check:
    path = shutil.which("gcc")
    if not path:
        return Check("gcc", FAIL, "not found", "install gcc (apt-get install gcc): it builds the ExecuTorch QNN adapter")
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()
    return Check("gcc", OK, out[0] if out else path)


@check
def cpu_kernels() -> Check:
    """The CPU runtime's own attention kernel: compiled with g++ on first use and loaded."""
    try:
        from .llm.cpu.kernels import load_native_kernels   # deferred: inside the try, so a failing import is reported
        path = load_native_kernels()
    except Exception as e:  # reported, not raised: doctor must always finish
        fix = getattr(e, "fix", None) or "install g++ (apt-get install g++) and run `make setup`"
        return Check("cpu-kernels", FAIL, f"{type(e).__name__}: {e}".splitlines()[0], fix)
    return Check("cpu-kernels", OK, f"modelexport::sdpa built and loaded ({path.parent.name[:12]})")


@check
def executorch_adapter() -> Check:
    try:
        from .toolchain.executorch_env import adapter_status   # deferred: a build without it is a WARN, not a crash
    except ImportError:
        return Check("executorch-qnn", WARN, "adapter module not available in this build", None, required=False)
    try:
        st = adapter_status()
    except Exception as e:  # reported, not raised: doctor must always finish
        return Check("executorch-qnn", FAIL, f"{type(e).__name__}: {e}", "run `make setup`; gcc must be installed")
    ok = bool(st.get("ok", st.get("loads")))
    return Check("executorch-qnn", OK if ok else FAIL, st.get("summary") or json.dumps(st),
                 None if ok else st.get("fix") or "see `modelexport doctor --json` for details")


@check
def android_ndk() -> Check:
    root = os.environ.get("ANDROID_NDK_ROOT")
    if not root:
        return Check("android-ndk", WARN, "ANDROID_NDK_ROOT not set (only needed to build on-device runners)",
                     "install the Android NDK (r26c or newer) and export ANDROID_NDK_ROOT", required=False)
    props = Path(root) / "source.properties"
    rev = re.search(r"Pkg\.Revision\s*=\s*(\S+)", props.read_text()) if props.is_file() else None
    if not rev:
        return Check("android-ndk", WARN, f"{root} has no source.properties with a revision",
                     "point ANDROID_NDK_ROOT at an unpacked NDK", required=False)
    return Check("android-ndk", OK, f"revision {rev.group(1)} at {root}", required=False)


@check
def adb() -> Check:
    path = shutil.which("adb")
    if not path:
        return Check("adb", WARN, "not found (only needed to push artifacts to a phone)",
                     "install Android platform-tools for on-device runs", required=False)
    out = subprocess.run([path, "version"], capture_output=True, text=True).stdout.splitlines()
    return Check("adb", OK, out[0] if out else path, required=False)


def run_checks() -> list[Check]:
    results: list[Check] = []
    for fn in _checks:
        try:
            r = fn()
        except Exception as e:  # a broken check is a failed check, never a crash
            r = Check(fn.__name__, FAIL, f"{type(e).__name__}: {e}", "report this as a bug")
        results.extend(r if isinstance(r, list) else [r])
    return results


def healthy(results: list[Check]) -> bool:
    return not any(c.status == FAIL and c.required for c in results)
