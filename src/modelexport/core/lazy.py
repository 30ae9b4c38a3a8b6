"""Package attributes that import their module on first use: start-up time is paid by every
command, and most commands need a small part of what a package offers."""
from __future__ import annotations

import importlib
from typing import Any
from collections.abc import Callable


def lazy_attributes(package: str, table: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__` resolving `name` from the submodule `table[name]` of `package`
    (then kept in `namespace`, so it is looked up once)."""
    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{table[name]}", package), name)
        namespace[name] = value
        return value
    return __getattr__
