"""Make ExecuTorch's Qualcomm backend find the right QNN libraries, inside the running process.

ExecuTorch dlopens "libQnnHtp.so" and "libQnnSystem.so" by bare name and reads QNN_SDK_ROOT for
the SDK version (and to skip its own SDK download). LD_LIBRARY_PATH cannot help a process that
is already running, but the dynamic loader answers a by-name dlopen with an already loaded
library of that soname. So, before ExecuTorch starts a backend, this module loads by full path
the adapter (or a user's own 2.37 SDK library) and the matching libQnnSystem.so, and points
QNN_SDK_ROOT at the laid-out folder. This works the same for the CLI and for a user's own
`import modelexport` process; no re-exec is needed.

Two ordering rules, both measured:
  * the first loaded library with soname libQnnHtp.so wins every later by-name lookup, so the
    adapter must be loaded before anything loads the real libQnnHtp.so (ONNX Runtime's QNN EP,
    find_qairt()). load_adapter_first() does only that, cheaply and safely before torch; code
    that loads QAIRT should call it first. ensure_executorch_qnn() checks the order and fails
    clearly instead of letting ExecuTorch reach the real library ("... error=14001");
  * libQnnSystem.so loaded before torch makes the later executorch import crash, so torch is
    imported first.
"""
from __future__ import annotations

import ctypes
import os
import re
import threading
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    import onnxruntime_qnn
except ImportError:   # a broken install: said as a ToolchainError where its libraries are needed
    onnxruntime_qnn = None

from ...core.errors import ToolchainError
from ..library_notes import quiet_library_load
from ..qairt_layout import HOST_LIB_SUBDIR, LIBRARY_NAMES
from . import adapter as _adapter

EXECUTORCH_QNN_ABI = (2, 37)      # the QNN headers executorch 1.5.1 was built against
ADAPTER_VERIFIED = ((2, 51),)     # QAIRT releases the adapter was checked on end to end
_FIRST_ADAPTED_MINOR = 51         # the device-config layout change happened by 2.51


@dataclass(frozen=True)
class AdapterState:
    mode: str                       # "adapter" (QAIRT ≥ 2.51) or "direct" (a 2.37 SDK)
    qnn_sdk_root: Path              # what QNN_SDK_ROOT now points at
    qairt_source: str               # "onnxruntime-qnn wheel" or "QNN_SDK_ROOT"
    qairt_build: str                # e.g. v2.51.0.260929181845
    real_library: Path              # the QAIRT libQnnHtp.so doing the work
    adapter_library: Path | None    # the adapter, when one is used
    built: bool                     # the adapter was compiled by this process
    executorch_version: str
    pairing: str                    # e.g. "executorch 1.5.1 (QNN 2.37 ABI) ↔ QAIRT 2.51.0 via adapter"
    verified: bool                  # this pairing was checked end to end

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


_state: AdapterState | None = None
_handles: list[ctypes.CDLL] = []   # keep the preloaded libraries referenced for the process
_lock = threading.Lock()


def _executorch_version() -> str:
    try:
        return version("executorch")
    except PackageNotFoundError:
        raise ToolchainError("executorch is not installed",
                             "run `make setup` (it installs executorch==1.5.1)") from None


def _release(build_id: str) -> tuple[int, int, int]:
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", build_id)
    if not m:
        raise ToolchainError(f"unrecognised QAIRT build id {build_id!r}",
                             "point QNN_SDK_ROOT at a QAIRT SDK, or unset it to use onnxruntime-qnn's")
    return int(m[1]), int(m[2]), int(m[3])


def _real_library() -> tuple[Path, str]:
    """(libQnnHtp.so to use, where it comes from): a user's own SDK wins, as in qairt.py."""
    root = os.environ.get("QNN_SDK_ROOT")
    if root and not _adapter.is_adapter_sdk_root(root):
        lib = Path(root).expanduser() / HOST_LIB_SUBDIR / LIBRARY_NAMES["htp"]
        if not lib.is_file():
            raise ToolchainError(f"QNN_SDK_ROOT={root} has no {HOST_LIB_SUBDIR}/libQnnHtp.so",
                                 "point QNN_SDK_ROOT at the folder holding lib/, or unset it to use "
                                 "the QAIRT libraries of the onnxruntime-qnn wheel")
        return lib, "QNN_SDK_ROOT"
    if onnxruntime_qnn is None:
        raise ToolchainError("onnxruntime-qnn is not installed, so no QAIRT libraries were found",
                             "run `make setup` (it installs onnxruntime-qnn==2.7.0), or set QNN_SDK_ROOT")
    lib = Path(onnxruntime_qnn.__file__).parent / LIBRARY_NAMES["htp"]
    if not lib.is_file():
        raise ToolchainError(f"{lib} is missing", "reinstall onnxruntime-qnn (make setup)")
    return lib, "onnxruntime-qnn wheel"


def _needs_adapter(build_id: str) -> bool:
    forced = os.environ.get("MODELEXPORT_QNN_ADAPTER", "").strip().lower()
    if forced in ("1", "on", "yes"):
        return True
    if forced in ("0", "off", "no"):
        return False
    major, minor, _ = _release(build_id)
    if (major, minor) == EXECUTORCH_QNN_ABI:
        return False
    if major == 2 and minor >= _FIRST_ADAPTED_MINOR:
        return True
    raise ToolchainError(
        f"QAIRT {build_id} has not been paired with executorch 1.5.1 (built for QNN 2.37); "
        "it is not known whether its device configs need the adapter",
        "use a QAIRT 2.37 SDK or the onnxruntime-qnn wheel's 2.51 (unset QNN_SDK_ROOT); "
        "or force a choice with MODELEXPORT_QNN_ADAPTER=1 (adapter) or =0 (direct)")


def _pairing(et: str, build_id: str, mode: str) -> str:
    release = ".".join(map(str, _release(build_id)))
    how = "via adapter" if mode == "adapter" else "directly"
    return f"executorch {et} (QNN {EXECUTORCH_QNN_ABI[0]}.{EXECUTORCH_QNN_ABI[1]} ABI) ↔ QAIRT {release} {how}"


class _LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]


def loaded_by_name(name: str) -> Path | None:
    """The file a by-name dlopen(name) would return right now, if one is loaded already."""
    try:
        lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    libc = ctypes.CDLL(None)
    link_map = ctypes.POINTER(_LinkMap)()
    if libc.dlinfo(ctypes.c_void_p(lib._handle), 2, ctypes.byref(link_map)) != 0:  # RTLD_DI_LINKMAP
        return None
    return Path(link_map.contents.l_name.decode()) if link_map.contents.l_name else None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@dataclass(frozen=True)
class _Plan:
    mode: str                     # "adapter" or "direct"
    real: Path                    # QAIRT's libQnnHtp.so
    source: str
    build_id: str
    by_name: Path                 # what answers dlopen("libQnnHtp.so"): the adapter or `real`
    sdk_root: Path
    built: bool


_plan: _Plan | None = None


def _claim(htp: Path, what: str) -> None:
    """Load `htp` so that it answers every later dlopen("libQnnHtp.so") in this process."""
    present = loaded_by_name(LIBRARY_NAMES["htp"])
    if present is not None and not _same_file(present, htp):
        raise ToolchainError(
            f"{present} was loaded into this process before ExecuTorch's QNN setup, so ExecuTorch "
            f"would use it instead of {what}",
            "call modelexport.toolchain.executorch_env.load_adapter_first() (or "
            "ensure_executorch_qnn()) before anything else loads QNN (ONNX Runtime's QNN EP, "
            "find_qairt()), or run the ExecuTorch step in its own process")
    try:
        with quiet_library_load():   # libQnnHtp.so may print a LIBNATIVE banner on fd 1
            _handles.append(ctypes.CDLL(str(htp)))
    except OSError as e:
        raise ToolchainError(f"cannot load {what}: {e}",
                             "reinstall onnxruntime-qnn (make setup) or fix QNN_SDK_ROOT") from None


def _load_first() -> _Plan:
    global _plan
    if _plan is None:
        real, source = _real_library()
        build_id = _adapter.read_build_id(real)
        if _needs_adapter(build_id):
            build = _adapter.build_adapter(real, build_id)
            _claim(build.library, f"the QNN adapter {build.library}")
            _plan = _Plan("adapter", real, source, build_id, build.library, build.sdk_root, build.built)
        else:
            _claim(real, str(real))
            _plan = _Plan("direct", real, source, build_id, real, real.parent.parent.parent, False)
    return _plan


def load_adapter_first() -> Path:
    """Load the adapter (or a user's 2.37 libQnnHtp.so) so it owns the name libQnnHtp.so here.

    Cheap once built, safe before torch, and it does not load the real library yet. Call it
    before anything else in the process loads QAIRT's libQnnHtp.so (ONNX Runtime's QNN EP,
    find_qairt()): those then reach the real library through the adapter untouched, and
    ExecuTorch later finds the adapter. Returns the library that now answers to that name.
    """
    with _lock:
        return _load_first().by_name


def ensure_executorch_qnn() -> AdapterState:
    """Prepare this process for ExecuTorch's QNN backend; cheap after the first call.

    Call it before ExecuTorch lowers to or runs on QNN. Raises ToolchainError when something the
    user can fix is wrong (no gcc, an untested QAIRT, the real library loaded too early).
    Whatever the QAIRT libraries print while they load (libQnnHtp.so's "LIBNATIVE" banner) goes
    to stderr, so a `--json` report stays the only thing on stdout.
    """
    with quiet_library_load():
        return _ensure()


def _ensure() -> AdapterState:
    global _state
    with _lock:
        if _state is not None:
            os.environ["QNN_SDK_ROOT"] = str(_state.qnn_sdk_root)  # in case someone cleared it
            return _state
        et = _executorch_version()
        plan = _load_first()
        if plan.mode == "adapter":
            error = _adapter_error(plan.by_name)  # makes the adapter load the real library now
            if error:
                raise ToolchainError(f"the QNN adapter cannot load {plan.real}: {error}",
                                     "reinstall onnxruntime-qnn (make setup) or fix QNN_SDK_ROOT")
        import torch  # noqa: F401  (must be loaded before libQnnSystem.so, see the module note)
        system = plan.real.parent / LIBRARY_NAMES["system"]
        if system.exists():
            try:
                _handles.append(ctypes.CDLL(str(system)))
            except OSError as e:
                raise ToolchainError(f"cannot load {system}: {e}",
                                     "reinstall onnxruntime-qnn (make setup) or fix QNN_SDK_ROOT") from None
        os.environ["QNN_SDK_ROOT"] = str(plan.sdk_root)
        release = _release(plan.build_id)[:2]
        verified = release == EXECUTORCH_QNN_ABI if plan.mode == "direct" else release in ADAPTER_VERIFIED
        _state = AdapterState(plan.mode, plan.sdk_root, plan.source, plan.build_id, plan.real,
                              plan.by_name if plan.mode == "adapter" else None, plan.built, et,
                              _pairing(et, plan.build_id, plan.mode), verified)
        return _state


def _adapter_error(library: Path) -> str | None:
    """Make the adapter load its real library now; the reason if that fails."""
    fn = ctypes.CDLL(str(library)).QnnHtpAdapter_error
    fn.restype = ctypes.c_char_p
    err = fn()
    return err.decode(errors="replace") if err else None


def _device_create_calls(library: Path) -> int:
    fn = ctypes.CDLL(str(library)).QnnHtpAdapter_deviceCreateCalls
    fn.restype = ctypes.c_uint32
    return int(fn())


def current_state() -> AdapterState | None:
    """What ensure_executorch_qnn() set up in this process, or None if it has not run."""
    return _state
