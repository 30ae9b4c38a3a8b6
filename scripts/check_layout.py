"""The layout's rules, checked by `make check` and `make test` (tests/test_layout.py):

1. No import cycles, neither between modules nor between the package's first-level parts
   (core, contract, toolchain, frontends, ...). Imports inside functions count. Importing the
   package a module sits in (its `__init__`) is not an edge.
2. No first-level part holds more than a quarter of the package's lines.
3. A part imports only what its paragraph in docs/conventions.md says it may ("May import core,
   contract." / "May import everything above." / "Imports nothing of modelexport."). The doc is the
   one source of truth: a part without a paragraph, or a paragraph naming no part, is a problem.
4. No module over 500 lines.
5. Where a part's "Checked:" line says so (backends/, llm/export/): no function over 80 lines (from
   `def` to its last line, nested functions included) or 8 parameters (self / cls not counted,
   *args and **kwargs counted).
6. Imports inside functions only at the heavy libraries' boundary: none of the standard library,
   none of a light third-party library, and one of the package's own modules only when that
   defers a heavy library (below) that the importing module does not already load at import time,
   or when the statement says why it must wait (`# deferred: <why>`, e.g. a package `__init__`
   that imports this module first).

7. No call passes `providers=[... "QNNExecutionProvider" ...]` (that session silently runs on CPU):
   QNN EP sessions come from `toolchain.ort_qnn.create_session`. ruff's banned-api can only ban the
   name `onnxruntime.InferenceSession`; this is the rule itself.

Rules 3-6 are ratchets: scripts/layout_baseline.json lists today's violations with their size (lines,
parameters, count of imports). A violation not listed, or one larger than listed, fails; a listed
one that is fixed or smaller also fails until the baseline is shrunk (`--shrink-baseline` does
that, and only that: it never adds an entry or raises one). Adding an entry is a deliberate edit.

usage: python scripts/check_layout.py [SRC_DIR] [--shrink-baseline]
       -> prints what is wrong, exits 1 if anything is.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "modelexport"
MAX_PART_SHARE = 0.25
MAX_MODULE_LINES = 500
# Libraries whose import costs start-up time worth deferring (`python -X importtime`, cold, this
# machine: torch 1.6 s, onnx_ir 1.3 s, transformers 1.0 s, gguf 0.8 s, onnxscript 0.8 s,
# matplotlib 0.4 s, onnx 0.23 s, onnxruntime 0.2 s, numpy 0.2 s, scipy.signal 0.75 s; executorch's and torchao's
# submodules pull torch; ray is optional). Anything else is light: import it at module level.
HEAVY = frozenset({"torch", "torchao", "torchvision", "executorch", "onnxruntime", "transformers", "onnx",
                   "onnxscript", "onnx_ir", "gguf", "matplotlib", "ray", "numpy", "scipy"})
DOC_SECTION = "## What each part holds, and what it may import"
RULES = ("may-import", "module-lines", "function-lines", "function-params",
         "stdlib-import-in-function", "light-import-in-function", "own-import-in-function")


# --------------------------------------------------------------------------- the import graph

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


@dataclass(frozen=True)
class Import:
    module: str             # the importing module
    target: str             # an own module (resolved to one that exists), or a third-party/stdlib name
    own: bool
    in_function: bool
    type_checking: bool     # under `if TYPE_CHECKING:` (never executed)
    line: int
    deferred_why: str = ""  # the reason in a `# deferred: <why>` comment on the statement


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


_FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _walk(nodes, in_function: bool = False, type_checking: bool = False):
    """(import node, in a function, under `if TYPE_CHECKING:`) for every import below these nodes."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function, type_checking
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk(node.body, in_function, True)
            yield from _walk(node.orelse, in_function, type_checking)
        else:
            yield from _walk(ast.iter_child_nodes(node), in_function or isinstance(node, _FUNCTION), type_checking)


_DEFERRED = re.compile(r"#\s*deferred:\s*(\S.*)$")


def imports(mods: dict[str, tuple[Path, bool]], trees: dict[str, ast.Module]) -> list[Import]:
    out = []
    for m, (f, is_init) in mods.items():
        source = None
        for node, in_fn, tc in _walk(trees[m].body):
            why = ""
            if in_fn:
                source = source or f.read_text().splitlines()
                found = [_DEFERRED.search(source[n - 1]) for n in range(node.lineno, node.end_lineno + 1)]
                why = next((x.group(1).strip() for x in found if x), "")
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
                level = 0
            else:
                base = _absolute(m, is_init, node.level, node.module)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
                level = node.level
            for t in targets:
                own = bool(level) or t == PACKAGE or t.startswith(PACKAGE + ".")
                if own:
                    while t and t not in mods:
                        t = t.rpartition(".")[0]
                    if not t:
                        continue
                out.append(Import(m, t, own, in_fn, tc, node.lineno, why))
    return out


def _edges(mods: dict[str, tuple[Path, bool]], found: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for i in found:
        m, t = i.module, i.target
        if i.own and t != m and not (m.startswith(t + ".") and mods[t][1]):
            edges[m].add(t)
    return edges


def import_edges(mods: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    trees = {m: ast.parse(f.read_text()) for m, (f, _) in mods.items()}
    return _edges(mods, imports(mods, trees))


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


# --------------------------------------------------------------------------- the doc's "may import"

@dataclass
class DocRules:
    allowed: dict[str, set[str]]                    # part -> the parts it may import
    functions: dict[str, tuple[int, int]]           # folder under src/ ("modelexport/backends/") -> (lines, parameters)
    errors: list[str]                               # what in the doc cannot be read


def doc_rules(doc: Path) -> DocRules:
    """The rules of each part, from its paragraph's "Checked:" line in the doc.

    A bullet `- **core/** — ...` or `- **pipeline.py, api.py, cli/** — ...` names its parts; its line
    "Checked: may import a, b." / "may import everything above" / "may import x and everything
    above" / "... and one another" / "imports nothing of modelexport" says what they may import
    ("above": every part of an earlier bullet, the list is bottom-up), and an optional clause
    "; [in `sub/folder/`,] no function over N lines or M parameters" limits its functions."""
    text = doc.read_text()
    rules = DocRules({}, {}, [])
    if DOC_SECTION not in text:
        rules.errors.append(f"{doc.name}: no section {DOC_SECTION!r}")
        return rules
    section = text.split(DOC_SECTION, 1)[1].split("\n## ", 1)[0]
    above: list[str] = []
    for head, body in re.findall(r"^- \*\*(.+?)\*\*(.*?)(?=^- |\Z)", section, flags=re.S | re.M):
        head = head.replace("\\_", "_")
        names = [n.strip().removesuffix("/").removesuffix(".py") for n in head.split(",")]
        checked = re.search(r"Checked: (.*?)\.\s*\Z", body, flags=re.S)
        if not checked:
            rules.errors.append(f"{doc.name}: the paragraph of {head} has no last line 'Checked: may import core, "
                                f"contract.' (or 'Checked: imports nothing of modelexport.')")
            continue
        clauses = [" ".join(c.split()) for c in checked.group(1).split(";")]
        ok: set[str] = set()
        if clauses[0].startswith("may import "):
            for w in clauses[0].removeprefix("may import ").replace(" and ", ", ").split(", "):
                w = w.strip().strip("`").removesuffix("/")
                if w == "everything above":
                    ok |= set(above)
                elif w == "one another":
                    ok |= set(names)
                elif w in above:
                    ok.add(w)
                else:
                    rules.errors.append(f"{doc.name}: {head} may import {w!r}, which is no part listed above it")
        elif clauses[0] != "imports nothing of modelexport":
            rules.errors.append(f"{doc.name}: {head}: 'Checked: {clauses[0]}' is neither 'may import ...' "
                                f"nor 'imports nothing of modelexport'")
        for c in clauses[1:]:
            m = re.fullmatch(r"(?:in `([^`]+)`, )?no function over (\d+) lines or (\d+) parameters", c)
            if not m:
                rules.errors.append(f"{doc.name}: {head}: cannot read the rule {c!r}")
                continue
            for n in ([m.group(1).strip("/")] if m.group(1) else names):
                rules.functions[f"{PACKAGE}/{n}/"] = (int(m.group(2)), int(m.group(3)))
        for n in names:
            rules.allowed[n] = ok - {n}
        above += names
    return rules


# --------------------------------------------------------------------------- the ratchet rules

def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    a = fn.args
    named = [*a.posonlyargs, *a.args]
    if in_class and named and named[0].arg in ("self", "cls") and not any(
            isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list):
        named = named[1:]
    return len(named) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def _functions(tree: ast.Module):
    """(qualified name, node, defined in a class body) for every function, nested ones too."""
    def walk(node, prefix, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child, in_class
                yield from walk(child, name + ".", False)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.", True)
            else:
                yield from walk(child, prefix, in_class)
    yield from walk(tree, "", False)


def _stdlib(name: str) -> bool:
    root = name.split(".")[0]
    return root in sys.stdlib_module_names or root == "__future__"


def _heavy_at_import(mods, found: list[Import]) -> dict[str, frozenset[str]]:
    """module -> the heavy libraries importing it loads (module-level imports, transitively; a
    module's parent packages run first)."""
    direct: dict[str, set[str]] = {m: set() for m in mods}
    deps: dict[str, set[str]] = {m: set() for m in mods}
    for m in mods:
        p = m.rpartition(".")[0]
        while p:
            if p in mods:
                deps[m].add(p)
            p = p.rpartition(".")[0]
    for i in found:
        if i.in_function or i.type_checking:
            continue
        if i.own:
            if i.target != i.module:
                deps[i.module].add(i.target)
        elif i.target.split(".")[0] in HEAVY:
            direct[i.module].add(i.target.split(".")[0])
    memo: dict[str, frozenset[str]] = {}
    for start in mods:                      # reachability by a plain search per module: 300 modules
        seen, todo, heavy = {start}, [start], set()
        while todo:
            m = todo.pop()
            if m in memo:
                heavy |= memo[m]
                continue
            heavy |= direct[m]
            for d in deps[m] - seen:
                seen.add(d)
                todo.append(d)
        memo[start] = frozenset(heavy)
    return memo


def violations(src: Path, mods, trees, found: list[Import], rules: DocRules | None) -> dict[str, dict[str, int]]:
    """rule -> key -> size, for the ratchet rules."""
    out: dict[str, dict[str, int]] = {r: {} for r in RULES}
    rel = {m: f.relative_to(src).as_posix() for m, (f, _) in mods.items()}
    if rules is not None:
        for i in found:
            a, b = part_of(i.module), part_of(i.target)
            if i.own and a and b and a != b and a in rules.allowed and b not in rules.allowed[a]:
                key = f"{i.module} -> {i.target}"
                out["may-import"][key] = out["may-import"].get(key, 0) + 1
    for m, (f, _) in mods.items():
        n = len(f.read_text().splitlines())
        if n > MAX_MODULE_LINES:
            out["module-lines"][rel[m]] = n
        limits = [v for d, v in (rules.functions if rules else {}).items() if rel[m].startswith(d)]
        if limits:
            max_lines, max_params = min(limits)
            for name, fn, in_class in _functions(trees[m]):
                lines = fn.end_lineno - fn.lineno + 1
                if lines > max_lines:
                    out["function-lines"][f"{rel[m]}::{name}"] = lines
                p = _params(fn, in_class)
                if p > max_params:
                    out["function-params"][f"{rel[m]}::{name}"] = p
    heavy = _heavy_at_import(mods, found)
    for i in found:
        if not i.in_function or i.type_checking:
            continue
        if i.own:
            rule = None if heavy[i.target] - heavy[i.module] or i.deferred_why else "own-import-in-function"
        elif _stdlib(i.target):
            rule = "stdlib-import-in-function"
        else:
            rule = None if i.target.split(".")[0] in HEAVY else "light-import-in-function"
        if rule:
            out[rule][rel[i.module]] = out[rule].get(rel[i.module], 0) + 1
    return out


ABOUT = ("The layout rules' violations when each rule came (scripts/check_layout.py): key -> size (lines, "
         "parameters, imports). Only ever shrinks: --shrink-baseline after a fix; a new entry is a deliberate hand edit.")
WHAT = {"may-import": "imports a part its paragraph in docs/conventions.md does not allow",
        "module-lines": f"lines (at most {MAX_MODULE_LINES} a module)",
        "function-lines": "lines (more than its part's 'Checked:' line in docs/conventions.md allows a function)",
        "function-params": "parameters (more than its part's 'Checked:' line in docs/conventions.md allows)",
        "stdlib-import-in-function": "standard-library imports inside functions (import them at the top)",
        "light-import-in-function": "imports of light third-party libraries inside functions (import them at the top)",
        "own-import-in-function": "imports of our own modules inside functions that defer no heavy library"}


def ratchet(now: dict[str, dict[str, int]], baseline: dict[str, dict[str, int]], baseline_name: str) -> list[str]:
    out = []
    for rule in RULES:
        was, cur = baseline.get(rule, {}), now.get(rule, {})
        for key, n in sorted(cur.items()):
            if key not in was:
                out.append(f"new {rule}: {key}: {n} {WHAT[rule]}"
                           f" (fix it; or, deliberately, add \"{key}\": {n} to {baseline_name})")
            elif n > was[key]:
                out.append(f"{rule} grew: {key}: {n}, was {was[key]} {WHAT[rule]}")
        for key, n in sorted(was.items()):
            if cur.get(key, 0) < n:
                out.append(f"{rule} shrank: {key}: {cur.get(key, 0)}, baseline {n}: well done; "
                           f"tighten the baseline (python scripts/check_layout.py --shrink-baseline)")
    return out


def shrink(now: dict[str, dict[str, int]], baseline: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The baseline lowered to what is there now: never a new entry, never a larger one."""
    return {"_about": baseline.get("_about", ABOUT)} | {
        rule: {k: min(n, now.get(rule, {}).get(k, 0)) for k, n in sorted(baseline.get(rule, {}).items())
               if now.get(rule, {}).get(k, 0)} for rule in RULES}


def qnn_providers_calls(mods, trees) -> list[str]:
    """Calls that name the QNN EP in `providers=` (a literal, or the toolchain's EP_NAME)."""
    def names_qnn(v: ast.expr) -> bool:
        return any((isinstance(n, ast.Constant) and n.value == "QNNExecutionProvider")
                   or (isinstance(n, ast.Name) and n.id == "EP_NAME")
                   or (isinstance(n, ast.Attribute) and n.attr == "EP_NAME") for n in ast.walk(v))
    out = []
    for m, (f, _) in mods.items():
        for node in ast.walk(trees[m]):
            if isinstance(node, ast.Call) and any(k.arg == "providers" and names_qnn(k.value) for k in node.keywords):
                out.append(f"{f.name}:{node.lineno}: providers=[\"QNNExecutionProvider\"] silently runs on CPU: "
                           f"use toolchain.ort_qnn.create_session(model, SessionPlan(...))")
    return out


# --------------------------------------------------------------------------- everything

def measure(src: Path, doc: Path | None = None):
    """(the problems that are not ratcheted, the ratchet rules' violations)."""
    mods = modules(src)
    trees = {m: ast.parse(f.read_text()) for m, (f, _) in mods.items()}
    found = imports(mods, trees)
    edges = _edges(mods, found)
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
    out += qnn_providers_calls(mods, trees)
    doc = doc or src.parent / "docs" / "conventions.md"
    rules = None
    if doc.is_file():
        rules = doc_rules(doc)
        out += rules.errors
        out += [f"{p}/ has no paragraph in {doc.name} ({DOC_SECTION[3:]})" for p in sorted(set(lines) - set(rules.allowed))]
        out += [f"{doc.name} has a paragraph for {p}, which is no part of {PACKAGE}"
                for p in sorted(set(rules.allowed) - set(lines))]
    else:
        out.append(f"no {doc}: the parts' import rules live there")
    return out, violations(src, mods, trees, found, rules)


def problems(src: Path, doc: Path | None = None, baseline: Path | None = None) -> list[str]:
    baseline = baseline or src.parent / "scripts" / "layout_baseline.json"
    out, now = measure(src, doc)
    was = json.loads(baseline.read_text()) if baseline.is_file() else {}
    return out + ratchet(now, was, baseline.name)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    src = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "src"
    baseline = src.parent / "scripts" / "layout_baseline.json"
    if "--shrink-baseline" in argv:
        _, now = measure(src)
        was = json.loads(baseline.read_text()) if baseline.is_file() else {}
        baseline.write_text(json.dumps(shrink(now, was), indent=1) + "\n")
        print(f"{baseline}: " + ", ".join(f"{r} {len(v)}" for r, v in shrink(now, was).items() if r in RULES))
    found = problems(src, baseline=baseline)
    print("\n".join(found) if found else
          "layout OK: no import cycles, no part above a quarter of the lines, every part imports what "
          "docs/conventions.md allows, and no violation beyond scripts/layout_baseline.json")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
