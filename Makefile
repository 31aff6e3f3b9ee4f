# Two commands on a fresh machine: `make demo` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3

.PHONY: setup demo test test-fast test-unit lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(STAMP)

setup: $(STAMP)
	@scripts/check-java.sh

demo: setup
	$(VENV)/bin/fogshift demo

test: setup
	$(PY) -m pytest -q

# Unit and in-process tests: no cluster, no Spark session.
test-fast: setup
	$(PY) -m pytest -q -m "not integration"

test-unit: test-fast

lint: setup
	$(VENV)/bin/ruff format --check fogshift tests
	$(VENV)/bin/ruff check fogshift tests
	$(VENV)/bin/mypy fogshift

format: setup
	$(VENV)/bin/ruff format fogshift tests
	$(VENV)/bin/ruff check --fix fogshift tests

clean:
	rm -rf $(VENV) .fogshift .fogshift-demo examples/case1/out .pytest_cache .mypy_cache .ruff_cache
