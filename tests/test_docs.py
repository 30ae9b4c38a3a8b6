"""The docs stay true: the generated reference matches the code, the results page builds from the
bench JSON, and every repository path a user-facing page names exists."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def reference():
    return _script("reference_docs")


def stale(pages: dict[str, str], folder: Path) -> list[str]:
    return [n for n, text in pages.items() if not (folder / n).exists() or (folder / n).read_text() != text]


def test_reference_matches_the_code(reference):
    out = stale(reference.render(), REPO / "docs" / "reference")
    assert not out, f"docs/reference/{out} differ from the code: run python scripts/reference_docs.py"


def test_a_stale_reference_page_is_found(reference, tmp_path):
    pages = reference.render()
    for n, text in pages.items():
        (tmp_path / n).write_text(text)
    assert stale(pages, tmp_path) == []
    (tmp_path / "cli.md").write_text(pages["cli.md"].replace("--strict", "--strikt", 1))
    (tmp_path / "api.md").unlink()
    assert stale(pages, tmp_path) == ["cli.md", "api.md"]


def test_reference_names_every_verb_and_option(reference):
    import click
    import typer

    from modelexport.cli.app import app
    from modelexport.cli.main import _load_commands
    _load_commands()
    root = typer.main.get_command(app)
    text = reference.render()["cli.md"]
    ctx = click.Context(root)
    for name in root.list_commands(ctx):
        assert f"\n## {name}\n" in text
        for p in root.get_command(ctx, name).params:
            if isinstance(p, click.Option) and not p.hidden:
                assert f"`{p.opts[0]}`" in text, (name, p.opts)


def test_results_page_builds_from_the_bench_json():
    page = _script("results_page").render()
    for f in (REPO / "bench" / "results").glob("*.json"):
        assert f"### {f.stem}\n" in page, f.name
    assert "## LLM compile by size" in page and "## Sweep" in page   # the guide links to these


# --- every path a doc names exists -------------------------------------------------------------

DOCS = [REPO / "README.md", *sorted((REPO / "docs" / "guide").glob("*.md")),
        *sorted((REPO / "docs" / "design").glob("*.md")), REPO / "docs" / "reference" / "README.md",
        REPO / "docs" / "llm_export.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")


def named_paths(text: str, doc: Path) -> list[tuple[str, Path]]:
    """(as written, resolved) for each markdown link to a file and each `code` span that is a
    repository path (its first part a top-level entry of the repository)."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        out.append((target, (doc.parent / target.split("#", 1)[0]).resolve()))
    for span in CODE.findall(text):
        span = span.split(":", 1)[0].rstrip(".,;")          # model.py:build, file.py:FUNCTION
        if "/" in span and span.split("/", 1)[0] in TOP and not span.startswith(("http", "OUT")):
            out.append((span, REPO / span))
    return out


def missing(text: str, doc: Path) -> list[str]:
    bad = []
    for written, path in named_paths(text, doc):
        if any(c in written for c in "*?["):
            if not list(REPO.glob(str(path.relative_to(REPO)))):
                bad.append(written)
        elif not path.exists():
            bad.append(written)
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_doc_names_exists(doc):
    assert not missing(doc.read_text(), doc), f"{doc.relative_to(REPO)} names paths that do not exist"


def test_a_missing_path_is_found():
    doc = REPO / "docs" / "guide" / "onnx.md"
    text = ("see `src/modelexport/llm/htp_runtime.py`, [x](../nothere.md), `bench/results/*.json`, "
            "`src/modelexport/api.py`, `tests/nope_*.py` and `examples/pytorch_pte.py:build`")
    assert missing(text, doc) == ["../nothere.md", "src/modelexport/llm/htp_runtime.py", "tests/nope_*.py"]


STALE = ("llm/export/backend.py", "llm/htp_runtime.py", "llm/evaluate.py", "tests/test_llm_chunks.py", "llm/native/")


def test_no_doc_names_a_file_that_moved():
    for doc in [*DOCS, *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        assert not [s for s in STALE if s in text], doc.name


def test_the_guide_holds_no_history():
    pattern = re.compile(r"quiet|loaded host|before|the JSON holds", re.I)
    for doc in [REPO / "README.md", *sorted((REPO / "docs" / "guide").glob("*.md"))]:
        hits = [line for line in doc.read_text().splitlines() if pattern.search(line)]
        assert not hits, (doc.name, hits)


def test_the_readme_is_short_and_has_its_recipes():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for needle in ("make demo", "make test", "--precision 8a8w --calibration", "modelexport verify OUT",
                   "modelexport run", "genie-t2t-run -c genie_config.json", "| 5 |", "docs/results.md"):
        assert needle in text, needle


# --- every command a page shows exists with the flags it uses ---------------------------------

FENCE = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)


def shown_commands(text: str) -> list[list[str]]:
    """The `modelexport VERB ...` lines of a page's shell blocks, continuations joined, comments cut."""
    import shlex
    out = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if "modelexport " not in line:
                continue
            line = line[line.index("modelexport "):]
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            if words[0] == "modelexport" and len(words) > 1:
                out.append(words[1:])
    return out


def unknown_flags(commands: list[list[str]]) -> list[str]:
    import click
    import typer

    from modelexport.cli.app import app
    from modelexport.cli.main import _load_commands
    _load_commands()
    root = typer.main.get_command(app)
    ctx = click.Context(root)
    bad = []
    for words in commands:
        cmd = root.get_command(ctx, words[0])
        if cmd is None:
            bad.append(f"modelexport {words[0]}: no such verb")
            continue
        names = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        for w in words[1:]:
            if w.startswith("-") and len(w) > 1 and not w[1].isdigit():
                flag = w.split("=", 1)[0]
                if flag not in names:
                    bad.append(f"modelexport {words[0]} {flag}")
    return bad


PAGES = [REPO / "README.md", *sorted((REPO / "docs" / "guide").glob("*.md")), *sorted((REPO / "examples").glob("*.sh"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_shown_exists(page):
    text = page.read_text()
    if page.suffix == ".sh":
        text = f"```bash\n{text.replace(chr(34) + '$ME' + chr(34), 'modelexport')}```"
    assert not unknown_flags(shown_commands(text)), page.name


def test_an_invented_flag_is_found():
    text = "```bash\nmodelexport compile m.onnx --targte SM8650 -o OUT   # typo\nmodelexport frobnicate x\n```"
    assert unknown_flags(shown_commands(text)) == ["modelexport compile --targte", "modelexport frobnicate: no such verb"]
