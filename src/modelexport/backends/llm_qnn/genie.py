"""`genie_config.json` for Qualcomm's Genie runtime, checked by the real Genie config parser.

The config is written next to the context binaries (paths in it are relative to the bundle
folder: run `genie-t2t-run -c genie_config.json` from there). It is validated by
`GenieDialogConfig_createFromJson` of the `libGenie.so` inside the onnxruntime-qnn wheel, in a
child process (the library needs the wheel's libc++ on LD_LIBRARY_PATH at process start). A
config Genie rejects fails the compile; Genie's own message and status code are reported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...core.errors import ToolchainError, VerificationError


def genie_config(*, ctx_bins: list[str], tokenizer: str, context_size: int, vocab: int, bos: int | None,
                 eos: list[int], head_dim: int, n_threads: int = 3) -> dict[str, Any]:
    """`bos`: the id Genie puts before a conversation, None when the model's tokenizer adds none.

    Positions go in as `position_ids` ("absolute"): the graphs gather their RoPE tables themselves,
    computed from the HF model's own `inv_freq` and attention scaling, so llama3 / linear / yarn
    scaling is inside the graph and Genie needs no RoPE facts. With "rope", Genie would feed
    `position_ids_cos` / `_sin` inputs the graphs do not have ("Could not find I/O tensors")."""
    pe: dict[str, Any] = {"type": "absolute"}
    return {"dialog": {
        "version": 1,
        "type": "basic",
        "context": {"version": 1, "size": int(context_size), "n-vocab": int(vocab),
                    "bos-token": int(bos) if bos is not None else -1, "eos-token": [int(e) for e in eos] or [-1]},
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95},
        "tokenizer": {"version": 1, "path": tokenizer},
        "engine": {
            "version": 1,
            "n-threads": n_threads,
            "backend": {"version": 1, "type": "QnnHtp",
                        "QnnHtp": {"version": 1, "use-mmap": True, "spill-fill-bufsize": 0, "mmap-budget": 0,
                                   "poll": True, "cpu-mask": "0xe0", "kv-dim": int(head_dim),
                                   "allow-async-init": False}},
            "model": {"version": 1, "type": "binary",
                      "binary": {"version": 1, "ctx-bins": list(ctx_bins)},
                      "positional-encoding": pe},
        },
    }}


_CHILD = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
cfg = open(sys.argv[2], 'rb').read()
h = ctypes.c_void_p()
lib.GenieDialogConfig_createFromJson.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
lib.GenieDialogConfig_createFromJson.restype = ctypes.c_int32
rc = lib.GenieDialogConfig_createFromJson(cfg, ctypes.byref(h))
if rc == 0 and h.value:
    lib.GenieDialogConfig_free.argtypes = [ctypes.c_void_p]
    lib.GenieDialogConfig_free(h)
print(json.dumps({"status": rc}))
"""


def genie_library() -> tuple[Path, Path]:
    try:
        import onnxruntime_qnn
    except ImportError:
        raise ToolchainError("onnxruntime-qnn is not installed (it carries libGenie.so)", "run `make setup`") from None
    root = Path(onnxruntime_qnn.__file__).parent
    lib = root / "libGenie.so"
    if not lib.is_file():
        raise ToolchainError(f"{lib} is missing", "reinstall onnxruntime-qnn (make setup)")
    return lib, root.parent / "onnxruntime_qnn.libs"


def validate_genie_config(path: str | Path) -> dict[str, Any]:
    """{"status": 0, "accepted": True, "genie_api": ...} or VerificationError with Genie's message."""
    lib, libs = genie_library()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), str(lib.parent), env.get("LD_LIBRARY_PATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(lib), str(path)], capture_output=True, text=True, env=env,
                          timeout=120)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise ToolchainError(f"libGenie.so could not check {path} (exit {proc.returncode}): {proc.stderr.strip()[-300:]}",
                             "run `modelexport doctor`")
    status = json.loads(line)["status"]
    message = " ".join(x for x in (proc.stdout + proc.stderr).splitlines() if x and not x.startswith("{")
                       and "LIBNATIVE" not in x)[-500:]
    if status != 0:
        raise VerificationError(f"Genie rejects {Path(path).name} (GenieDialogConfig_createFromJson status {status}"
                                + (f": {message}" if message else "") + ")",
                                "this is a bug in the generated config; report it with the bundle's manifest")
    return {"accepted": True, "status": status, "library": str(lib)}


if __name__ == "__main__":  # python -m modelexport.backends.llm_qnn.genie CONFIG.json
    print(json.dumps(validate_genie_config(sys.argv[1])))
