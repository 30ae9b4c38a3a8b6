"""Build the libQnnHtp.so ABI adapter and lay out the QNN_SDK_ROOT folder ExecuTorch expects.

Why an adapter at all: executorch 1.5.1 is compiled against the QNN 2.37 headers, and the only
QAIRT on PyPI (onnxruntime-qnn 2.7.0) is 2.51. Their function tables line up, but two device
configs do not:
  1. the HTP custom device config carries a union that 2.37 writes at byte offset 4 and 2.51
     reads at byte offset 8, so 2.51 sees SoC 0 ("unknown custom config socModel 0", 14001);
  2. 2.51 rejects the platform-info device config that 2.37-era ExecuTorch always sends.
`qnn_htp_adapter.c` fixes both inside `deviceCreate` and passes everything else through.

The adapter is compiled with the system C compiler on first use into a per-user cache,
`$MODELEXPORT_CACHE_DIR` (default `~/.cache/modelexport`) `/qnn-adapter/<build id>/<key>/`,
where the key covers the real library's path and the adapter source. That folder *is* the
QNN_SDK_ROOT handed to ExecuTorch: `lib/x86_64-linux-clang/` holds the adapter as libQnnHtp.so
and symlinks to the real libraries (libHtpPrepare.so also as libQnnHtpPrepare.so).
Builds go to a temporary folder renamed into place under a file lock, so concurrent processes
never see half a build and a folder in use is never rewritten.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ...core.cache import cache_root
from ...core.errors import ToolchainError
from ..qairt_layout import HOST_LIB_SUBDIR, LIBRARY_NAMES

ADAPTER_SOURCE = Path(__file__).with_name("qnn_htp_adapter.c")
MARKER = "modelexport-adapter.json"
_LOCK_TIMEOUT_S = 120

# Reads the build id in a child process, so that the real libQnnHtp.so is never loaded into the
# caller before the adapter (the first library with soname libQnnHtp.so wins every later lookup
# by that name). Layout as in qairt.py: QnnInterface_t head is 40 bytes, backendGetBuildId is
# slot 4 of the function table.
_BUILD_ID_PROBE = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
get = lib.QnnInterface_getProviders
get.restype = ctypes.c_uint64
providers, n = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_uint32()
if get(ctypes.byref(providers), ctypes.byref(n)) or not n.value:
    sys.exit("no QNN interface providers")
fn = ctypes.c_void_p.from_address(providers[0] + 40 + 8 * 4).value
build = ctypes.c_char_p()
ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p))(fn)(ctypes.byref(build))
print("QAIRT_BUILD_ID=" + build.value.decode())
"""


@dataclass(frozen=True)
class AdapterBuild:
    sdk_root: Path          # the folder to export as QNN_SDK_ROOT
    library: Path           # the adapter, <sdk_root>/lib/x86_64-linux-clang/libQnnHtp.so
    real_library: Path      # the QAIRT libQnnHtp.so behind it
    build_id: str           # QAIRT build of the real library
    built: bool             # compiled by this call (False: taken from the cache)


def cache_dir() -> Path:
    """The project's cache root: `$MODELEXPORT_CACHE_DIR`, default `~/.cache/modelexport`."""
    return cache_root()


def adapter_cache() -> Path:
    return cache_dir() / "qnn-adapter"


def is_adapter_sdk_root(path: str | os.PathLike | None) -> bool:
    """True if `path` is a QNN_SDK_ROOT laid out here (not a user's own SDK)."""
    return bool(path) and (Path(path) / MARKER).is_file()


def _lock():
    root = adapter_cache()
    root.mkdir(parents=True, exist_ok=True)
    return FileLock(str(root / ".lock"), timeout=_LOCK_TIMEOUT_S)


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def read_build_id(real_library: Path) -> str:
    """The QAIRT build id of a libQnnHtp.so, read in a child process and cached on disk."""
    real_library = Path(real_library)
    index = adapter_cache() / "build-ids.json"
    key = _file_key(real_library)
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", _BUILD_ID_PROBE, str(real_library)],
                          capture_output=True, text=True, timeout=120)
    # The library prints its own banner on stdout, so look for the marked line.
    found = re.search(r"^QAIRT_BUILD_ID=(\S+)$", proc.stdout, re.M) if proc.returncode == 0 else None
    build_id = found[1] if found else ""
    if not build_id:
        raise ToolchainError(
            f"cannot read the QAIRT build of {real_library}: {(proc.stderr or proc.stdout).strip()[-400:]}",
            "reinstall onnxruntime-qnn (make setup) or point QNN_SDK_ROOT at a complete QAIRT SDK")
    with _lock():
        try:
            known = json.loads(index.read_text())
        except (OSError, ValueError):
            known = {}
        known[key] = build_id
        tmp = index.with_name(f".{index.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        os.replace(tmp, index)
    return build_id


def _folder(real_library: Path, build_id: str) -> Path:
    h = hashlib.sha256(str(Path(real_library).resolve()).encode() + b"\0" + ADAPTER_SOURCE.read_bytes())
    return adapter_cache() / build_id / h.hexdigest()[:12]


def find_built_adapter(real_library: Path, build_id: str) -> AdapterBuild | None:
    """The cached adapter for this library and build, if it was built already."""
    root = _folder(real_library, build_id)
    lib = root / HOST_LIB_SUBDIR / LIBRARY_NAMES["htp"]
    if (root / MARKER).is_file() and lib.is_file():
        return AdapterBuild(root, lib, Path(real_library), build_id, built=False)
    return None


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "gcc")


def _compile(out: Path, real_library: Path) -> str:
    cc = compiler()
    if cc is None:
        raise ToolchainError(
            "no C compiler (gcc) was found, and ExecuTorch's QNN backend needs a small adapter "
            "compiled on this machine to use the QAIRT libraries of onnxruntime-qnn",
            "install gcc (`apt-get install gcc`), or set CC to a C compiler")
    real_literal = json.dumps(str(Path(real_library).resolve()), ensure_ascii=False)
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,libQnnHtp.so", "-Wl,-z,nodelete",
           f"-DQNN_HTP_REAL_PATH={real_literal}", "-o", str(out), str(ADAPTER_SOURCE), "-ldl", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise ToolchainError(f"compiling the QNN adapter with {cc} failed:\n{proc.stderr.strip()[-1500:]}",
                             "check that gcc and the C library headers are installed (`apt-get install gcc libc6-dev`)")
    return cc


def _lay_out(root: Path, adapter: Path, real_dir: Path) -> None:
    """<root>/lib/x86_64-linux-clang/: the adapter as libQnnHtp.so, symlinks to the rest."""
    lib_dir = root / HOST_LIB_SUBDIR
    lib_dir.mkdir(parents=True)
    os.replace(adapter, lib_dir / LIBRARY_NAMES["htp"])
    for so in sorted(real_dir.glob("*.so")):
        if so.name != LIBRARY_NAMES["htp"]:
            (lib_dir / so.name).symlink_to(so.resolve())
    prepare = real_dir / LIBRARY_NAMES["htp_prepare"]
    if prepare.exists() and not (lib_dir / "libQnnHtpPrepare.so").exists():
        (lib_dir / "libQnnHtpPrepare.so").symlink_to(prepare.resolve())


def build_adapter(real_library: Path, build_id: str) -> AdapterBuild:
    """The adapter for this real libQnnHtp.so, compiled now if the cache has none."""
    real_library = Path(real_library).resolve()
    found = find_built_adapter(real_library, build_id)
    if found:
        return found
    with _lock():
        found = find_built_adapter(real_library, build_id)  # another process may have won
        if found:
            return found
        final = _folder(real_library, build_id)
        tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        tmp.mkdir(parents=True)
        try:
            t0 = time.perf_counter()
            cc = _compile(tmp / "adapter.so", real_library)
            _lay_out(tmp, tmp / "adapter.so", real_library.parent)
            (tmp / MARKER).write_text(json.dumps({
                "qairt_build": build_id,
                "real_library": str(real_library),
                "source_sha256": hashlib.sha256(ADAPTER_SOURCE.read_bytes()).hexdigest(),
                "compiler": cc,
                "compile_seconds": round(time.perf_counter() - t0, 3),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }, indent=1))
            if final.exists():  # a leftover without a marker: set it aside, never rewrite in place
                final.rename(final.with_name(f".stale-{final.name}-{uuid.uuid4().hex[:6]}"))
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return AdapterBuild(final, final / HOST_LIB_SUBDIR / LIBRARY_NAMES["htp"], real_library, build_id, built=True)
