"""Read a QNN context binary through the real libQnnSystem.so.

The library parses the binary (`QnnSystemContext_getMetadata`, or the older `getBinaryInfo`) and
hands back a `QnnSystemContext_BinaryInfo_t`; decode.py copies what it says into plain dataclasses
before the library's memory is freed. Nothing here scrapes strings out of the file. EPContext
models (ONNX Runtime) are read through the binary their nodes name or hold.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from ...core.errors import InputError, ToolchainError
from ..qairt import find_qairt, preload_runtime_libs
from . import structs as S
from .decode import ContextBinaryInfo, decode_binary_info

BinarySource = Union[str, os.PathLike, bytes, bytearray, memoryview]

_NOT_A_BINARY_FIX = ("pass a QNN context binary: the *_ctx_qnn.bin ONNX Runtime writes next to an "
                     "EPContext model, or the output of qnn-context-binary-generator; for an "
                     "EPContext .onnx use extract_from_epcontext()")


# ------------------------------------------------------------------------------------------------
# The library
# ------------------------------------------------------------------------------------------------
_LOCK = threading.Lock()


@dataclass(frozen=True)
class _System:
    lib: ctypes.CDLL
    iface: S.QnnSystemInterface_t
    provider: str
    api_version: str
    path: Path


@functools.lru_cache(maxsize=1)
def _system() -> _System:
    q = find_qairt()
    path = q.lib("system")
    preload_runtime_libs(q.extra_lib_dirs)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise ToolchainError(f"cannot load {path}: {e}",
                             "reinstall onnxruntime-qnn (make setup) or fix QNN_SDK_ROOT") from None
    get = lib.QnnSystemInterface_getProviders
    get.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.POINTER(S.QnnSystemInterface_t))),
                    ctypes.POINTER(ctypes.c_uint32)]
    get.restype = S.Qnn_ErrorHandle_t
    providers = ctypes.POINTER(ctypes.POINTER(S.QnnSystemInterface_t))()
    count = ctypes.c_uint32(0)
    rc = get(ctypes.byref(providers), ctypes.byref(count))
    if rc != S.QNN_SUCCESS or count.value == 0:
        raise ToolchainError(f"{path} offers no QNN system interface (error {S.error_code(rc)})",
                             "the library is broken or not libQnnSystem.so; reinstall onnxruntime-qnn")
    # All providers share the system-context calls this module uses (API major 1); take the first
    # that has them.
    for i in range(count.value):
        iface = providers[i].contents
        if iface.systemApiVersion.major == 1 and iface.impl.systemContextCreate and iface.impl.systemContextFree:
            return _System(lib, iface, (iface.providerName or b"").decode(), str(iface.systemApiVersion), path)
    raise ToolchainError(f"{path} has no system-context interface of API version 1.x",
                         "use the libQnnSystem.so of the same QAIRT as libQnnHtp.so")


def system_library_info() -> dict[str, str]:
    """Which libQnnSystem.so is used, and its provider and API version."""
    s = _system()
    return {"path": str(s.path), "provider": s.provider, "api_version": s.api_version}


def _error_name(rc: int) -> str:
    code = S.error_code(rc)
    return f"{S.SYSTEM_CONTEXT_ERRORS.get(code, 'error')} ({code})"


def _read_address(addr: int, size: int, sha: str) -> ContextBinaryInfo:
    """Ask the library about `size` bytes at address `addr` and copy out its answer.

    The caller keeps the memory alive; only the integer address travels here, so an exception's
    traceback never pins the caller's buffer (a mapped file can still be closed).
    """
    s = _system()
    impl = s.iface.impl
    with _LOCK:
        handle = ctypes.c_void_p()
        rc = impl.systemContextCreate(ctypes.byref(handle))
        if rc != S.QNN_SUCCESS:
            raise ToolchainError(f"libQnnSystem could not create a system context: {_error_name(rc)}",
                                 "reinstall onnxruntime-qnn (make setup) or fix QNN_SDK_ROOT")
        try:
            info_p = ctypes.POINTER(S.QnnSystemContext_BinaryInfo_t)()
            if impl.systemContextGetMetaData:
                call = "QnnSystemContext_getMetadata"
                rc = impl.systemContextGetMetaData(handle, addr, size, ctypes.byref(info_p))
            else:
                call = "QnnSystemContext_getBinaryInfo"
                info_size = ctypes.c_uint64(0)
                rc = impl.systemContextGetBinaryInfo(handle, addr, size, ctypes.byref(info_p),
                                                     ctypes.byref(info_size))
            if rc != S.QNN_SUCCESS or not info_p:
                raise InputError(
                    f"not a QNN context binary this QAIRT can read: libQnnSystem ({s.provider} "
                    f"{s.api_version}) answered {_error_name(rc)}", _NOT_A_BINARY_FIX)
            info = decode_binary_info(info_p.contents, size, sha)
            info.reader = f"{call} ({s.provider} {s.api_version})"
            return info
        finally:
            impl.systemContextFree(handle)


def read_context_binary(source: BinarySource) -> ContextBinaryInfo:
    """What a QNN context binary holds, as libQnnSystem.so reads it.

    `source` is a path or the binary's bytes. Raises InputError for anything that is not a
    context binary (with the library's own verdict), ToolchainError if the library is missing.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise InputError("the context binary is empty (0 bytes)", _NOT_A_BINARY_FIX)
        # c_char_p points into the bytes object itself (no copy); `data` outlives the call.
        addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
        return _read_address(addr, len(data), hashlib.sha256(data).hexdigest())

    path = Path(source)
    if not path.exists():
        raise InputError(f"no such file: {path}", "check the path of the context binary")
    if path.is_dir():
        raise InputError(f"{path} is a folder, not a context binary", _NOT_A_BINARY_FIX)
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"{path} is empty (0 bytes), not a context binary", _NOT_A_BINARY_FIX)
    with open(path, "rb") as f:
        # Copy-on-write map: the library parses in place; a multi-GB binary is not read into RAM.
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        sha = hashlib.sha256(mm).hexdigest()
        buf = (ctypes.c_char * size).from_buffer(mm)
        try:
            info = _read_address(ctypes.addressof(buf), size, sha)
        except InputError as e:
            if path.suffix.lower() == ".onnx":
                raise InputError(f"{path} is an ONNX model, not a QNN context binary",
                                 "use extract_from_epcontext() for an EPContext model") from None
            raise InputError(f"{path}: {e.problem}", e.fix) from None
        finally:
            del buf
        info.path = str(path)
        return info
    finally:
        mm.close()


# ------------------------------------------------------------------------------------------------
# EPContext models (ONNX Runtime)
# ------------------------------------------------------------------------------------------------
@dataclass
class EpContextNode:
    name: str
    source: str | None
    embed_mode: int
    main_context: int
    partition_name: str | None
    ep_sdk_version: str | None
    cache_path: str | None            # embed mode 0: the file the attribute names, resolved
    embedded_size: int | None         # embed mode 1: bytes held in the attribute


def _epcontext_nodes(onnx_path: Path):
    import onnx
    if not onnx_path.is_file():
        raise InputError(f"no such file: {onnx_path}", "check the path of the EPContext model")
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and friends
        raise InputError(f"{onnx_path} is not a readable ONNX model: {e}",
                         "pass the *_ctx.onnx model ONNX Runtime wrote with ep.context_enable=1") from None
    out = []
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        def get(name, default=None):
            return onnx.helper.get_attribute_value(attrs[name]) if name in attrs else default
        def text(name):
            v = get(name)
            return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
        embed = int(get("embed_mode", 1))
        raw = get("ep_cache_context", b"")
        meta = EpContextNode(name=node.name, source=text("source"), embed_mode=embed,
                             main_context=int(get("main_context", 1)), partition_name=text("partition_name"),
                             ep_sdk_version=text("ep_sdk_version"), cache_path=None, embedded_size=None)
        if embed == 0:
            rel = raw.decode("utf-8", errors="replace")
            target = (onnx_path.parent / rel).resolve()
            if Path(rel).is_absolute() or onnx_path.parent.resolve() not in (target, *target.parents):
                raise InputError(f"EPContext node {node.name!r} names {rel!r}, outside the model's folder",
                                 "keep the context binary next to the EPContext model (a relative name)")
            meta.cache_path = str(target)
        else:
            meta.embedded_size = len(raw)
        out.append((meta, raw))
    return out


def find_epcontext_nodes(onnx_path: str | os.PathLike) -> list[EpContextNode]:
    """The EPContext nodes of an ONNX model and where their binaries are."""
    return [meta for meta, _ in _epcontext_nodes(Path(onnx_path))]


def extract_from_epcontext(onnx_path: str | os.PathLike) -> ContextBinaryInfo:
    """Read the QNN context binary an EPContext model references.

    Embed mode 0: the node's `ep_cache_context` is a file name relative to the model; embed mode 1:
    it holds the binary itself. Several nodes may share one binary (weight sharing); a model whose
    nodes name different binaries is refused (read each with read_context_binary).
    """
    onnx_path = Path(onnx_path)
    nodes = [(m, raw) for m, raw in _epcontext_nodes(onnx_path) if m.main_context]
    if not nodes:
        raise InputError(f"{onnx_path} has no EPContext node holding a context",
                         "compile the model with ep.context_enable=1 and pass the *_ctx.onnx it writes")
    keys = {m.cache_path if m.embed_mode == 0 else hashlib.sha256(raw).hexdigest() for m, raw in nodes}
    if len(keys) > 1:
        raise InputError(f"{onnx_path} references {len(keys)} different context binaries",
                         "read them one by one: find_epcontext_nodes() then read_context_binary()")
    meta, raw = nodes[0]
    if meta.embed_mode == 0:
        if not Path(meta.cache_path).is_file():
            raise InputError(f"{onnx_path} references {meta.cache_path}, which does not exist",
                             "keep the *_ctx_qnn.bin next to the EPContext model it belongs to")
        info = read_context_binary(meta.cache_path)
    else:
        if not raw:
            raise InputError(f"EPContext node {meta.name!r} in {onnx_path} holds no binary", None)
        info = read_context_binary(raw)
    info.referenced_by = [m.name for m, _ in nodes]
    return info
