"""What the bad-input corpus (test_bad_inputs.py) runs against: tiny real models and bundles built
once per module, corrupt files of every kind, and the checks run on each case."""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

from et_models import MLP
from onnx_models import conv_det, conv_relu

PARTIAL = re.compile(r"\.(partial|old)-[0-9a-f]{8}$")


@dataclass
class World:
    root: Path                         # everything the cases read; none may change it
    paths: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Path:
        return Path(self.paths[key])


def _write(p: Path, data: bytes | str) -> str:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def build_world(root: Path) -> World:
    """Models, two real bundles (ONNX context binary, PyTorch .pte) and bad files of every kind."""
    import modelexport
    w = World(root)
    P = w.paths
    P["onnx"] = str(conv_relu(root / "conv.onnx"))
    P["dyn"] = str(conv_relu(root / "dyn.onnx", dynamic=True))
    P["det"] = str(conv_det(root / "det.onnx"))
    P["mlp"] = _write(root / "mlp.py", MLP) + ":build"
    good = Path(P["onnx"]).read_bytes()
    rng = np.random.default_rng(0)
    for ext in ("onnx", "pt2", "pte", "gguf", "bin", "npy", "npz", "yaml", "json", "txt"):
        P[f"empty.{ext}"] = _write(root / "bad" / f"empty.{ext}", b"")
        P[f"garbage.{ext}"] = _write(root / "bad" / f"garbage.{ext}", rng.bytes(3000))
    P["truncated.onnx"] = _write(root / "bad" / "truncated.onnx", good[: len(good) // 2])
    P["html.onnx"] = _write(root / "bad" / "html.onnx", "<html>not a model</html>")
    P["gguf_header"] = _write(root / "bad" / "header.gguf", b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 16)
    P["pte_magic"] = _write(root / "bad" / "magic.pte", b"\x00\x00\x00\x00ET12" + rng.bytes(200))
    # numpy inputs of the conv model (x: 1x3x16x16 float32) and wrong ones
    (root / "in").mkdir()
    np.save(root / "in" / "good.npy", np.ones((1, 3, 16, 16), np.float32))
    P["good.npy"] = str(root / "in" / "good.npy")
    for name, arr in {"shape": np.ones((1, 3, 8, 8), np.float32), "dtype": np.ones((1, 3, 16, 16), np.float64),
                      "int": np.ones((1, 3, 16, 16), np.int64), "rank": np.ones((3, 16, 16), np.float32),
                      "scalar": np.float32(1.0), "emptyarr": np.zeros((0,), np.float32),
                      "mlpshape": np.ones((1, 8, 32), np.float32), "mlpdtype": np.ones((1, 8, 64), np.float64)}.items():
        np.save(root / "in" / f"{name}.npy", arr)
        P[f"{name}.npy"] = str(root / "in" / f"{name}.npy")
    np.save(root / "in" / "object.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    P["object.npy"] = str(root / "in" / "object.npy")
    P["truncated.npy"] = _write(root / "in" / "truncated.npy", Path(P["good.npy"]).read_bytes()[:100])
    np.savez(root / "in" / "wrongnames.npz", image=np.ones((1, 3, 16, 16), np.float32))
    P["wrongnames.npz"] = str(root / "in" / "wrongnames.npz")
    np.savez(root / "in" / "none.npz")
    P["none.npz"] = str(root / "in" / "none.npz")
    np.savez(root / "in" / "good.npz", x=np.ones((1, 3, 16, 16), np.float32))
    P["good.npz"] = str(root / "in" / "good.npz")
    # calibration folders and input lists
    for name, arr in {"cal_shape": np.ones((1, 3, 8, 8), np.float32), "cal_dtype": np.ones((1, 3, 16, 16), np.float64),
                      "cal_int": np.ones((1, 3, 16, 16), np.int32)}.items():
        (root / name).mkdir()
        np.save(root / name / "s0.npy", arr)
        P[name] = str(root / name)
    (root / "cal_empty").mkdir()
    P["cal_empty"] = str(root / "cal_empty")
    (root / "cal_garbage").mkdir()
    _write(root / "cal_garbage" / "s0.npy", rng.bytes(500))
    P["cal_garbage"] = str(root / "cal_garbage")
    (root / "cal_raw").mkdir()
    _write(root / "cal_raw" / "s0.raw", np.ones(100, np.float32).tobytes())
    P["cal_raw"] = str(root / "cal_raw")
    P["list_missing"] = _write(root / "lists" / "missing.txt", "nothere.raw\n")
    P["list_empty"] = _write(root / "lists" / "empty.txt", "")
    P["list_two"] = _write(root / "lists" / "two.txt", f"{P['good.npy']} {P['good.npy']}\n")
    P["list_badname"] = _write(root / "lists" / "badname.txt", f"nope:={P['good.npy']}\n")
    P["list_comment"] = _write(root / "lists" / "comment.txt", "# only a comment\n")
    P["list_garbage"] = _write(root / "lists" / "garbage.txt", rng.bytes(200).replace(b"\n", b" ").decode("latin-1"))
    # pipelines
    pipe = root / "pipes"
    P["pipe_garbage"] = _write(pipe / "garbage.yaml", "parts: [ {name: a, model: \n  - ]]]")
    P["pipe_empty"] = _write(pipe / "empty.yaml", "")
    P["pipe_noparts"] = _write(pipe / "noparts.yaml", "targets: [SM8650]\n")
    P["pipe_list"] = _write(pipe / "list.yaml", "- a\n- b\n")
    P["pipe_nomodel"] = _write(pipe / "nomodel.yaml", "parts:\n  - {name: a, precision: 8a8w}\n")
    P["pipe_unknownkey"] = _write(pipe / "unknownkey.yaml", f"parts:\n  - {{name: a, model: {P['onnx']}, colour: red}}\n")
    P["pipe_missingmodel"] = _write(pipe / "missingmodel.yaml", "parts:\n  - {name: a, model: nothere.onnx, calibration: random}\n")
    P["pipe_badprec"] = _write(pipe / "badprec.yaml", f"parts:\n  - {{name: a, model: {P['onnx']}, precision: 3a3w, calibration: random}}\n")
    P["pipe_blockprec"] = _write(pipe / "blockprec.yaml", f"parts:\n  - {{name: a, model: {P['onnx']}, precision: 16a4w_block, calibration: random}}\n")
    P["pipe_badtarget"] = _write(pipe / "badtarget.yaml", f"targets: [SM0000]\nparts:\n  - {{name: a, model: {P['onnx']}, calibration: random}}\n")
    P["pipe_parts_str"] = _write(pipe / "partsstr.yaml", "parts: conv.onnx\n")
    P["pipe_json_garbage"] = _write(pipe / "garbage.json", "{\"parts\": [")
    P["pipe_mixed"] = _write(pipe / "mixed.yaml", f"parts:\n  - {{name: a, model: {P['onnx']}, calibration: random}}\n"
                                                   f"  - {{name: b, model: '{P['mlp']}'}}\n")
    # model.py files whose own code fails
    user = root / "user"
    for name, body in {
        "raises": "def build():\n    raise RuntimeError('weights file w.bin not found')\n",
        "nested": "def load(n):\n    return {}[n]\n\ndef build():\n    return load('encoder')\n",
        "import_error": "import not_a_module_anywhere_xyz\n\ndef build():\n    pass\n",
        "toplevel": "x = 1 / 0\n\ndef build():\n    pass\n",
        "syntax": "def build(:\n    pass\n",
        "none": "def build():\n    return None\n",
        "not_module": "def build():\n    return 42, (1,)\n",
        "no_inputs": "import torch\n\ndef build():\n    return torch.nn.Linear(4, 4)\n",
        "bad_inputs": "import torch\n\ndef build():\n    return torch.nn.Linear(4, 4), ('text',)\n",
        "wrong_arity": "import torch\n\ndef build():\n    return torch.nn.Linear(4, 4), (torch.ones(1, 4), torch.ones(1, 4))\n",
        "wrong_shape": "import torch\n\ndef build():\n    return torch.nn.Linear(4, 4), (torch.ones(1, 5),)\n",
        "data_dependent": "import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        if x.sum() > 0:\n"
                          "            return x * 2\n        return x\n\ndef build():\n    return M(), (torch.ones(1, 4),)\n",
        "sysexit": "import sys\n\ndef build():\n    sys.exit(3)\n",
        "takes_args": "def build(n):\n    pass\n",
        "not_callable": "build = 3\n",
    }.items():
        P[f"py_{name}"] = _write(user / f"{name}.py", body) + ":build"
    # a .pt2 exported with a dynamic Dim
    import torch

    class Relu(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2
    ep = torch.export.export(Relu(), (torch.randn(4, 8),), dynamic_shapes={"x": {0: torch.export.Dim("b", min=2, max=16)}})
    torch.export.save(ep, root / "dyn.pt2")
    P["dyn.pt2"] = str(root / "dyn.pt2")
    # the bundles
    modelexport.compile(P["onnx"], output=root / "bundle", target="SM8650", precision="8a8w", calibration="random")
    P["bundle"] = str(root / "bundle")
    modelexport.compile(P["mlp"], output=root / "ptebundle", target="SM8650", precision="fp16")
    P["ptebundle"] = str(root / "ptebundle")
    P["pte"] = str(next((root / "ptebundle").rglob("*.pte")))
    P["ctxbin"] = str(next((root / "bundle").rglob("*.bin")))
    (root / "emptydir").mkdir()
    P["emptydir"] = str(root / "emptydir")
    P["existing_file"] = _write(root / "existing.txt", "keep me")
    return w


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def partials(*roots: Path) -> list[Path]:
    found = []
    for r in roots:
        if r.exists():
            found += [p for p in r.rglob(".*") if PARTIAL.search(p.name) or ".partial-" in p.name]
    return found


def cli_vocabulary() -> tuple[set[str], set[str]]:
    """Every verb and every flag of the CLI: a fix may only point to these."""
    import typer.main

    from modelexport.cli.main import _load_commands
    from modelexport.cli.app import app
    _load_commands()
    group = typer.main.get_command(app)
    verbs, flags = set(group.commands), {"--help", "--version"}
    for cmd in group.commands.values():
        for p in cmd.params:
            flags.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return verbs, flags


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
VERB = re.compile(r"`modelexport ([a-z][a-z0-9-]*)")


def check_fix(text: str, verbs: set[str], flags: set[str]) -> None:
    """A fix line (or click's "Try 'modelexport X --help'"), and every flag and verb it names exists."""
    fix = [ln for ln in text.splitlines() if ln.strip().startswith("fix:") or "--help" in ln]
    assert fix, f"no fix in:\n{text}"
    for line in fix:
        for flag in FLAG.findall(line):
            assert flag in flags, f"the fix names {flag}, which no verb has:\n{line}"
        for verb in VERB.findall(line):
            assert verb in verbs, f"the fix names `modelexport {verb}`, which is no verb:\n{line}"


def tamper(bundle: Path, dest: Path, edit: Callable[[dict, Path], Any]) -> str:
    """A copy of a bundle with its manifest (or files) changed by edit(manifest, folder)."""
    shutil.copytree(bundle, dest)
    m = json.loads((dest / "manifest.json").read_text())
    edit(m, dest)
    if m is not None:
        (dest / "manifest.json").write_text(json.dumps(m))
    return str(dest)
