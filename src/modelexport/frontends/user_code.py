"""Calling the user's own Python (a `model.py` being imported, its factory being called): an
exception there is the user's to fix, so it becomes an InputError naming the function that raised
and showing only the user's frames — none of modelexport's, the standard library's or a package's."""
from __future__ import annotations

import hashlib
import importlib.util
import linecache
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any, Callable

from ..core.errors import InputError

_PACKAGE = Path(__file__).resolve().parents[1]
_LIBRARY_DIRS = tuple({Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _is_users(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    p = Path(filename).resolve()
    return not any(p.is_relative_to(d) for d in (_PACKAGE, *_LIBRARY_DIRS))


def user_frames(exc: BaseException) -> list[str]:
    """`file:line in function: source` for each frame of the user's code, outermost first."""
    out = []
    for fs in traceback.extract_tb(exc.__traceback__):
        if _is_users(fs.filename):
            line = (fs.line or linecache.getline(fs.filename, fs.lineno)).strip()
            out.append(f"{Path(fs.filename).name}:{fs.lineno} in {fs.name}" + (f": {line}" if line else ""))
    return out


def user_code_error(exc: BaseException, what: str, path: Path) -> InputError:
    if isinstance(exc, SyntaxError):
        return InputError(f"{exc.filename or path} has a syntax error at line {exc.lineno}: {exc.msg}",
                          "fix the file and try again")
    frames = user_frames(exc)
    msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    where = "".join(f"\n    at {f}" for f in frames[-8:])
    return InputError(f"{what} raised {type(exc).__name__}" + (f": {msg}" if msg else "") + where,
                      f"fix that error in {path.name} (the lines above are your code), then run the same command again")


def call_user(fn: Callable[..., Any], what: str, path: Path, *args: Any) -> Any:
    """fn(*args); any exception it raises (not a Ctrl-C) comes back as an InputError."""
    try:
        return fn(*args)
    except (Exception, SystemExit) as e:   # whatever the user's code raises (even sys.exit) is the user's to fix
        raise user_code_error(e, what, path) from None


def user_function(spec: str, example: str = "model.py:build") -> tuple[Callable[..., Any], Path]:
    """`path/to/file.py:function` → (the function, the file), the file imported in a fresh module."""
    file_part, _, func = str(spec).rpartition(":")
    path = Path(file_part)
    if not file_part or not func:
        raise InputError(f"{spec!r} is not FILE.py:FUNCTION", f"name a Python file and a function in it, e.g. {example}")
    if not path.is_file():
        raise InputError(f"{path} does not exist", "check the path of the Python file")
    mod_name = f"_modelexport_user_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]}"
    spec_obj = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules[mod_name] = module
    call_user(spec_obj.loader.exec_module, f"importing {path.name}", path, module)
    fn = getattr(module, func, None)
    if not callable(fn):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise InputError(f"{path} has no function {func!r}", f"functions defined there: {', '.join(names) or 'none'}")
    return fn, path
