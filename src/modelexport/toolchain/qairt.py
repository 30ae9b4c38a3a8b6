"""Where the QAIRT (QNN) libraries come from, and what build they are.

A user's own SDK in `QNN_SDK_ROOT` wins; otherwise the libraries inside the `onnxruntime-qnn`
wheel (QAIRT 2.51 on x86, where `libQnnHtp.so` is the HTP simulator and graph preparer).
Versions are read from the real library through its C entry point, never from file names.
"""
from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

try:
    import onnxruntime_qnn
except ImportError:   # a broken install: said as a ToolchainError where its libraries are needed
    onnxruntime_qnn = None

from ..core.errors import ToolchainError
from .library_notes import quiet_library_load
from .qairt_layout import HOST_LIB_SUBDIR, LIBRARY_NAMES  # noqa: F401  (re-exported)
from .executorch_env import is_adapter_sdk_root, load_adapter_first

# Name variants seen in SDKs (the full SDK calls the preparer libQnnHtpPrepare.so).
_ALTERNATES = {"htp_prepare": ("libQnnHtpPrepare.so",)}

# QnnInterface_t (QnnInterface.h): uint32 backendId, char* providerName, Qnn_ApiVersion_t
# (six uint32: core major/minor/patch, backend major/minor/patch), then the function table.
_FUNCTION_TABLE_OFFSET = 40
_BACKEND_GET_BUILD_ID_INDEX = 4


class _ApiVersion(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("core_major", "core_minor", "core_patch", "be_major", "be_minor", "be_patch")]


class _InterfaceHead(ctypes.Structure):
    _fields_ = [("backend_id", ctypes.c_uint32), ("provider_name", ctypes.c_char_p),
                ("api_version", _ApiVersion)]


@dataclass(frozen=True)
class Qairt:
    source: str                 # "QNN_SDK_ROOT" or "onnxruntime-qnn wheel"
    lib_dir: Path               # folder holding libQnnHtp.so and friends
    extra_lib_dirs: tuple[Path, ...]  # runtime deps (the wheel's own libc++)
    libraries: dict[str, Path]
    build_id: str               # e.g. v2.51.0.260929181845
    core_api: str               # QNN core API version, e.g. 2.40.0
    htp_api: str                # HTP backend API version, e.g. 5.51.0
    backend_id: int
    sdk_root: Path | None = None
    wheel_version: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def version(self) -> str:
        """The QAIRT release, e.g. 2.51.0."""
        return self.build_id.lstrip("v").rsplit(".", 1)[0] if self.build_id.count(".") >= 3 else self.build_id

    def lib(self, role: str) -> Path:
        try:
            return self.libraries[role]
        except KeyError:
            raise ToolchainError(
                f"{LIBRARY_NAMES[role]} is not in the QAIRT libraries at {self.lib_dir}",
                "install onnxruntime-qnn==2.7.0 (make setup) or point QNN_SDK_ROOT at a full QAIRT SDK",
            ) from None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["version"] = self.version
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()} | {
            "lib_dir": str(self.lib_dir),
            "extra_lib_dirs": [str(p) for p in self.extra_lib_dirs],
            "libraries": {k: str(v) for k, v in self.libraries.items()},
            "sdk_root": str(self.sdk_root) if self.sdk_root else None,
        }


def _collect_libraries(lib_dir: Path) -> dict[str, Path]:
    found = {}
    for role, name in LIBRARY_NAMES.items():
        for candidate in (name, *_ALTERNATES.get(role, ())):
            if (lib_dir / candidate).exists():
                found[role] = lib_dir / candidate
                break
    return found


def _wheel_dirs() -> tuple[Path, tuple[Path, ...], str]:
    if onnxruntime_qnn is None:
        raise ToolchainError(
            "the onnxruntime-qnn package is not installed, so no QAIRT libraries were found",
            "run `make setup` (it installs onnxruntime-qnn==2.7.0), or set QNN_SDK_ROOT to a QAIRT SDK",
        )
    pkg = Path(onnxruntime_qnn.__file__).parent
    libs = pkg.parent / "onnxruntime_qnn.libs"
    return pkg, ((libs,) if libs.is_dir() else ()), getattr(onnxruntime_qnn, "__version__", "?")


def preload_runtime_libs(paths: tuple[Path, ...]) -> None:
    """The wheel's libraries need its private libc++; load it globally first.

    onnxruntime is imported before that libc++ goes global: importing onnxruntime *after* it
    (with numpy already loaded) segfaults in onnxruntime's pybind module."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        pass
    for d in paths:
        for so in sorted(d.glob("libunwind*.so*")) + sorted(d.glob("libc++abi*.so*")) + sorted(d.glob("libc++-*.so*")):
            try:
                ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass


def read_backend_versions(htp_lib: Path, extra_lib_dirs: tuple[Path, ...] = ()) -> tuple[str, str, str, int]:
    """(build id, core API, backend API, backend id) from the library's own providers."""
    preload_runtime_libs(extra_lib_dirs)
    try:
        with quiet_library_load():
            lib = ctypes.CDLL(str(htp_lib))
    except OSError as e:
        raise ToolchainError(f"cannot load {htp_lib}: {e}",
                             "reinstall onnxruntime-qnn (make setup) or fix QNN_SDK_ROOT") from None
    get_providers = lib.QnnInterface_getProviders
    get_providers.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)), ctypes.POINTER(ctypes.c_uint32)]
    get_providers.restype = ctypes.c_uint64
    providers = ctypes.POINTER(ctypes.c_void_p)()
    count = ctypes.c_uint32(0)
    if get_providers(ctypes.byref(providers), ctypes.byref(count)) != 0 or count.value == 0:
        raise ToolchainError(f"{htp_lib} returned no QNN interface providers",
                             "the library is broken or not a QNN backend; reinstall it")
    head_addr = providers[0]
    head = _InterfaceHead.from_address(head_addr)
    v = head.api_version
    fn_addr = ctypes.c_void_p.from_address(head_addr + _FUNCTION_TABLE_OFFSET + 8 * _BACKEND_GET_BUILD_ID_INDEX).value
    get_build_id = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p))(fn_addr)
    build = ctypes.c_char_p()
    build_id = build.value.decode() if get_build_id(ctypes.byref(build)) == 0 and build.value else "unknown"
    return (build_id, f"{v.core_major}.{v.core_minor}.{v.core_patch}",
            f"{v.be_major}.{v.be_minor}.{v.be_patch}", head.backend_id)


def claim_libqnnhtp_name() -> None:
    """Let ExecuTorch's ABI adapter own the name libQnnHtp.so before anything loads the real one.

    The dynamic loader hands every later request for that name to the first library loaded with
    it; ExecuTorch (built for the QNN 2.37 ABI) must get the adapter, everyone else gets the
    real table through it untouched. Best effort: without gcc, ONNX Runtime still works.
    """
    try:
        load_adapter_first()
    except ToolchainError:
        pass


@functools.lru_cache(maxsize=None)
def _find(sdk_root_env: str | None) -> Qairt:
    notes: list[str] = []
    sdk_root = None
    wheel_version = None
    if sdk_root_env and _is_adapter_root(sdk_root_env):
        sdk_root_env = None  # our own adapter layout over the wheel: report the wheel
    if sdk_root_env:
        sdk_root = Path(sdk_root_env).expanduser()
        lib_dir = sdk_root / HOST_LIB_SUBDIR
        if not (lib_dir / LIBRARY_NAMES["htp"]).exists():
            raise ToolchainError(
                f"QNN_SDK_ROOT={sdk_root_env} has no {HOST_LIB_SUBDIR}/libQnnHtp.so",
                "point QNN_SDK_ROOT at the folder holding QNN_README.txt and lib/, "
                "or unset it to use the QAIRT libraries of the onnxruntime-qnn wheel",
            )
        source, extra = "QNN_SDK_ROOT", ()
    else:
        claim_libqnnhtp_name()
        lib_dir, extra, wheel_version = _wheel_dirs()
        source = "onnxruntime-qnn wheel"
    libraries = _collect_libraries(lib_dir)
    build_id, core_api, htp_api, backend_id = read_backend_versions(libraries["htp"], extra)
    return Qairt(source, lib_dir, extra, libraries, build_id, core_api, htp_api, backend_id,
                 sdk_root, wheel_version, notes)


def _is_adapter_root(path: str) -> bool:
    return is_adapter_sdk_root(Path(path))


def find_qairt() -> Qairt:
    """The QAIRT in use: `QNN_SDK_ROOT` if set, else the onnxruntime-qnn wheel's."""
    return _find(os.environ.get("QNN_SDK_ROOT") or None)
