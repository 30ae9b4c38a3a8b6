"""The layout rules of docs/conventions.md (scripts/check_layout.py): no import cycles (imports inside
functions count), no first-level part above a quarter of the package's lines, each part imports only
what its paragraph allows, and the ratchets of scripts/layout_baseline.json; ruff's banned-api."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def check_layout():
    spec = importlib.util.spec_from_file_location("check_layout", ROOT / "scripts" / "check_layout.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_layout"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_package_follows_its_layout_rules(check_layout):
    assert check_layout.problems(ROOT / "src") == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / "modelexport" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_check_finds_a_cycle_hidden_in_a_function_and_an_oversized_part(check_layout, tmp_path):
    _write(tmp_path, {"__init__.py": "", "a/__init__.py": "", "b/__init__.py": "",
                      "a/x.py": "from ..b import y\n",
                      "b/y.py": "def f():\n    from ..a.x import g\n" + "z = 1\n" * 50})
    found = check_layout.problems(tmp_path)
    assert any(f.startswith("module cycle: modelexport.a.x <-> modelexport.b.y") for f in found), found
    assert any(f.startswith("cycle between first-level parts: a <-> b") for f in found), found
    assert any(f.startswith("b/ holds") for f in found), found


def test_importing_a_package_face_is_not_a_cycle(check_layout, tmp_path):
    _write(tmp_path, {"__init__.py": "", "a/__init__.py": "from .x import X\n", "a/x.py": "from . import helpers\nX = 1\n",
                      "a/helpers.py": "", "b/__init__.py": "", "b/c.py": "", "d/__init__.py": "", "d/e.py": ""})
    assert not [f for f in check_layout.problems(tmp_path) if "cycle" in f]


# --- the rules read from docs/conventions.md, and the ratchet (scripts/layout_baseline.json) ---

DOC = """# Layout

## What each part holds, and what it may import

- **core/** — the ground.
  Checked: imports nothing of modelexport.
- **low/** — helpers.
  Checked: may import core.
- **mid/** — the middle.
  Checked: may import core, low.
- **backends/** — formats.
  Checked: may import everything above; no function over 80 lines or 8 parameters.
- **api.py, cli/** — the top.
  Checked: may import everything above and one another.

## Words
"""


def _repo(root: Path, files: dict[str, str], doc: str = DOC, baseline: dict | None = None) -> Path:
    """A tiny repository laid out as ours: src/modelexport/..., docs/conventions.md, scripts/layout_baseline.json."""
    base = {"__init__.py": "", "core/__init__.py": "", "low/__init__.py": "", "mid/__init__.py": "",
            "backends/__init__.py": "", "cli/__init__.py": "", "api.py": ""}
    _write(root / "src", {**base, **files})
    (root / "docs").mkdir(exist_ok=True)
    (root / "docs" / "conventions.md").write_text(doc)
    if baseline is not None:
        (root / "scripts").mkdir(exist_ok=True)
        (root / "scripts" / "layout_baseline.json").write_text(json.dumps(baseline))
    return root / "src"


def test_the_real_doc_names_every_part_and_its_function_limits(check_layout):
    rules = check_layout.doc_rules(ROOT / "docs" / "conventions.md")
    assert rules.errors == []
    assert rules.allowed["core"] == set()
    assert rules.allowed["toolchain"] == {"core"}
    assert {"core", "contract", "frontends"} <= rules.allowed["backends"] and "runtime" not in rules.allowed["backends"]
    assert rules.functions["modelexport/backends/"] == (80, 8)
    assert rules.functions["modelexport/llm/export/"] == (80, 8)


def test_an_import_the_doc_does_not_allow_is_a_new_violation(check_layout, tmp_path):
    src = _repo(tmp_path, {"low/a.py": "from ..mid import b\n", "mid/b.py": "from ..low import c\n", "low/c.py": "",
                           "core/d.py": "def f():\n    from ..low import c\n"})
    found = check_layout.problems(src)
    assert any(f.startswith("new may-import: modelexport.low.a -> modelexport.mid") for f in found), found
    assert any(f.startswith("new may-import: modelexport.core.d -> modelexport.low.c") for f in found), found
    assert not any("modelexport.mid.b ->" in f for f in found), found


def test_a_part_without_a_paragraph_and_a_paragraph_without_a_part_are_problems(check_layout, tmp_path):
    src = _repo(tmp_path, {"stray/__init__.py": "", "stray/x.py": ""},
                doc=DOC.replace("- **api.py, cli/**", "- **api.py, cli/, gone/**"))
    found = check_layout.problems(src)
    assert any(f.startswith("stray/ has no paragraph") for f in found), found
    assert any("a paragraph for gone" in f for f in found), found
    unreadable = _repo(tmp_path / "b", {}, doc=DOC.replace("Checked: may import core, low.", "Imports some things."))
    assert any("mid/ has no last line 'Checked:" in f or "of mid/ has no last line" in f
               for f in check_layout.problems(unreadable)), check_layout.problems(unreadable)


LONG_FN = "def long(a, b, c, d, e, f, g, h, i):\n" + "    x = 1\n" * 85
INSIDE = ("import numpy\n\n\ndef f():\n    import json\n    import yaml\n    import torch\n"
          "    from ..core import light\n    from ..core import heavy\n    from ..core import light as again  # deferred: the core package imports us\n"
          "    return json, yaml, torch, light, heavy, again\n")


def test_the_ratchet_catches_new_and_grown_violations_and_asks_to_shrink_fixed_ones(check_layout, tmp_path):
    files = {"backends/fmt.py": LONG_FN, "low/big.py": "x = 1\n" * 501, "mid/inside.py": INSIDE,
             "core/light.py": "import json\n", "core/heavy.py": "import torch\n"}
    src = _repo(tmp_path, files)
    found = check_layout.problems(src)
    for expected in ("new module-lines: modelexport/low/big.py: 501",
                     "new function-lines: modelexport/backends/fmt.py::long: 86",
                     "new function-params: modelexport/backends/fmt.py::long: 9",
                     "new stdlib-import-in-function: modelexport/mid/inside.py: 1",
                     "new light-import-in-function: modelexport/mid/inside.py: 1",
                     "new own-import-in-function: modelexport/mid/inside.py: 1"):   # `light` only: heavy defers torch, again says why
        assert any(f.startswith(expected) for f in found), (expected, found)
    assert len([f for f in found if f.startswith("new ")]) == 6, found

    _, now = check_layout.measure(src)
    grown = {r: dict(v) for r, v in now.items()}
    grown["module-lines"]["modelexport/low/big.py"] = 480                       # it was smaller: it grew
    grown["function-lines"]["modelexport/backends/fmt.py::long"] = 90           # it was larger: it shrank
    grown["function-params"]["modelexport/backends/gone.py::old"] = 12          # fixed: gone
    src = _repo(tmp_path, files, baseline=grown)
    found = check_layout.problems(src)
    assert any(f.startswith("module-lines grew: modelexport/low/big.py: 501, was 480") for f in found), found
    assert any(f.startswith("function-lines shrank: modelexport/backends/fmt.py::long: 86, baseline 90") for f in found), found
    assert any(f.startswith("function-params shrank: modelexport/backends/gone.py::old: 0") for f in found), found
    shrunk = check_layout.shrink(now, grown)
    assert shrunk["module-lines"] == {"modelexport/low/big.py": 480}            # never raised
    assert shrunk["function-lines"] == {"modelexport/backends/fmt.py::long": 86}
    assert "modelexport/backends/gone.py::old" not in shrunk["function-params"]
    src = _repo(tmp_path, files, baseline=now)
    assert [f for f in check_layout.problems(src) if " holds " not in f] == []       # low/ is most of this tiny package


def test_the_script_fails_on_a_qnn_providers_list_and_shrinks_the_baseline_only(tmp_path):
    bad = 'import onnxruntime as ort\n\n\ndef s(m):\n    return ort.InferenceSession(m, providers=["QNNExecutionProvider"])\n'
    src = _repo(tmp_path, {"low/session.py": bad, "low/big.py": "x = 1\n" * 501},
                baseline={"module-lines": {"modelexport/low/big.py": 600, "modelexport/low/old.py": 700}})
    script = [sys.executable, str(ROOT / "scripts" / "check_layout.py"), str(src)]
    run = subprocess.run(script, capture_output=True, text=True)
    assert run.returncode == 1
    assert 'session.py:5: providers=["QNNExecutionProvider"] silently runs on CPU' in run.stdout
    assert "module-lines shrank: modelexport/low/big.py: 501, baseline 600" in run.stdout
    subprocess.run([*script, "--shrink-baseline"], capture_output=True, text=True)
    assert json.loads((tmp_path / "scripts" / "layout_baseline.json").read_text())["module-lines"] == {
        "modelexport/low/big.py": 501}


def test_ruff_bans_inference_sessions_outside_the_toolchain(tmp_path):
    ruff = Path(sys.executable).parent / "ruff"
    assert ruff.exists(), "ruff is pinned in requirements.txt: make setup installs it"
    code = 'import onnxruntime as ort\n\nsession = ort.InferenceSession("m.onnx")\n'
    lint = lambda name: subprocess.run([str(ruff), "check", "--no-cache", "--stdin-filename", name, "-"],  # noqa: E731
                                       input=code, capture_output=True, text=True, cwd=ROOT)
    banned = lint("src/modelexport/runtime/new_runner.py")
    assert banned.returncode == 1 and "TID251" in banned.stdout, banned.stdout + banned.stderr
    assert lint("src/modelexport/toolchain/ort_qnn.py").returncode == 0
