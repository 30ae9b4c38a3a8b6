"""The layout rules of docs/conventions.md: no import cycles (imports inside functions count), no
first-level part above a quarter of the package's lines."""
import importlib.util
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


def test_the_package_has_no_import_cycles_and_no_oversized_part(check_layout):
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
