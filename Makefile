# The commands the README names. Each creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench screenshots lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/polytrace demo

# Compiled modules are kept even where PYTHONDONTWRITEBYTECODE is set: each of the test workers and the
# commands they start would otherwise compile the package and the tests again (half of collecting). They are
# kept beside the sources, where pip left the installed libraries' own: a cache folder of its own
# (PYTHONPYCACHEPREFIX) would make a new machine compile every library again, once per worker.
test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

# The demo report's whole page in headless Chromium at 1400 and 800 px (reports/screenshots/, kept by CI).
screenshots: demo
	$(BIN)/python tests/screenshots.py reports/demo/index.html reports/screenshots

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) polytrace.duckdb reports/demo reports/screenshots benchmarks/out
