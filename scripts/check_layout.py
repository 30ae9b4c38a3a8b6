"""The layout's two rules, checked by `make test` (tests/test_layout.py):

1. No import cycles, neither between modules nor between the package's first-level parts
   (core, contract, toolchain, frontends, ...). Imports inside functions count. Importing the
   package a module sits in (its `__init__`) is not an edge.
2. No first-level part holds more than a quarter of the package's lines.

usage: python scripts/check_layout.py [SRC_DIR] -> prints what is wrong, exits 1 if anything is.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "modelexport"
MAX_PART_SHARE = 0.25


def modules(src: Path) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package __init__)"""
    out = {}
    for f in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_init else parts)] = (f, is_init)
    return out


def _absolute(module: str, is_init: bool, level: int, name: str | None) -> str:
    if not level:
        return name or ""
    base = module.split(".") if is_init else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_edges(mods: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, (f, is_init) in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(m, is_init, node.level, node.module)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and not (m.startswith(t + ".") and mods[t][1]):
                    edges[m].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def part_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def problems(src: Path) -> list[str]:
    mods = modules(src)
    edges = import_edges(mods)
    out = [f"module cycle: {' <-> '.join(c)}" for c in cycles(edges)]
    part_edges: dict[str, set[str]] = {}
    for m, targets in edges.items():
        for t in targets:
            a, b = part_of(m), part_of(t)
            if a and b and a != b:
                part_edges.setdefault(a, set()).add(b)
                part_edges.setdefault(b, set())
    out += [f"cycle between first-level parts: {' <-> '.join(c)}" for c in cycles(part_edges)]
    lines: dict[str, int] = {}
    for m, (f, _) in mods.items():
        if part_of(m):
            lines[part_of(m)] = lines.get(part_of(m), 0) + len(f.read_text().splitlines())
    total = sum(lines.values())
    out += [f"{p}/ holds {n} of {total} lines ({n / total:.0%}): split it (at most {MAX_PART_SHARE:.0%} per part)"
            for p, n in sorted(lines.items()) if n > MAX_PART_SHARE * total]
    return out


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "src"
    found = problems(src)
    print("\n".join(found) if found else "layout OK: no import cycles, no part above a quarter of the lines")
    sys.exit(1 if found else 0)
