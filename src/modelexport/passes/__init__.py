"""Opt-in graph rewrites (`--rewrite NAME`) that move nodes the HTP refuses onto it.

One pass per file in this package, each registering itself with `@rewrite_pass(...)`. A pass
takes the exported float graph (a torch.fx.GraphModule of aten ops, before quantization) and
rewrites it in place into ops the validator accepts, returning how many nodes it changed. Which
passes exist is decided by what the real validator refuses (docs/op_support.md), not by guides.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import Callable

from ..core.registry import Registry


@dataclass(frozen=True)
class RewritePass:
    name: str
    description: str
    run: Callable[..., int]          # (graph_module) -> number of nodes rewritten
    fixes: tuple[tuple[str, str], ...] = ()  # (aten op as the audit names it, regex over the refusal reason or source)
    changes_numerics: bool = False   # True when the rewrite is an approximation, not an identity

    def fixes_node(self, op_type: str, reason: str | None) -> bool:
        return any(op == op_type and re.search(rx, reason or "", re.I) for op, rx in self.fixes)


PASSES: Registry[RewritePass] = Registry("rewrite pass")


def rewrite_pass(name: str, description: str, fixes: tuple[tuple[str, str], ...] = (), changes_numerics: bool = False):
    def add(fn: Callable[..., int]) -> Callable[..., int]:
        PASSES.register(name)(RewritePass(name, description, fn, fixes, changes_numerics))
        return fn
    return add


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def get_pass(name: str) -> RewritePass:
    _load_all()
    return PASSES.get(name)


def all_passes() -> list[RewritePass]:
    _load_all()
    return [p for _, p in PASSES]


def passes_fixing(op_type: str, reason: str | None = None) -> list[str]:
    """Names of the passes that rewrite away a node refused as `op_type` for `reason` (the audit's fix column)."""
    return [p.name for p in all_passes() if p.fixes_node(op_type, reason)]


def apply_rewrites(graph_module, names: list[str] | None) -> list[dict]:
    """Run the named passes in order on `graph_module` (in place); what each one changed."""
    done = []
    for name in names or []:
        p = get_pass(name)
        n = p.run(graph_module)
        done.append({"name": p.name, "nodes_rewritten": n, "changes_numerics": p.changes_numerics})
    if done:
        graph_module.graph.lint()
        graph_module.recompile()
    return done
