"""The adapter's state as plain data, for `modelexport doctor`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ...core.errors import ToolchainError
from . import adapter as _adapter
from . import environment as _env

# Loads the adapter in a child process (so doctor changes nothing here), makes it load the real
# library, and reads the build id back through it.
_LOAD_PROBE = r"""
import ctypes, json, sys
out = {}
try:
    lib = ctypes.CDLL(sys.argv[1])
    lib.QnnHtpAdapter_error.restype = ctypes.c_char_p
    lib.QnnHtpAdapter_realPath.restype = ctypes.c_char_p
    err = lib.QnnHtpAdapter_error()
    out["real_library"] = lib.QnnHtpAdapter_realPath().decode()
    if err:
        out["error"] = err.decode(errors="replace")
    else:
        get = lib.QnnInterface_getProviders
        get.restype = ctypes.c_uint64
        providers, n = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_uint32()
        get(ctypes.byref(providers), ctypes.byref(n))
        fn = ctypes.c_void_p.from_address(providers[0] + 40 + 8 * 4).value
        build = ctypes.c_char_p()
        ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p))(fn)(ctypes.byref(build))
        out["build_id"] = build.value.decode()
except OSError as e:
    out["error"] = str(e)
print("ADAPTER_PROBE=" + json.dumps(out))
"""


def _probe_load(library: Path) -> tuple[bool, str | None, str | None]:
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", _LOAD_PROBE, str(library)],
                          capture_output=True, text=True, timeout=120)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("ADAPTER_PROBE=")), None)
    try:
        out = json.loads(line.split("=", 1)[1])
    except (ValueError, AttributeError):
        return False, (proc.stderr or "the load probe died").strip()[-400:], None
    return "error" not in out, out.get("error"), out.get("build_id")


def adapter_status(build: bool = False) -> dict:
    """Is the adapter needed, built, loadable, and what pairs with what. Never raises for
    problems the user can fix: those come back as `problem` / `fix`. `build=True` compiles the
    adapter if it is missing (about a second)."""
    state = _env.current_state()
    status: dict = {"active_in_process": state is not None, "cache_dir": str(_adapter.adapter_cache()),
                    "compiler": _adapter.compiler()}
    try:
        et = _env._executorch_version()
        real, source = _env._real_library()
        build_id = _adapter.read_build_id(real)
        mode = "adapter" if _env._needs_adapter(build_id) else "direct"
        found = None
        if mode == "adapter" and state is not None and state.adapter_library is not None:
            found = _adapter.AdapterBuild(state.qnn_sdk_root, state.adapter_library, real, build_id, state.built)
        elif mode == "adapter":
            found = _adapter.build_adapter(real, build_id) if build else _adapter.find_built_adapter(real, build_id)
    except ToolchainError as e:
        return status | {"ok": False, "problem": e.problem, "fix": e.fix}
    release = _env._release(build_id)[:2]
    status |= {
        "mode": mode,
        "needed": mode == "adapter",
        "qairt_source": source,
        "qairt_build": build_id,
        "real_library": str(real),
        "executorch_version": et,
        "pairing": _env._pairing(et, build_id, mode),
        "verified": release in (_env.ADAPTER_VERIFIED if mode == "adapter" else (_env.EXECUTORCH_QNN_ABI,)),
    }
    if mode == "direct":
        return status | {"ok": True, "built": None, "loads": True, "adapter_library": None,
                         "summary": f"{status['pairing']} ({real})"}
    status |= {"built": found is not None, "adapter_library": str(found.library) if found else None,
               "loads": None, "load_error": None}
    if state is not None and state.adapter_library is not None:
        status |= {"loads": True, "device_create_calls": _env._device_create_calls(state.adapter_library)}
    elif found is not None:
        loads, error, seen_build = _probe_load(found.library)
        status |= {"loads": loads and seen_build == build_id, "load_error": error}
    if status["loads"]:
        status |= {"ok": True, "summary": f"{status['pairing']}; adapter built and loads ({found.library})"}
    elif found is not None:
        status |= {"ok": False, "summary": f"{status['pairing']}; the adapter does not load: {status['load_error']}",
                   "problem": f"the QNN adapter at {found.library} does not load: {status['load_error']}",
                   "fix": f"delete {found.sdk_root} (it is rebuilt on next use) and reinstall onnxruntime-qnn"}
    elif status["compiler"]:
        status |= {"ok": True, "summary": f"{status['pairing']}; adapter not built yet (gcc builds it on first use)"}
    else:
        status |= {"ok": False, "summary": f"{status['pairing']}; adapter not built and no C compiler found",
                   "problem": "the QNN adapter is not built and no C compiler was found",
                   "fix": "install gcc (`apt-get install gcc`)"}
    return status
