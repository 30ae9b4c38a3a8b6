"""Qualcomm's Genie runtime (`libGenie.so` inside the onnxruntime-qnn wheel) called from a child
process: its config parser (`GenieDialogConfig_createFromJson`), its dialog
(`GenieDialog_create`, `GenieDialog_tokenQuery`, `GenieDialog_embeddingTokenQuery`) and its
composable pipeline (`GeniePipeline_*`, `GenieNode_*`: encoder and text-generator nodes).

libGenie needs the wheel's libc++ on LD_LIBRARY_PATH when the process starts, so each call runs
`python -c` with that environment and reads one JSON line per event from it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

try:
    import onnxruntime_qnn
except ImportError:   # a broken install: said as a ToolchainError where its libraries are needed
    onnxruntime_qnn = None

from ..core.errors import ToolchainError, VerificationError

_CONFIG_CHILD = r"""
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
    if onnxruntime_qnn is None:
        raise ToolchainError("onnxruntime-qnn is not installed (it carries libGenie.so)", "run `make setup`")
    root = Path(onnxruntime_qnn.__file__).parent
    lib = root / "libGenie.so"
    if not lib.is_file():
        raise ToolchainError(f"{lib} is missing", "reinstall onnxruntime-qnn (make setup)")
    return lib, root.parent / "onnxruntime_qnn.libs"


def _env(lib: Path, libs: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), str(lib.parent), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def validate_genie_config(path: str | Path) -> dict[str, Any]:
    """{"status": 0, "accepted": True, "genie_api": ...} or VerificationError with Genie's message."""
    lib, libs = genie_library()
    proc = subprocess.run([sys.executable, "-c", _CONFIG_CHILD, str(lib), str(path)], capture_output=True, text=True, env=_env(lib, libs),
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


_DIALOG_CHILD = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
cfg = open(sys.argv[2], 'rb').read()
job = json.loads(sys.argv[3])
def say(**kw):
    print(json.dumps(kw), flush=True)
h = ctypes.c_void_p()
lib.GenieDialogConfig_createFromJson.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
rc = lib.GenieDialogConfig_createFromJson(cfg, ctypes.byref(h))
if rc != 0:
    say(event="config", status=rc); sys.exit(0)
d = ctypes.c_void_p()
lib.GenieDialog_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
rc = lib.GenieDialog_create(h, ctypes.byref(d))
say(event="dialog", status=rc)
if rc == 0 and job.get("lora"):
    # lora-version 1: the adapter's files (one float32 .raw per LoRA graph input) copied into the inputs
    lib.GenieDialog_applyLora.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    rc = lib.GenieDialog_applyLora(d, b"primary", job["lora"].encode())
    say(event="lora", status=rc)
if rc != 0 or not (job.get("tokens") or job.get("embeddings")):
    sys.exit(0)
lib.GenieDialog_setMaxNumTokens.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
lib.GenieDialog_reset.argtypes = [ctypes.c_void_p]
CB = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p)
turn = [0]
def on_tokens(p, n, code, user):
    if n:
        say(event="tokens", ids=[p[i] for i in range(n)], code=code, turn=turn[0])
cb = CB(on_tokens)
lib.GenieDialog_tokenQuery.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32,
                                       ctypes.c_int, CB, ctypes.c_void_p]
lib.GenieDialog_setMaxNumTokens(d, int(job["max_new_tokens"]))
if job.get("embeddings"):
    # float32 rows, one per prompt position; generated tokens are looked up in the config's table
    # (a NULL token-to-embedding callback: Genie's own LUT lookup)
    data = open(job["embeddings"], 'rb').read()
    lib.GenieDialog_embeddingTokenQuery.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int,
                                                    ctypes.c_void_p, CB, ctypes.c_void_p]
    rc = lib.GenieDialog_embeddingTokenQuery(d, data, len(data), 0, None, cb, None)
else:
    ids = job["tokens"]
    rc = lib.GenieDialog_tokenQuery(d, (ctypes.c_uint32 * len(ids))(*ids), len(ids), 0, cb, None)
say(event="query", status=rc)
for i, later in enumerate(job.get("then", []), 1):   # further turns, each after GenieDialog_reset
    turn[0] = i
    say(event="reset", status=lib.GenieDialog_reset(d), turn=i)
    lib.GenieDialog_setMaxNumTokens(d, int(later["max_new_tokens"]))
    ids = later["tokens"]
    rc = lib.GenieDialog_tokenQuery(d, (ctypes.c_uint32 * len(ids))(*ids), len(ids), 0, cb, None)
    say(event="query", status=rc, turn=i)
lib.GenieDialog_free.argtypes = [ctypes.c_void_p]
lib.GenieDialog_free(d)
"""


def run_dialog(config: dict, job: dict, timeout: float, on_event: Callable[[dict], None] | None = None
         ) -> tuple[dict[str, int], str]:
    """Genie's dialog on `config` (a dict) in a child: ({stage: status}, its stderr). `job` = {} only
    creates the dialog; {"tokens": [...], "max_new_tokens": n} also queries it, {"embeddings": a file
    of float32 rows, "max_new_tokens": n} queries it with embeddings; {"lora": NAME} applies that
    adapter of the config first (GenieDialog_applyLora); "then": [{"tokens", "max_new_tokens"}, ...]
    queries it again after a GenieDialog_reset each (their events carry "turn": 1, 2, ...). `on_event` sees each
    event ({"event": "tokens", "ids": [...]}, ...) as it comes."""
    with tempfile.TemporaryDirectory(prefix="modelexport-genie-") as d:
        path = Path(d) / "genie_config.json"
        path.write_text(json.dumps(config))
        return _stream_child(_DIALOG_CHILD, [str(path), json.dumps(job)], d, timeout, on_event, "dialog")


def _stream_child(code: str, args: list[str], cwd: str, timeout: float, on_event: Callable[[dict], None] | None,
                  what: str) -> tuple[dict[str, int], str]:
    """`python -c code libGenie.so *args` with the wheel's libraries on the path: ({event: status}
    of the JSON lines it prints, its stderr); `on_event` sees each event as it comes."""
    lib, libs = genie_library()
    status: dict[str, int] = {}
    with tempfile.TemporaryFile("w+") as err:   # a file, not a pipe: Genie may print more than a pipe holds
        proc = subprocess.Popen([sys.executable, "-c", code, str(lib), *args],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=_env(lib, libs), cwd=cwd)
        try:
            for line in proc.stdout:
                if line.startswith("{"):
                    event = json.loads(line)
                    if "status" in event:
                        status[event["event"]] = event["status"]
                    if on_event:
                        on_event(event)
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0:
        raise ToolchainError(f"Genie's {what} process died (exit {proc.returncode}): {genie_messages(stderr)}",
                             "run `modelexport doctor`; report it with the bundle's manifest")
    return status, stderr


def genie_messages(stderr: str) -> str:
    """Genie's own error lines (its INFO lines, the simulator's banner and affinity warnings dropped)."""
    keep = [ln.strip() for ln in stderr.splitlines()
            if ln.strip() and "LIBNATIVE" not in ln and "affinity" not in ln and "[INFO]" not in ln]
    return " | ".join(keep)[-1500:] or "no message"


# GenieNode_IOName_t (GenieNode.h). The token output is not in the header this code was written from:
# 4 is the value the wheel's library accepts for GenieNode_setTokenCallback on a text-generator
# (2, 3, 5, 6 are refused with "Attempted to set token callback on an unsupported output").
NODE_IO = {"generator.text_in": 0, "generator.embedding_in": 1, "generator.text_out": 2, "generator.token_out": 4,
           "text_encoder.text_in": 100, "text_encoder.embedding_out": 101,
           "image_encoder.image_in": 200, "image_encoder.embedding_out": 201}

_PIPELINE_CHILD = r"""
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[1])
job = json.load(open(sys.argv[2]))
def say(**kw):
    print(json.dumps(kw), flush=True)
def done():
    # straight out: the interpreter's teardown with live Genie handles segfaults (measured after a
    # built pipeline), and the process ends here anyway
    sys.stdout.flush()
    os._exit(0)
def step(event, rc):
    say(event=event, status=rc)
    if rc != 0:
        done()
P = ctypes.POINTER(ctypes.c_void_p)
lib.GeniePipelineConfig_createFromJson.argtypes = [ctypes.c_char_p, P]
lib.GenieNodeConfig_createFromJson.argtypes = [ctypes.c_char_p, P]
lib.GenieNode_create.argtypes = [ctypes.c_void_p, P]
lib.GeniePipeline_create.argtypes = [ctypes.c_void_p, P]
lib.GeniePipeline_addNode.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.GeniePipeline_connect.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
lib.GenieNode_setData.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
lib.GeniePipeline_execute.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
TOKENS = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p)
lib.GenieNode_setTokenCallback.argtypes = [ctypes.c_void_p, ctypes.c_int, TOKENS]
h = ctypes.c_void_p()
step("pipeline_config", lib.GeniePipelineConfig_createFromJson(json.dumps(job.get("pipeline", {})).encode(), ctypes.byref(h)))
pipe = ctypes.c_void_p()
step("pipeline", lib.GeniePipeline_create(h, ctypes.byref(pipe)))
nodes = {}
for name, cfg in job["nodes"].items():   # in order: the text-generator first (it sets up the accumulator)
    c, n = ctypes.c_void_p(), ctypes.c_void_p()
    step("node_config:" + name, lib.GenieNodeConfig_createFromJson(json.dumps(cfg).encode(), ctypes.byref(c)))
    step("node:" + name, lib.GenieNode_create(c, ctypes.byref(n)))
    nodes[name] = n
    step("add:" + name, lib.GeniePipeline_addNode(pipe, n))
for producer, pio, consumer, cio in job.get("connect", []):
    step("connect:" + producer, lib.GeniePipeline_connect(pipe, nodes[producer], pio, nodes[consumer], cio))
if not job.get("inputs"):
    done()
def on_tokens(p, n, code, user):
    if n:
        say(event="tokens", ids=[p[i] for i in range(n)], code=code)
cb = TOKENS(on_tokens)
gen, out_io = job["token_output"]
step("token_callback", lib.GenieNode_setTokenCallback(nodes[gen], out_io, cb))
keep = []
for i, (name, io, kind, value) in enumerate(job["inputs"]):   # in prompt order: each encoder appends its rows
    data = value.encode() if kind == "text" else open(value, "rb").read()
    buf = ctypes.create_string_buffer(data)   # NUL-terminated: Genie reads text as a C string
    keep.append(buf)
    step("set:%d:%s" % (i, name), lib.GenieNode_setData(nodes[name], io, buf, len(data), None))
step("execute", lib.GeniePipeline_execute(pipe, None))
done()
"""


def run_pipeline(job: dict, timeout: float, on_event: Callable[[dict], None] | None = None) -> tuple[dict[str, int], str]:
    """Genie's pipeline in a child: `job` = {"nodes": {name: node config}, in creation order,
    "connect": [[producer, io, consumer, io]], "inputs": [[node, io, "text" | "file", value]] in
    prompt order, "token_output": [generator, io]} → ({stage: status}, stderr). The child stops at
    the first stage Genie refuses (its status is the last one); without "inputs" it only builds."""
    with tempfile.TemporaryDirectory(prefix="modelexport-genie-") as d:
        path = Path(d) / "pipeline_job.json"
        path.write_text(json.dumps(job))
        return _stream_child(_PIPELINE_CHILD, [str(path)], d, timeout, on_event, "pipeline")
