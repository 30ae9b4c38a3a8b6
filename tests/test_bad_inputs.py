"""The bad-input corpus (issue 21): every verb and the Python API given what a user gets wrong.

Each case asserts: the documented exit code (core/errors.py), no traceback, a message with a fix
naming only verbs and flags that exist, nothing partial left in the output folder or the cache,
nothing written outside the case's own folder. The CLI runs in this process (its entry function,
`modelexport.cli.main.main`); only Ctrl-C and kill -9 need a real process. The tiny models and
the two real bundles are built once for the file (bad_inputs_world.py).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np
import pytest

from bad_inputs_world import World, build_world, check_fix, cli_vocabulary, partials, snapshot, tamper
from conftest import invoke

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INPUT, STRICT, INTEGRITY, BELOW, UNSUPPORTED, INTERRUPTED = 2, 3, 4, 5, 6, 130


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]           # {name} is a path of the world; {out} the case's output; {d} its folder
    code: int
    needles: tuple[str, ...] = ()
    prepare: Callable[[World, Path], dict] | None = None   # extra {names}, made in the case's folder


def C(id: str, argv: str | tuple, code: int = INPUT, *needles: str, prepare=None) -> Case:
    return Case(id, tuple(argv.split()) if isinstance(argv, str) else argv, code, needles, prepare)


# ---- set-ups that make something in the case's folder ------------------------------------------

def _existing_out(w, d):
    (d / "out").mkdir()
    (d / "out" / "keep.txt").write_text("mine")
    return {}


def _readonly_parent(w, d):
    if os.geteuid() == 0:              # root writes through permission bits: a folder nobody can write
        return {"ro": "/proc/self/modelexport-out"}
    ro = d / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    return {"ro": str(ro / "out")}


def _file_parent(w, d):
    (d / "afile").write_text("x")
    return {"fp": str(d / "afile" / "out")}


def _edit(fn):
    """A set-up giving {b}: a copy of the ONNX bundle whose manifest fn(m, folder) changed."""
    return lambda w, d: {"b": tamper(w["bundle"], d / "b", fn)}


def _edit_pte(fn):
    return lambda w, d: {"b": tamper(w["ptebundle"], d / "b", fn)}


def _set(path: str, value):
    def fn(m, folder):
        *keys, last = path.split(".")
        cur = m
        for k in keys:
            cur = cur[int(k)] if k.isdigit() else cur[k]
        cur[int(last) if last.isdigit() else last] = value
    return fn


def _del(path: str):
    def fn(m, folder):
        *keys, last = path.split(".")
        cur = m
        for k in keys:
            cur = cur[int(k)] if k.isdigit() else cur[k]
        del cur[int(last) if last.isdigit() else last]
    return fn


def _file_edit(role: str, how: str):
    """Change the bundle's file of a role: truncate, flip a byte, delete, or empty it."""
    def fn(m, folder):
        rel = next(f["path"] for f in m["files"] if f["role"] == role)
        p = folder / rel
        data = p.read_bytes()
        if how == "truncate":
            p.write_bytes(data[: len(data) // 2])
        elif how == "flip":
            p.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
        elif how == "delete":
            p.unlink()
        elif how == "empty":
            p.write_bytes(b"")
    return fn


def _manifest_text(text: str):
    def prep(w, d):
        b = d / "b"
        shutil.copytree(w["bundle"], b)
        (b / "manifest.json").write_text(text)
        return {"b": str(b)}
    return prep


def _no_manifest(w, d):
    b = d / "b"
    shutil.copytree(w["bundle"], b)
    (b / "manifest.json").unlink()
    return {"b": str(b)}


def _link_out(w, d):
    """A bundle whose file is a symlink to a file outside it (with that file's real sha)."""
    def fn(m, folder):
        rel = next(f["path"] for f in m["files"] if f["role"] == "float-model")
        outside = d / "outside.onnx"
        shutil.copyfile(folder / rel, outside)
        (folder / rel).unlink()
        os.symlink(outside, folder / rel)
    return {"b": tamper(w["bundle"], d / "b", fn)}


def _passwd(m, folder):
    import hashlib
    m["files"][0]["path"] = "../../../../../../etc/passwd"
    data = Path("/etc/passwd").read_bytes()
    m["files"][0]["sha256"], m["files"][0]["size"] = hashlib.sha256(data).hexdigest(), len(data)


def _keep_file(w, d):
    (d / "k").write_text("x")
    return {"k": str(d / "k")}


def _existing(name):
    def prep(w, d):
        (d / name).write_text("keep")
        return {}
    return prep


# ---- the table ----------------------------------------------------------------------------------

TARGETS = [C(f"targets-unknown-{i}", ("targets", t), INPUT, "unknown target")
           for i, t in enumerate(["SM9999", "8gen99", "snapdragon-99", "V75", "qcs", "  "])]
TARGETS += [C("targets-bad-flag", "targets --bogus", INPUT, "--bogus"),
            C("doctor-bad-flag", "doctor --bogus", INPUT),
            C("doctor-extra-arg", "doctor extra", INPUT),
            C("no-such-verb", "compiel x.onnx", INPUT),
            C("verb-without-args", "compile", INPUT)]

_BAD_FILES = ["empty.onnx", "garbage.onnx", "truncated.onnx", "html.onnx", "empty.pt2", "garbage.pt2",
              "empty.pte", "garbage.pte", "pte_magic", "empty.gguf", "garbage.gguf", "gguf_header",
              "empty.bin", "garbage.bin", "empty.txt", "garbage.txt", "empty.npy", "garbage.npy", "empty.json"]
INSPECT = [C(f"inspect-{f.replace('.', '-')}", ("inspect", "{" + f + "}"), INPUT) for f in _BAD_FILES]
INSPECT += [
    C("inspect-missing", "inspect {d}/nothing.onnx", INPUT, "does not exist"),
    C("inspect-empty-folder", "inspect {emptydir}", INPUT),
    C("inspect-no-manifest", "inspect {b}", INPUT, prepare=_no_manifest),
    C("inspect-manifest-garbage", "inspect {b}", INTEGRITY, prepare=_manifest_text("{not json")),
    C("inspect-manifest-empty", "inspect {b}", INTEGRITY, prepare=_manifest_text("")),
    C("inspect-manifest-list", "inspect {b}", INTEGRITY, prepare=_manifest_text("[1, 2]")),
    C("inspect-manifest-null", "inspect {b}", INTEGRITY, prepare=_manifest_text("null")),
    C("inspect-schema-99", "inspect {b}", INPUT, prepare=_edit(_set("schema_version", 99))),
    C("inspect-schema-string", "inspect {b}", INTEGRITY, prepare=_edit(_set("schema_version", "two"))),
    C("inspect-kind-unknown", "inspect {b}", INTEGRITY, prepare=_edit(_set("kind", "spaceship"))),
    C("inspect-format-unknown", "inspect {b}", INTEGRITY, prepare=_edit(_set("format", "tflite"))),
    C("inspect-files-not-list", "inspect {b}", INTEGRITY, prepare=_edit(_set("files", "all"))),
    C("inspect-path-passwd", "inspect {b}", INTEGRITY, prepare=_edit(_passwd)),
    C("inspect-path-absolute", "inspect {b}", INTEGRITY, prepare=_edit(_set("files.0.path", "/etc/hostname"))),
    C("inspect-graph-file-absolute", "inspect {b}", INTEGRITY, prepare=_edit(_set("graphs.0.file", "/etc/passwd"))),
    C("inspect-graph-file-climbs", "inspect {b}", INTEGRITY, prepare=_edit(_set("graphs.0.file", "../../x.bin"))),
    C("inspect-epcontext-climbs", "inspect {b}", INTEGRITY, prepare=_edit(_set("graphs.0.epcontext_model", "../m.onnx"))),
    C("inspect-part-file-climbs", "inspect {b}", INTEGRITY, prepare=_edit(_set("parts.0.files.float_model", "../../f.onnx"))),
    C("inspect-symlink-out", "inspect {b}", INTEGRITY, prepare=_link_out),
    C("inspect-wrong-sha", "inspect {b}", INTEGRITY, prepare=_edit(_set("files.0.sha256", "0" * 64))),
    C("inspect-wrong-size", "inspect {b}", INTEGRITY, prepare=_edit(_set("files.0.size", 1))),
    C("inspect-binary-truncated", "inspect {b}", INTEGRITY, prepare=_edit(_file_edit("context-binary", "truncate"))),
    C("inspect-binary-flipped", "inspect {b}", INTEGRITY, prepare=_edit(_file_edit("context-binary", "flip"))),
    C("inspect-binary-deleted", "inspect {b}", INTEGRITY, prepare=_edit(_file_edit("context-binary", "delete"))),
    C("inspect-binary-emptied", "inspect {b}", INTEGRITY, prepare=_edit(_file_edit("context-binary", "empty"))),
    C("inspect-float-deleted", "inspect {b}", INTEGRITY, prepare=_edit(_file_edit("float-model", "delete"))),
    C("inspect-pte-flipped", "inspect {b}", INTEGRITY, prepare=_edit_pte(lambda m, f: _file_edit(m["files"][0]["role"], "flip")(m, f))),
    C("inspect-pte-deleted", "inspect {b}", INTEGRITY, prepare=_edit_pte(lambda m, f: _file_edit(m["files"][0]["role"], "delete")(m, f))),
    C("inspect-bad-flag", "inspect {bundle} --schema nope --bogus", INPUT),
]

_C = ("compile", "{onnx}", "-o", "{out}")
_CR = _C + ("--calibration", "random")
COMPILE = [C(f"compile-model-{f.replace('.', '-')}", ("compile", "{" + f + "}", "-o", "{out}", "--calibration", "random"), INPUT)
           for f in ["empty.onnx", "garbage.onnx", "truncated.onnx", "html.onnx", "empty.pt2", "garbage.pt2",
                     "empty.gguf", "garbage.gguf", "gguf_header", "empty.yaml", "garbage.yaml", "garbage.npy", "garbage.bin"]]
COMPILE += [
    C("compile-missing", "compile {d}/nothing.onnx -o {out} --calibration random", INPUT, "does not exist"),
    C("compile-folder-not-model", "compile {emptydir} -o {out} --calibration random", INPUT),
    C("compile-dynamic", "compile {dyn} -o {out} --calibration random", INPUT, "--input-shape"),
    C("compile-shape-unknown-name", "compile {dyn} -o {out} --calibration random --input-shape nope=1,3,16,16", INPUT, "nope"),
    C("compile-shape-no-equals", "compile {dyn} -o {out} --calibration random --input-shape 1,3,16,16", INPUT),
    C("compile-shape-letters", "compile {dyn} -o {out} --calibration random --input-shape x=a,b,c,d", INPUT),
    C("compile-shape-empty", "compile {dyn} -o {out} --calibration random --input-shape x=", INPUT),
    C("compile-shape-rank", "compile {dyn} -o {out} --calibration random --input-shape x=1,3", INPUT),
    C("compile-shape-zero", "compile {dyn} -o {out} --calibration random --input-shape x=0,3,16,16", INPUT),
    C("compile-shape-negative", "compile {dyn} -o {out} --calibration random --input-shape x=-1,3,16,16", INPUT),
    C("compile-shape-static-mismatch", "compile {onnx} -o {out} --calibration random --input-shape x=1,3,32,32", INPUT),
]
COMPILE += [C(f"compile-target-{i}", _CR + ("--target", t), INPUT, "unknown target")
            for i, t in enumerate(["SM9999", "8gen99", "v75", "", "SM8650,SM9999"])]
COMPILE += [C(f"compile-precision-{p}", _CR + ("-p", p), INPUT, "precision")
            for p in ["3a3w", "int3", "fp8", "8a4w", "", "16A4W_BLOCKY"]]
COMPILE += [
    C("compile-onnx-16a4w_block", _CR + ("-p", "16a4w_block"), INPUT, "PyTorch"),
    C("compile-onnx-lpbq-alias", _CR + ("-p", "lpbq"), INPUT, "PyTorch"),
    C("compile-onnx-format-pte", _CR + ("--format", "pte"), INPUT, "PyTorch"),
    C("compile-onnx-format-unknown", _CR + ("--format", "tflite"), INPUT, "unknown format"),
    C("compile-onnx-block-size", _CR + ("--block-size", "32"), INPUT, "--block-size"),
    C("compile-onnx-rewrite", _CR + ("--rewrite", "causal-mask"), INPUT, "--rewrite"),
    C("compile-onnx-fallback", _CR + ("--fallback", "portable"), INPUT, "--fallback"),
    C("compile-onnx-variants", _CR + ("--variants", "ar1"), INPUT, "--variants"),
    C("compile-onnx-max-seq-len", _CR + ("--max-seq-len", "128"), INPUT),
    C("compile-vtcm-too-big", _CR + ("--vtcm-mb", "64"), INPUT, "VTCM"),
    C("compile-vtcm-zero", _CR + ("--vtcm-mb", "0"), INPUT, "--vtcm-mb"),
    C("compile-vtcm-negative", _CR + ("--vtcm-mb", "-2"), INPUT, "--vtcm-mb"),
    C("compile-vtcm-text", _CR + ("--vtcm-mb", "lots"), INPUT),
    C("compile-opt-0", _CR + ("-O", "0"), INPUT, "optimization"),
    C("compile-opt-4", _CR + ("-O", "4"), INPUT, "optimization"),
    C("compile-opt-negative", _CR + ("-O", "-1"), INPUT, "optimization"),
    C("compile-jobs-zero", _CR + ("--jobs", "0"), INPUT, "--jobs"),
    C("compile-jobs-negative", _CR + ("--jobs", "-3"), INPUT, "--jobs"),
    C("compile-no-calibration", _C, INPUT, "calibration"),
    C("compile-cal-missing", _C + ("--calibration", "{d}/nothere"), INPUT, "does not exist"),
    C("compile-cal-empty-folder", _C + ("--calibration", "{cal_empty}"), INPUT),
    C("compile-cal-garbage-npy", _C + ("--calibration", "{cal_garbage}"), INPUT),
    C("compile-cal-shape", _C + ("--calibration", "{cal_shape}"), INPUT, "shape"),
    C("compile-cal-dtype", _C + ("--calibration", "{cal_dtype}"), INPUT, "dtype"),
    C("compile-cal-int", _C + ("--calibration", "{cal_int}"), INPUT, "dtype"),
    C("compile-cal-raw-size", _C + ("--calibration", "{cal_raw}"), INPUT, "bytes"),
    C("compile-cal-npz-names", _C + ("--calibration", "{wrongnames.npz}"), INPUT, "x"),
    C("compile-cal-npz-none", _C + ("--calibration", "{none.npz}"), INPUT),
    C("compile-cal-npz-garbage", _C + ("--calibration", "{garbage.npz}"), INPUT),
    C("compile-cal-npz-empty", _C + ("--calibration", "{empty.npz}"), INPUT),
    C("compile-cal-npy-object", _C + ("--calibration", "{object.npy}"), INPUT),
    C("compile-cal-npy-truncated", _C + ("--calibration", "{truncated.npy}"), INPUT),
    C("compile-cal-npy-shape", _C + ("--calibration", "{shape.npy}"), INPUT, "shape"),
    C("compile-cal-list-missing", _C + ("--calibration", "{list_missing}"), INPUT, "does not exist"),
    C("compile-cal-list-empty", _C + ("--calibration", "{list_empty}"), INPUT),
    C("compile-cal-list-two", _C + ("--calibration", "{list_two}"), INPUT),
    C("compile-cal-list-badname", _C + ("--calibration", "{list_badname}"), INPUT),
    C("compile-cal-list-comment", _C + ("--calibration", "{list_comment}"), INPUT),
    C("compile-cal-list-garbage", _C + ("--calibration", "{list_garbage}"), INPUT),
    C("compile-cal-unknown-kind", _C + ("--calibration", "{garbage.yaml}"), INPUT),
    C("compile-existing-output", _CR, INPUT, "already exists", prepare=_existing_out),
    C("compile-output-readonly", ("compile", "{onnx}", "-o", "{ro}", "--calibration", "random"), INPUT, "not writable",
      prepare=_readonly_parent),
    C("compile-output-under-file", ("compile", "{onnx}", "-o", "{fp}", "--calibration", "random"), INPUT, prepare=_file_parent),
    C("compile-override-bad-regex", _CR + ("--override", "(=16a8w"), INPUT, "regular expression"),
    C("compile-override-no-equals", _CR + ("--override", "features"), INPUT, "REGEX=PRECISION"),
    C("compile-override-unknown-precision", _CR + ("--override", "block=3a3w"), INPUT, "precision"),
    C("compile-override-empty", _CR + ("--override", "=16a8w"), INPUT),
    C("compile-override-matches-nothing", _CR + ("--override", "nothing_here=16a8w"), INPUT, "nothing_here"),
    C("compile-override-fp16", _CR + ("-p", "fp16", "--override", "block=16a8w"), INPUT),
    C("compile-strict-fallback", ("compile", "{det}", "-o", "{out}", "--calibration", "random", "--strict"), STRICT, "CPU"),
    C("compile-two-kinds", ("compile", "{onnx}", "{mlp}", "-o", "{out}", "--calibration", "random"), INPUT, "kinds"),
    C("compile-output-is-the-model", ("compile", "{onnx}", "-o", "{onnx}", "--calibration", "random"), INPUT, "already exists"),
    C("compile-pipe-garbage", "compile {pipe_garbage} -o {out}", INPUT, "YAML"),
    C("compile-pipe-empty", "compile {pipe_empty} -o {out}", INPUT),
    C("compile-pipe-noparts", "compile {pipe_noparts} -o {out}", INPUT, "parts"),
    C("compile-pipe-list", "compile {pipe_list} -o {out}", INPUT, "parts"),
    C("compile-pipe-nomodel", "compile {pipe_nomodel} -o {out}", INPUT, "model"),
    C("compile-pipe-unknownkey", "compile {pipe_unknownkey} -o {out}", INPUT, "colour"),
    C("compile-pipe-missingmodel", "compile {pipe_missingmodel} -o {out}", INPUT, "does not exist"),
    C("compile-pipe-badprec", "compile {pipe_badprec} -o {out}", INPUT, "precision"),
    C("compile-pipe-blockprec", "compile {pipe_blockprec} -o {out}", INPUT, "PyTorch"),
    C("compile-pipe-badtarget", "compile {pipe_badtarget} -o {out}", INPUT, "unknown target"),
    C("compile-pipe-parts-str", "compile {pipe_parts_str} -o {out}", INPUT),
    C("compile-pipe-json-garbage", "compile {pipe_json_garbage} -o {out}", INPUT, "JSON"),
    C("compile-pipe-mixed-kinds", "compile {pipe_mixed} -o {out}", INPUT),
    C("compile-no-output-flag", "compile {onnx} --calibration random", INPUT, "--output"),
]

_Q = ("compile-qnn", "{onnx}")
COMPILE_QNN = [
    C("qnn-backend-gpu", _Q + ("{out}", "--backend", "GPU"), UNSUPPORTED, "HTP"),
    C("qnn-backend-cpu", _Q + ("{out}", "--backend", "CPU"), UNSUPPORTED, "HTP"),
    C("qnn-backend-dsp", _Q + ("{out}", "--backend", "DSP"), UNSUPPORTED, "HTP"),
    C("qnn-act-7", _Q + ("{out}", "--quantize", "--act-bitwidth", "7", "-c", "random"), INPUT, "bitwidth"),
    C("qnn-weights-3", _Q + ("{out}", "--quantize", "--weights-bitwidth", "3", "-c", "random"), INPUT, "bitwidth"),
    C("qnn-act-32", _Q + ("{out}", "--quantize", "--act-bitwidth", "32", "--weights-bitwidth", "8", "-c", "random"), INPUT),
    C("qnn-device-unknown", _Q + ("{out}", "--device", "Snapdragon 99 Gen 9"), INPUT, "unknown target"),
    C("qnn-format-pte", _Q + ("{out}", "--format", "pte"), INPUT, "PyTorch"),
    C("qnn-format-unknown", _Q + ("{out}", "--format", "qnnx"), INPUT, "unknown format"),
    C("qnn-precision-block", _Q + ("{out}", "-p", "16a4w_block"), INPUT, "PyTorch"),
    C("qnn-bin-two-devices", _Q + ("{d}/m_ctx.bin", "--device", "SM8650", "--device", "SM8750"), INPUT, "one target"),
    C("qnn-bin-exists", _Q + ("{d}/m_ctx.bin",), INPUT, "already exists", prepare=_existing("m_ctx.bin")),
    C("qnn-quantize-no-calibration", _Q + ("{out}", "--quantize"), INPUT, "calibration"),
    C("qnn-missing-model", ("compile-qnn", "{d}/nothing.onnx", "{out}"), INPUT, "does not exist"),
    C("qnn-garbage-model", ("compile-qnn", "{garbage.onnx}", "{out}"), INPUT),
    C("qnn-opt-9", _Q + ("{out}", "-O", "9"), INPUT, "optimization"),
]

_T = ("compile", "{mlp}", "-o", "{out}")
TORCH = [C(f"torch-user-{n}", ("compile", "{py_" + n + "}", "-o", "{out}", "-p", "fp16"), INPUT, *nd) for n, nd in [
    ("raises", ("raises.py:build raised RuntimeError", "weights file w.bin")),
    ("nested", ("nested.py:build raised KeyError", "nested.py:2 in load")),
    ("import_error", ("not_a_module_anywhere_xyz",)),
    ("toplevel", ("ZeroDivisionError",)),
    ("syntax", ("syntax error",)),
    ("none", ("NoneType",)),
    ("not_module", ("int",)),
    ("no_inputs", ("example inputs",)),
    ("bad_inputs", ("str",)),
    ("wrong_arity", ()),
    ("wrong_shape", ()),
    ("data_dependent", ("data-dependent", "module")),
    ("takes_args", ("TypeError",)),
    ("not_callable", ("no function",)),
]]
TORCH += [
    C("torch-user-sysexit", ("compile", "{py_sysexit}", "-o", "{out}"), INPUT, "SystemExit"),
    C("torch-no-function", ("compile", "{d}/m.py:build", "-o", "{out}"), INPUT, "does not exist"),
    C("torch-no-colon-function", ("audit", "{mlp}x"), INPUT),
    C("torch-pt2-dynamic", "compile {dyn.pt2} -o {out}", INPUT, "dynamic", "torch.export.export"),
    C("torch-audit-pt2-dynamic", "audit {dyn.pt2}", INPUT, "dynamic"),
    C("torch-pt2-empty-audit", "audit {empty.pt2}", INPUT, "torch.export"),
    C("torch-pt2-garbage-audit", "audit {garbage.pt2}", INPUT, "torch.export"),
]
TORCH += [C(f"torch-block-size-{b}", _T + ("-p", "16a4w_block", "--block-size", b, "--calibration", "random"), INPUT, "--block-size")
          for b in ["7", "0", "-16", "15", "33", "1000000"]]
TORCH += [
    C("torch-block-size-divides-none", _T + ("-p", "16a4w_block", "--block-size", "48", "--calibration", "random"), INPUT, "divides"),
    C("torch-block-size-text", _T + ("-p", "16a4w_block", "--block-size", "big"), INPUT),
    C("torch-block-size-without-block", _T + ("-p", "8a8w", "--block-size", "32", "--calibration", "random"), INPUT, "16a4w_block"),
    C("torch-format-dlc", _T + ("--format", "dlc"), INPUT, "ONNX"),
    C("torch-format-context-binary", _T + ("--format", "context-binary"), INPUT, "ONNX"),
    C("torch-precision-unknown", _T + ("-p", "5a5w"), INPUT, "precision"),
    C("torch-rewrite-unknown", _T + ("--rewrite", "make-it-fast"), INPUT, "make-it-fast"),
    C("torch-fallback-unknown", _T + ("--fallback", "gpu"), INPUT, "gpu"),
    C("torch-override-bad-regex", _T + ("-p", "8a8w", "--calibration", "random", "--override", "[=16a8w"), INPUT),
    C("torch-override-precision", _T + ("-p", "8a8w", "--calibration", "random", "--override", "fc1=9a9w"), INPUT),
    C("torch-target-unknown", _T + ("--target", "SM1234"), INPUT, "unknown target"),
    C("torch-v68-block", _T + ("--target", "SM8350", "-p", "16a4w_block", "--calibration", "random"), INPUT),
    C("torch-cal-shape", _T + ("-p", "8a8w", "--calibration", "{mlpshape.npy}"), INPUT, "shape"),
    C("torch-cal-dtype", _T + ("-p", "8a8w", "--calibration", "{mlpdtype.npy}"), INPUT, "dtype"),
    C("torch-cal-missing", _T + ("-p", "8a8w", "--calibration", "{d}/none"), INPUT, "does not exist"),
    C("torch-input-shape", _T + ("--input-shape", "x=1,8,64"), INPUT),
    C("torch-variants", _T + ("--variants", "ar1"), INPUT, "--variants"),
    C("torch-existing-output", _T, INPUT, "already exists", prepare=_existing_out),
]

_A = ("audit", "{onnx}")
AUDIT = [
    C("audit-missing", "audit {d}/nothing.onnx", INPUT, "does not exist"),
    C("audit-garbage", "audit {garbage.onnx}", INPUT),
    C("audit-truncated", "audit {truncated.onnx}", INPUT),
    C("audit-empty", "audit {empty.onnx}", INPUT),
    C("audit-target", _A + ("--target", "SM0001"), INPUT, "unknown target"),
    C("audit-precision", _A + ("-p", "2a2w"), INPUT, "precision"),
    C("audit-precision-block", _A + ("-p", "16a4w_block"), INPUT, "PyTorch"),
    C("audit-dynamic-strict", "audit {dyn} --strict", STRICT, "CPU"),
    C("audit-onnx-block-size", _A + ("--block-size", "32"), INPUT),
    C("audit-onnx-rewrite", _A + ("--rewrite", "causal-mask"), INPUT),
    C("audit-strict", "audit {det} --strict", STRICT, "CPU"),
    C("audit-log-unwritable", _A + ("--log", "/proc/nope/log.txt"), INPUT),
    C("audit-torch-raises", "audit {py_raises}", INPUT, "raises.py:build raised"),
    C("audit-torch-block-7", ("audit", "{mlp}", "-p", "16a4w_block", "--block-size", "7"), INPUT, "--block-size"),
    C("audit-torch-rewrite", ("audit", "{mlp}", "--rewrite", "nope"), INPUT, "nope"),
    C("audit-gguf-garbage", "audit {garbage.gguf}", INPUT),
    C("audit-bundle", "audit {bundle}", INPUT),
]

_R = ("run", "{bundle}")
RUN = [
    C("run-missing", "run {d}/nothing", INPUT, "does not exist"),
    C("run-empty-folder", "run {emptydir} --random", INPUT),
    C("run-model-not-bundle", "run {onnx} --random", INPUT),
    C("run-no-inputs", _R, INPUT, "--random"),
    C("run-shape", _R + ("--input", "{shape.npy}"), INPUT, "shape"),
    C("run-dtype", _R + ("--input", "{dtype.npy}"), INPUT, "dtype"),
    C("run-int", _R + ("--input", "{int.npy}"), INPUT, "dtype"),
    C("run-rank", _R + ("--input", "{rank.npy}"), INPUT, "shape"),
    C("run-scalar", _R + ("--input", "{scalar.npy}"), INPUT, "shape"),
    C("run-empty-array", _R + ("--input", "{emptyarr.npy}"), INPUT, "shape"),
    C("run-name", _R + ("--input", "y={good.npy}"), INPUT, "unknown input"),
    C("run-missing-file", _R + ("--input", "{d}/none.npy"), INPUT, "does not exist"),
    C("run-garbage-npy", _R + ("--input", "{garbage.npy}"), INPUT, "numpy"),
    C("run-empty-npy", _R + ("--input", "{empty.npy}"), INPUT, "numpy"),
    C("run-object-npy", _R + ("--input", "{object.npy}"), INPUT, "numpy"),
    C("run-truncated-npy", _R + ("--input", "{truncated.npy}"), INPUT, "numpy"),
    C("run-npz-names", _R + ("--input", "{wrongnames.npz}"), INPUT, "image"),
    C("run-npz-none", _R + ("--input", "{none.npz}"), INPUT, "missing input"),
    C("run-npz-garbage", _R + ("--input", "{garbage.npz}"), INPUT),
    C("run-two-inputs-one-graph", _R + ("--input", "{good.npy}", "--input", "{good.npz}"), INPUT),
    C("run-repeat-0", _R + ("--random", "--repeat", "0"), INPUT, "--repeat"),
    C("run-repeat-negative", _R + ("--random", "--repeat", "-5"), INPUT, "--repeat"),
    C("run-repeat-text", _R + ("--random", "--repeat", "many"), INPUT),
    C("run-part", _R + ("--random", "--part", "nope"), INPUT, "nope"),
    C("run-target-not-in-bundle", _R + ("--random", "--target", "SM8750"), INPUT, "SM8750"),
    C("run-target-unknown", _R + ("--random", "--target", "SM0000"), INPUT),
    C("run-perf-profile", _R + ("--random", "--perf-profile", "warp"), INPUT, "warp"),
    C("run-output-exists", _R + ("--random", "--output", "{k}"), INPUT, "already exists", prepare=_keep_file),
    C("run-tampered-binary", "run {b} --random", INTEGRITY, prepare=_edit(_file_edit("context-binary", "flip"))),
    C("run-tampered-passwd", "run {b} --random", INTEGRITY, prepare=_edit(_passwd)),
    C("run-tampered-epcontext-abs", "run {b} --random", INTEGRITY, prepare=_edit(_set("graphs.0.epcontext_model", "/etc/passwd"))),
    C("run-manifest-garbage", "run {b} --random", INTEGRITY, prepare=_manifest_text("{{{")),
    C("run-garbage-pte", "run {garbage.pte} --random", INPUT),
    C("run-empty-pte", "run {empty.pte} --random", INPUT),
    C("run-pte-shape", ("run", "{ptebundle}", "--input", "{mlpshape.npy}"), INPUT, "shape"),
    C("run-pte-dtype", ("run", "{ptebundle}", "--input", "{mlpdtype.npy}"), INPUT, "dtype"),
    C("run-pte-repeat-0", ("run", "{ptebundle}", "--random", "--repeat", "0"), INPUT, "--repeat"),
    C("run-pte-part", ("run", "{ptebundle}", "--random", "--part", "nope"), INPUT, "nope"),
    C("run-pte-tampered", "run {b} --random", INTEGRITY, prepare=_edit_pte(lambda m, f: _file_edit(m["files"][0]["role"], "flip")(m, f))),
    C("run-bare-pte-wrong-input", ("run", "{pte}", "--input", "{shape.npy}"), INPUT, "shape"),
]

_V = ("verify", "{bundle}")
VERIFY = [
    C("verify-missing", "verify {d}/nothing", INPUT, "does not exist"),
    C("verify-shape", _V + ("--input", "{shape.npy}"), INPUT, "shape"),
    C("verify-dtype", _V + ("--input", "{dtype.npy}"), INPUT, "dtype"),
    C("verify-name", _V + ("--input", "y={good.npy}"), INPUT, "unknown input"),
    C("verify-rank", _V + ("--input", "{rank.npy}"), INPUT, "shape"),
    C("verify-garbage-npy", _V + ("--input", "{garbage.npy}"), INPUT, "numpy"),
    C("verify-npz-names", _V + ("--input", "{wrongnames.npz}"), INPUT),
    C("verify-min-sqnr-nan", _V + ("--min-sqnr", "nan"), INPUT, "--min-sqnr"),
    C("verify-min-sqnr-inf", _V + ("--min-sqnr", "inf"), INPUT, "--min-sqnr"),
    C("verify-min-sqnr-text", _V + ("--min-sqnr", "high"), INPUT),
    C("verify-samples-0", _V + ("--samples", "0"), INPUT, "--samples"),
    C("verify-samples-negative", _V + ("--samples", "-1"), INPUT, "--samples"),
    C("verify-threshold-nan", _V + ("--per-layer", "--threshold-db", "nan"), INPUT, "--threshold-db"),
    C("verify-part", _V + ("--part", "nope"), INPUT, "nope"),
    C("verify-target", _V + ("--target", "SM8750"), INPUT, "SM8750"),
    C("verify-report-exists", _V + ("--report", "{k}"), INPUT, "already exists", prepare=_keep_file),
    C("verify-tampered-float", "verify {b}", INTEGRITY, prepare=_edit(_file_edit("float-model", "flip"))),
    C("verify-tampered-binary", "verify {b}", INTEGRITY, prepare=_edit(_file_edit("context-binary", "truncate"))),
    C("verify-float-climbs", "verify {b}", INTEGRITY, prepare=_edit(_set("parts.0.files.float_model", "../../etc/passwd"))),
    C("verify-verify-inputs-deleted", "verify {b}", INTEGRITY, prepare=_edit(_file_edit("verify-inputs", "delete"))),
    C("verify-bare-pte", "verify {pte}", INPUT, "bundle"),
    C("verify-pte-shape", ("verify", "{ptebundle}", "--input", "{mlpshape.npy}"), INPUT, "shape"),
    C("verify-pte-samples-0", ("verify", "{ptebundle}", "--samples", "0"), INPUT, "--samples"),
    C("verify-pte-min-sqnr-nan", ("verify", "{ptebundle}", "--min-sqnr", "nan"), INPUT, "--min-sqnr"),
]

_P = ("profile", "{bundle}")
PROFILE = [
    C("profile-missing", "profile {d}/nothing", INPUT, "does not exist"),
    C("profile-runs-0", _P + ("--runs", "0"), INPUT, "--runs"),
    C("profile-runs-negative", _P + ("--runs", "-2"), INPUT, "--runs"),
    C("profile-level", _P + ("--level", "verbose"), INPUT, "verbose"),
    C("profile-keep-file", _P + ("--keep", "{k}"), INPUT, "--keep", prepare=_keep_file),
    C("profile-shape", _P + ("--input", "{shape.npy}"), INPUT, "shape"),
    C("profile-dtype", _P + ("--input", "{dtype.npy}"), INPUT, "dtype"),
    C("profile-trace-exists", _P + ("--trace", "{k}"), INPUT, "already exists", prepare=_keep_file),
    C("profile-top-negative", _P + ("--top", "-1"), INPUT, "--top"),
    C("profile-part", _P + ("--part", "nope"), INPUT, "nope"),
    C("profile-tampered", "profile {b}", INTEGRITY, prepare=_edit(_file_edit("context-binary", "flip"))),
    C("profile-pte-shape", ("profile", "{ptebundle}", "--input", "{mlpshape.npy}"), INPUT, "shape"),
    C("profile-pte-runs-0", ("profile", "{ptebundle}", "--runs", "0"), INPUT, "--runs"),
]

def _hf_shards(how: str):
    """{hf}: a tiny Llama HF folder saved in 4 shards, one of them deleted or truncated (a download cut short)."""
    def prepare(w, d):
        from llm_tiny import tiny_llama, tiny_tokenizer
        hf = d / "hf"
        tiny_llama().save_pretrained(hf, max_shard_size="100KB")
        tiny_tokenizer().save(hf)
        shard = sorted(hf.glob("model-*.safetensors"))[2]
        if how == "delete":
            shard.unlink()
        else:
            shard.write_bytes(shard.read_bytes()[:-64])
        return {"hf": str(hf)}
    return prepare


def _gguf_unlike_header(**broken):
    """{gg}: a tiny Llama GGUF whose tensors do not match its header (write_tiny_gguf's drop / stated)."""
    def prepare(w, d):
        from test_llm_frontends import write_tiny_gguf
        return {"gg": str(write_tiny_gguf(d / "broken.gguf", **broken))}
    return prepare


_GG_BROKEN = {"layer-missing": ({"stated": {"block_count": 3}}, "states 3 layers"),
              "tensor-missing": ({"drop": "blk.1.ffn_down.weight"}, "lacks blk.1.ffn_down.weight"),
              "width-wrong": ({"stated": {"embedding_length": 96}}, "embedding_length 96")}


_G = ("generate", "{garbage.gguf}", "-p", "hi")
GENERATE = [
    C("generate-missing", ("generate", "{d}/none.gguf", "-p", "hi"), INPUT, "does not exist"),
    C("generate-garbage-gguf", _G, INPUT),
    C("generate-empty-gguf", ("generate", "{empty.gguf}", "-p", "hi"), INPUT),
    C("generate-truncated-gguf", ("generate", "{gguf_header}", "-p", "hi"), INPUT),
    C("generate-onnx", ("generate", "{onnx}", "-p", "hi"), INPUT),
    C("generate-onnx-bundle", ("generate", "{bundle}", "-p", "hi"), INPUT),
    C("generate-pte-bundle", ("generate", "{ptebundle}", "-p", "hi"), INPUT),
    C("generate-empty-folder", ("generate", "{emptydir}", "-p", "hi"), INPUT),
    C("generate-no-prompt", ("generate", "{garbage.gguf}"), INPUT, "--prompt"),
    C("generate-blank-prompt", ("generate", "{garbage.gguf}", "-p", "   "), INPUT, "--prompt"),
    C("generate-temperature-negative", _G + ("--temperature", "-1"), INPUT, "--temperature"),
    C("generate-temperature-nan", _G + ("--temperature", "nan"), INPUT, "--temperature"),
    C("generate-temperature-inf", _G + ("--temperature", "inf"), INPUT, "--temperature"),
    C("generate-top-k-negative", _G + ("--top-k", "-1"), INPUT, "--top-k"),
    C("generate-top-p-2", _G + ("--top-p", "2"), INPUT, "--top-p"),
    C("generate-top-p-0", _G + ("--top-p", "0"), INPUT, "--top-p"),
    C("generate-top-p-nan", _G + ("--top-p", "nan"), INPUT, "--top-p"),
    C("generate-rep-penalty-0", _G + ("--repetition-penalty", "0"), INPUT, "--repetition-penalty"),
    C("generate-rep-penalty-nan", _G + ("--repetition-penalty", "nan"), INPUT, "--repetition-penalty"),
    C("generate-max-new-negative", _G + ("--max-new-tokens", "-1"), INPUT, "--max-new-tokens"),
    C("generate-prompt-lookup-negative", _G + ("--prompt-lookup", "-1"), INPUT, "--prompt-lookup"),
    C("generate-prompt-lookup-too-many", _G + ("--prompt-lookup", "65"), INPUT, "--prompt-lookup", "64"),
    C("generate-ngram-zero", _G + ("--prompt-lookup", "4", "--ngram", "0"), INPUT, "--ngram"),
    C("generate-prompt-lookup-sampling", _G + ("--prompt-lookup", "4", "--temperature", "0.7"), INPUT, "greedy"),
    C("generate-prompt-lookup-cpu", _G + ("--prompt-lookup", "4"), INPUT, "only the last token's", "--backend htp-sim"),
    C("generate-max-new-zero", _G + ("--max-new-tokens", "0"), INPUT, "--max-new-tokens"),
    C("generate-max-seq-len-zero", _G + ("--max-seq-len", "0"), INPUT, "--max-seq-len"),
    C("generate-threads-zero", _G + ("--threads", "0"), INPUT, "--threads"),
    C("generate-backend", _G + ("--backend", "gpu"), INPUT, "gpu"),
    C("generate-quant", _G + ("--quant", "2bit"), INPUT, "2bit"),
    C("generate-tokenizer-missing", _G + ("--tokenizer", "{d}/tok.json"), INPUT),
    *[C(f"generate-gguf-{k}", ("generate", "{gg}", "-p", "hi", "--max-seq-len", "64"), INPUT, needle,
        prepare=_gguf_unlike_header(**broken)) for k, (broken, needle) in _GG_BROKEN.items()],
    *[C(f"compile-llm-gguf-{k}", ("compile", "{gg}", "--max-seq-len", "64", "-o", "{out}"), INPUT, needle,
        prepare=_gguf_unlike_header(**broken)) for k, (broken, needle) in _GG_BROKEN.items()],
    C("generate-hf-shard-missing", ("generate", "{hf}", "-p", "hi", "--max-seq-len", "64"), INPUT,
      "lacks 1 of the 4 weight shards", prepare=_hf_shards("delete")),
    C("generate-hf-shard-truncated", ("generate", "{hf}", "-p", "hi", "--max-seq-len", "64"), INPUT,
      "truncated", prepare=_hf_shards("truncate")),
    C("compile-llm-hf-shard-missing", ("compile", "{hf}", "--max-seq-len", "64", "-o", "{out}"), INPUT,
      "lacks 1 of the 4 weight shards", prepare=_hf_shards("delete")),
    C("compile-llm-hf-shard-truncated", ("compile", "{hf}", "--max-seq-len", "64", "-o", "{out}"), INPUT,
      "truncated", prepare=_hf_shards("truncate")),
]

EVAL = [
    C("eval-missing", "eval {d}/none.gguf", INPUT, "does not exist"),
    C("eval-garbage-gguf", "eval {garbage.gguf}", INPUT),
    C("eval-onnx-bundle", "eval {bundle}", INPUT),
    C("eval-onnx", "eval {onnx}", INPUT),
    C("eval-stages", "eval {garbage.gguf} --stages warp", INPUT, "warp"),
    C("eval-window-1", "eval {garbage.gguf} --window 1", INPUT, "--window"),
    C("eval-tokens-0", "eval {garbage.gguf} --tokens 0", INPUT, "--tokens"),
    C("eval-text-missing", "eval {garbage.gguf} --perplexity {d}/none.txt", INPUT),
    C("eval-quant", "eval {garbage.gguf} --stages cpu --quant 3bit", INPUT),
    C("eval-hf-shard-missing", ("eval", "{hf}", "--max-seq-len", "64"), INPUT,
      "lacks 1 of the 4 weight shards", prepare=_hf_shards("delete")),
]

REPORT = [
    C("report-missing", "report {d}/nothing", INPUT, "does not exist"),
    C("report-empty-folder", "report {emptydir}", INPUT),
    C("report-model", "report {onnx}", INPUT),
    C("report-tampered", "report {b}", INTEGRITY, prepare=_edit(_set("files.0.sha256", "f" * 64))),
    C("report-manifest-garbage", "report {b}", INTEGRITY, prepare=_manifest_text("garbage")),
    C("report-output-exists", "report {bundle} --output {k}", INPUT, "already exists", prepare=_keep_file),
]

def _matrix(text: str):
    """A sweep matrix file in the case's folder ({onnx} is the world's model)."""
    def prepare(w, d):
        (d / "m.yaml").write_text(text.replace("{onnx}", w.paths["onnx"]))
        return {"m": str(d / "m.yaml")}
    return prepare


def _garbage_results(w, d):
    """A folder that looks like a sweep's, with a results.json that is not one."""
    (d / "sw").mkdir()
    (d / "sw" / "results.json").write_text('{"cells": 3}')
    return {}


_GOOD_MATRIX = "models: ['{onnx}']\ntargets: [SM8650]\nprecisions: [fp16]\n"
_S = ("sweep", "{m}", "-o", "{out}")
SWEEP = [
    C("report-sweep-results-garbage", "report {d}/sw", INPUT, "not a sweep's results file", prepare=_garbage_results),
    C("sweep-matrix-missing", "sweep {d}/none.yaml -o {out}", INPUT, "does not exist"),
    C("sweep-matrix-garbage", _S, INPUT, "not valid YAML", prepare=_matrix("models: [a\n  targets: ][")),
    C("sweep-matrix-not-mapping", _S, INPUT, "not a mapping", prepare=_matrix("- a.onnx\n- b.onnx\n")),
    C("sweep-matrix-empty-lists", _S, INPUT, "no `models:` list", "no `targets:` list", "no `precisions:` list",
      prepare=_matrix("models: []\ntargets: []\nprecisions: []\n")),
    C("sweep-matrix-every-problem", _S, INPUT, "4 problems", "unknown key 'colour'", "unknown target 'SM9999'",
      "unknown precision '9a9w'", "'none.onnx' does not exist",
      prepare=_matrix("models: ['{onnx}', none.onnx]\ntargets: [SM8650, SM9999]\nprecisions: [fp16, 9a9w]\ncolour: red\n")),
    C("sweep-matrix-option", _S, INPUT, "unknown option 'colour'",
      prepare=_matrix("models: [{path: '{onnx}', options: {colour: red}}]\ntargets: [SM8650]\nprecisions: [fp16]\n")),
    C("sweep-matrix-ppl-ratio", _S, INPUT, "max_ppl_ratio",
      prepare=_matrix("models: ['{onnx}']\ntargets: [SM8650]\nprecisions: [{name: fp16, max_ppl_ratio: 0.5}]\n")),
    C("sweep-matrix-same-name", _S, INPUT, "taken by another model",
      prepare=_matrix("models: ['{onnx}', '{onnx}']\ntargets: [SM8650]\nprecisions: [fp16]\n")),
    C("sweep-output-foreign", _S, INPUT, "not a sweep's output",
      prepare=lambda w, d: {**_matrix(_GOOD_MATRIX)(w, d), **_existing_out(w, d)}),
    C("sweep-workers-0", _S + ("--workers", "0"), INPUT, "--workers", prepare=_matrix(_GOOD_MATRIX)),
    C("sweep-ray-not-an-address", _S + ("--ray", "nowhere"), INPUT, "not a Ray address", prepare=_matrix(_GOOD_MATRIX)),
    C("sweep-ray-unreachable", _S + ("--ray", "127.0.0.1:9"), INPUT, "cannot reach a Ray cluster", "nothing was started",
      prepare=_matrix(_GOOD_MATRIX)),
]

CASES = TARGETS + INSPECT + COMPILE + COMPILE_QNN + TORCH + AUDIT + RUN + VERIFY + PROFILE + GENERATE + EVAL + REPORT + SWEEP


# ---- the Python API ------------------------------------------------------------------------------

def _api(fn: Callable[[World, Path], Any], code: int = INPUT, *needles: str) -> tuple:
    return fn, code, needles


def _module(w, d):
    import torch
    return torch.nn.Linear(4, 4)


API = {
    "api-compile-unknown-option": _api(lambda w, d: __import__("modelexport").compile(w["onnx"], output=d / "o", calibration="random", colour="red"), INPUT, "colour"),
    "api-compile-torch-option-on-onnx": _api(lambda w, d: __import__("modelexport").compile(w["onnx"], output=d / "o", calibration="random", block_size=32), INPUT, "block"),
    "api-compile-target": _api(lambda w, d: __import__("modelexport").compile(w["onnx"], output=d / "o", target="SM0", calibration="random"), INPUT, "unknown target"),
    "api-compile-targets-list": _api(lambda w, d: __import__("modelexport").compile(w["onnx"], output=d / "o", target=["SM8650", "nope"], calibration="random"), INPUT),
    "api-compile-precision": _api(lambda w, d: __import__("modelexport").compile(w["onnx"], output=d / "o", precision="int2", calibration="random"), INPUT, "precision"),
    "api-compile-block-onnx": _api(lambda w, d: __import__("modelexport").compile(w["onnx"], output=d / "o", precision="16a4w_block", calibration="random"), INPUT, "PyTorch"),
    "api-compile-not-a-model": _api(lambda w, d: __import__("modelexport").compile(42, output=d / "o"), INPUT),
    "api-compile-none": _api(lambda w, d: __import__("modelexport").compile(None, output=d / "o"), INPUT),
    "api-compile-dict": _api(lambda w, d: __import__("modelexport").compile({"model": 1}, output=d / "o"), INPUT),
    "api-compile-module-no-inputs": _api(lambda w, d: __import__("modelexport").compile(_module(w, d), output=d / "o"), INPUT, "example"),
    "api-compile-module-text-inputs": _api(lambda w, d: __import__("modelexport").compile(_module(w, d), ("x",), output=d / "o"), INPUT),
    "api-compile-existing": _api(lambda w, d: (d / "o").mkdir() or __import__("modelexport").compile(w["onnx"], output=d / "o", calibration="random"), INPUT, "already exists"),
    "api-compile-user-raises": _api(lambda w, d: __import__("modelexport").compile(w.paths["py_raises"], output=d / "o"), INPUT, "raises.py:build raised"),
    "api-compile-block-7": _api(lambda w, d: __import__("modelexport").compile(w.paths["mlp"], output=d / "o", precision="16a4w_block", block_size=7, calibration="random"), INPUT, "--block-size"),
    "api-compile-calibration-missing": _api(lambda w, d: __import__("modelexport").compile(w["onnx"], output=d / "o", calibration=str(d / "none")), INPUT),
    "api-audit-unknown-option": _api(lambda w, d: __import__("modelexport").audit(w["onnx"], colour="red"), INPUT, "colour"),
    "api-audit-target": _api(lambda w, d: __import__("modelexport").audit(w["onnx"], target="SM1"), INPUT, "unknown target"),
    "api-audit-block-onnx": _api(lambda w, d: __import__("modelexport").audit(w["onnx"], precision="16a4w_block"), INPUT, "PyTorch"),
    "api-run-repeat-0": _api(lambda w, d: __import__("modelexport").run(w["bundle"], random=True, repeat=0), INPUT, "--repeat"),
    "api-run-shape": _api(lambda w, d: __import__("modelexport").run(w["bundle"], inputs={"x": np.ones((1, 3, 8, 8), np.float32)}), INPUT, "shape"),
    "api-run-name": _api(lambda w, d: __import__("modelexport").run(w["bundle"], inputs={"y": np.ones((1, 3, 16, 16), np.float32)}), INPUT, "unknown input"),
    "api-run-missing": _api(lambda w, d: __import__("modelexport").run(d / "none", random=True), INPUT, "does not exist"),
    "api-verify-nan": _api(lambda w, d: __import__("modelexport").verify(w["bundle"], min_sqnr=float("nan")), INPUT, "--min-sqnr"),
    "api-verify-samples": _api(lambda w, d: __import__("modelexport").verify(w["bundle"], max_samples=-1), INPUT, "--samples"),
    "api-inspect-missing": _api(lambda w, d: __import__("modelexport").inspect(d / "none.onnx"), INPUT, "does not exist"),
    "api-inspect-garbage": _api(lambda w, d: __import__("modelexport").inspect(w["garbage.onnx"]), INPUT),
    "api-qnncompiler-backend": _api(lambda w, d: __import__("modelexport").QNNCompiler(backend="GPU").compile(w["onnx"], output_format="context-binary"), UNSUPPORTED),
    "api-qnncompiler-format": _api(lambda w, d: __import__("modelexport").QNNCompiler(backend="HTP").compile(w["onnx"], output_format="tflite"), INPUT),
    "api-qnncompiler-format-pte": _api(lambda w, d: __import__("modelexport").QNNCompiler(backend="HTP").compile(w["onnx"], output_format="pte"), INPUT, "PyTorch"),
    "api-qnncompiler-device": _api(lambda w, d: __import__("modelexport").QNNCompiler(backend="HTP").compile(w["onnx"], output_format="context-binary", target_device="snapdragon-99"), INPUT),
    "api-qnncompiler-bits": _api(lambda w, d: __import__("modelexport").QNNCompiler(backend="HTP").compile(w["onnx"], quantization={"enabled": True, "calibration_data": "random", "act_bitwidth": 5, "weights_bitwidth": 8}), INPUT),
    "api-sweep-unknown-option": _api(lambda w, d: __import__("modelexport").sweep(w["onnx"], d / "o", colour="red"), INPUT, "colour"),
    "api-sweep-not-a-matrix": _api(lambda w, d: __import__("modelexport").sweep(w["garbage.yaml"], d / "o"), INPUT, "YAML"),
    "api-llm-load-missing": _api(lambda w, d: __import__("modelexport").llm.load(d / "none.gguf"), INPUT, "does not exist"),
    "api-llm-load-garbage": _api(lambda w, d: __import__("modelexport").llm.load(w["garbage.gguf"]), INPUT),
    "api-llm-load-option": _api(lambda w, d: __import__("modelexport").llm.load(w["garbage.gguf"], colour="red"), INPUT, "colour"),
}


# ---- running them ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return build_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def vocabulary():
    return cli_vocabulary()


def _cache_dir() -> Path:
    return Path(os.environ["MODELEXPORT_CACHE_DIR"])


def _case_dir(tmp_path: Path, world: World, case_id: str, prepare) -> tuple[Path, dict]:
    d = tmp_path / "case"
    d.mkdir()
    extra = {"d": str(d), "out": str(d / "out")}
    if prepare:
        extra.update(prepare(world, d))
    return d, extra


def _assert_left_clean(world: World, before: dict, d: Path, before_case: set[str]) -> None:
    assert snapshot(world.root) == before, "a bad input changed the world's files"
    left = partials(d, world.root, _cache_dir())
    assert not left, f"partials left behind: {left}"
    made = {str(p.relative_to(d)) for p in d.rglob("*")} - before_case
    assert not made, f"written although the input was bad: {sorted(made)}"


def _restore_permissions(d: Path) -> None:
    for p in d.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli(case: Case, world: World, vocabulary, tmp_path, capfd, monkeypatch):
    d, extra = _case_dir(tmp_path, world, case.id, case.prepare)
    monkeypatch.chdir(d)
    names = {**world.paths, **extra}
    argv = [re.sub(r"\{([^{}]+)\}", lambda m: names[m.group(1)], a) for a in case.argv]
    before, before_case = snapshot(world.root), {str(p.relative_to(d)) for p in d.rglob("*")}
    try:
        rc, crash = invoke(argv)
        out, err = capfd.readouterr()
        text = out + err + crash
        assert rc == case.code, f"exit {rc}, wanted {case.code}: modelexport {' '.join(argv)}\n{text}"
        assert "Traceback" not in text, text
        for n in case.needles:
            assert n.lower() in text.lower(), f"{n!r} not in:\n{text}"
        check_fix(text, *vocabulary)
        _assert_left_clean(world, before, d, before_case)
    finally:
        _restore_permissions(d)


@pytest.mark.parametrize("case_id", list(API))
def test_api(case_id: str, world: World, tmp_path, monkeypatch):
    from modelexport.core.errors import ModelExportError
    fn, code, needles = API[case_id]
    d = tmp_path / "case"
    d.mkdir()
    monkeypatch.chdir(d)
    before = snapshot(world.root)
    with pytest.raises(ModelExportError) as info:
        fn(world, d)
    e = info.value
    assert e.exit_code == code, f"{type(e).__name__} exit {e.exit_code}, wanted {code}: {e}"
    assert e.fix, f"no fix: {e}"
    for n in needles:
        assert n.lower() in str(e).lower(), str(e)
    assert snapshot(world.root) == before
    assert not partials(d, world.root, _cache_dir())
    assert (not [p for p in d.iterdir() if p.name != "o"] and not (d / "o").exists()) or case_id == "api-compile-existing"


def test_corpus_size():
    """The troubleshooting guide states the corpus's size; keep both in step."""
    n = len(CASES) + len(API) + len(PROCESS_CASES)
    assert len({c.id for c in CASES}) == len(CASES)
    assert n >= 250
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "troubleshooting.md").read_text()
    assert f"{n} bad inputs" in " ".join(guide.split()), f"docs/guide/troubleshooting.md should say '{n} bad inputs'"


# ---- the few that need a real process ------------------------------------------------------------

def _spawn(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "modelexport", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, start_new_session=True, env=os.environ.copy(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(pred: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


class _Output:
    """A child's stdout and stderr, read as they come (so a test can act on a progress line)."""

    def __init__(self, p: subprocess.Popen):
        self.chunks: list[bytes] = []
        self.readers = [threading.Thread(target=self._read, args=(f,), daemon=True) for f in (p.stdout, p.stderr)]
        for t in self.readers:
            t.start()

    def _read(self, f) -> None:
        for line in iter(f.readline, b""):
            self.chunks.append(line)

    def text(self) -> str:
        return b"".join(self.chunks).decode()

    def close(self) -> str:
        for t in self.readers:
            t.join(timeout=120)
        return self.text()


def _ctrl_c_compile(world: World, d: Path, args: list[str], at_line: str | None = None) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once the compile has
    made its partial bundle, or once it prints the progress line `at_line` (a stage long enough to
    land in): the message, exit 130, no partial and no bundle left."""
    out = d / "out"
    for _attempt in range(3):   # the partial can be renamed into place just as the signal is sent: try again
        p = _spawn(["compile", *args, "-o", str(out), "--no-cache"], d)
        output = _Output(p)
        started = ((lambda: at_line in output.text()) if at_line else (lambda: bool(list(d.glob(".out.partial-*")))))
        _wait_for(lambda: started() or p.poll() is not None, 120)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=120)
        text = output.close()
        if p.returncode != 0:
            break
        shutil.rmtree(out, ignore_errors=True)   # finished before the signal landed
    assert p.returncode == INTERRUPTED, text
    assert "interrupted: nothing was written" in text and "partial" in text, text
    assert "Traceback" not in text, text
    assert not out.exists() and not partials(d), list(d.iterdir())


def _ctrl_c_onnx(world: World, d: Path) -> None:
    """The small model's partial bundle lives for a few milliseconds before its rename, too short to land a
    signal in three tries on a quick host: interrupt once quantization starts (about a second before the end)."""
    _ctrl_c_compile(world, d, [world.paths["onnx"], "--calibration", "random"], at_line="quantizing")


def _ctrl_c_torch(world: World, d: Path) -> None:
    """The .pte's bundle folder lives for a tenth of a second: interrupt during the QNN lowering."""
    _ctrl_c_compile(world, d, [world.paths["mlp"], "-p", "8a8w", "--calibration", "random"], at_line="lowering to QNN")


def _kill9_then_next_use_cleans(world: World, d: Path) -> None:
    """A partial cache entry left by kill -9 is removed when the cache is next used; one whose
    entry lock is held (a live compile) is not."""
    from filelock import FileLock
    cache = Path(os.environ["MODELEXPORT_CACHE_DIR"])
    p = _spawn(["compile", world.paths["onnx"], "-o", str(d / "out"), "--calibration", "random", "--jobs", "1",
                "-O", "2"], d)
    killed = _wait_for(lambda: bool(partials(cache)), 120)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    assert killed, "the compile made no cache partial to kill it in"
    stale = partials(cache)
    live_key = cache / "test-ns" / "ab" / "abcdef"
    live_key.parent.mkdir(parents=True, exist_ok=True)
    live = live_key.parent / ".abcdef.partial-0badc0de"
    live.mkdir()
    with FileLock(str(live_key) + ".lock"):
        q = subprocess.run([sys.executable, "-m", "modelexport", "compile", world.paths["onnx"], "-o", str(d / "out2"),
                            "--calibration", "random", "--jobs", "1"], capture_output=True, text=True, cwd=d)
        assert q.returncode == 0, q.stderr
        assert live.exists(), "a live build's partial was removed"
    assert not [s for s in stale if s.exists()], f"stale partials kept: {stale}"
    shutil.rmtree(live)


PROCESS_CASES = {"ctrl-c-onnx-compile": _ctrl_c_onnx, "ctrl-c-torch-compile": _ctrl_c_torch,
                 "kill-9-cache-partial-cleaned": _kill9_then_next_use_cleans}


@pytest.mark.parametrize("case_id", list(PROCESS_CASES))
def test_process(case_id: str, world: World, tmp_path):
    PROCESS_CASES[case_id](world, tmp_path)
