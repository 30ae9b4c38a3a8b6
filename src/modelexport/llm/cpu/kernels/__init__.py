"""Our own ExecuTorch kernels for the CPU runtime, compiled on this machine on first use.

A kernel is a C++ file beside this one that registers itself with ExecuTorch's kernel registry
when its shared library is loaded (`EXECUTORCH_LIBRARY`). It is built with the system C++
compiler against the headers and `libexecutorch.so` of the installed executorch wheel, into the
content-addressed cache (`native-kernels/<key>/`): the key is the source, the wheel's version
and the compiler flags, so a changed source or wheel gives a new build. Building takes ~2 s.

Only programs that call our ops need this: `load_native_kernels()` is called by the CPU
runtime before it loads a program, and by the export before it writes one.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import shutil
import subprocess
import threading
from importlib.metadata import version
from pathlib import Path

from ....core.cache import Cache, cache_key as _cache_key
from ....core.errors import ToolchainError
from ..et_runtime import runtime

HERE = Path(__file__).resolve().parent
SOURCES = ("sdpa.cpp", "linear_q4.cpp")   # one shared library holds them all
HEADERS = ("kernel_common.h",)             # what they include (part of the cache key)
LIBRARY = "libmodelexport_kernels.so"
OPERATOR_NAMESPACE = "modelexport"             # the kernels register modelexport::<op>.out
LINK = ("executorch", "executorch_threadpool")   # the wheel's libraries the kernels call into
_LOCK = threading.Lock()
_LOADED: Path | None = None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def compile_flags() -> list[str]:
    """-O3 and what this CPU has of AVX2/FMA/F16C (the build runs where the program runs)."""
    flags = _cpu_flags() if platform.machine() in ("x86_64", "AMD64") else set()
    simd = ["-mavx2", "-mfma"] if {"avx2", "fma"} <= flags else []
    if simd and "f16c" in flags:       # float16 block scales (GGUF's) converted 8 at a time
        simd.append("-mf16c")
    return ["-O3", *simd, "-fno-math-errno", "-std=c++17", "-shared", "-fPIC",
            "-DET_USE_THREADPOOL", "-DNDEBUG"]


def _executorch_dirs() -> tuple[Path, Path, Path]:
    spec = importlib.util.find_spec("executorch")
    spec_t = importlib.util.find_spec("torch")
    if spec is None or spec_t is None:
        raise ToolchainError("executorch or torch is not installed", "run `make setup`")
    et = Path(list(spec.submodule_search_locations)[0])
    torch_inc = Path(list(spec_t.submodule_search_locations)[0]) / "include"
    if not (et / "include" / "executorch").is_dir() or not (et / "lib" / "libexecutorch.so").is_file():
        raise ToolchainError(f"the executorch wheel at {et} has no C++ headers or libexecutorch.so",
                             "reinstall the pinned executorch wheel (make setup)")
    return et / "include", et / "lib", torch_inc


def build_command(out: Path) -> list[str]:
    cxx = shutil.which(os.environ.get("CXX") or "g++")
    if cxx is None:
        raise ToolchainError("no C++ compiler (g++) was found; the CPU runtime compiles its kernels (attention, 4-bit linear) "
                             "on first use", "install g++ (`apt-get install g++`), or set CXX to a C++ compiler")
    inc, lib, torch_inc = _executorch_dirs()
    # ExecuTorch's c10 copy first; torch's include tree only for the one generated macro header
    # the wheel leaves out (torch/headeronly/macros/cmake_macros.h)
    return [cxx, *compile_flags(), f"-I{inc}", f"-I{inc}/executorch/runtime/core/portable_type/c10",
            "-idirafter", str(torch_inc), *[str(HERE / s) for s in SOURCES],
            f"-L{lib}", *[f"-l{name}" for name in LINK], f"-Wl,-rpath,{lib}", "-o", str(out)]


def cache_key() -> str:
    return _cache_key("native-kernels", [(s, (HERE / s).read_bytes()) for s in SOURCES + HEADERS], version("executorch"),
               compile_flags(), LINK, platform.machine())


def build_kernels() -> Path:
    """The shared library for this source and wheel, compiled now if the cache has none."""

    def build(tmp: Path) -> dict:
        cmd = build_command(tmp / LIBRARY)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise ToolchainError(f"compiling the CPU runtime's kernels failed:\n{proc.stderr.strip()[-1500:]}",
                                 "check that g++ works (`apt-get install g++`) and the executorch wheel is the pinned one")
        return {"command": cmd}

    entry, _ = Cache().get_or_create("native-kernels", cache_key(), build)
    return entry / LIBRARY


def load_native_kernels() -> Path:
    """Build (if needed) and load our kernels into ExecuTorch's registry, once per process."""
    global _LOADED
    with _LOCK:
        if _LOADED is None:
            runtime()    # libexecutorch.so first
            path = build_kernels()
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise ToolchainError(f"the CPU runtime's kernels do not load: {e}",
                                     "remove the cache folder named above and retry (it is rebuilt)") from None
            _LOADED = path
        return _LOADED
