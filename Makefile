# Two commands on a fresh machine: `make demo` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
COMPILED := $(VENV)/.compiled
PYTHON ?= python3
# pip itself, pinned as every package (unpinned, it is whatever is newest on the day it runs).
PIP_VERSION := 26.3

.PHONY: setup demo test test-fast test-unit lint format clean lock

$(STAMP): pyproject.toml constraints.txt
	@rm -f $(COMPILED)  # (what is installed now is compiled anew, see setup)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "pip==$(PIP_VERSION)"
	@# The versions the suite passed with (constraints.txt, written by `make lock`).
	$(PY) -m pip install -q --no-compile -c constraints.txt -e '.[dev,bench]'
	touch $(STAMP)

setup: $(STAMP)
	@scripts/check-java.sh
	@# fogshift's JVM classes (a local file system that forks no chmod per file written,
	@# fogshift/runtime/jvm_classes.py), then the Spark driver JVM's class archive (once per
	@# venv, ~30 s): every node's session then starts in about two thirds of the time
	@# (fogshift/runtime/jvm_archive.py).
	@# Beside it, once per venv: pip compiled nothing (--no-compile), compileall does it on
	@# every core, ~20 s sooner than pip's one file after another, and while the archive's
	@# JVM starts (the two took ~43 s one after the other, ~32 s side by side). With
	@# PYTHONDONTWRITEBYTECODE set (as on CI machines) nothing is ever cached, and every
	@# Spark Python worker would compile pandas, pyarrow and pyspark anew at start (3 s of
	@# CPU; Spark gives a worker 10 s to connect back). A file that does not compile (a
	@# vendored test) is no reason to stop.
	@$(PY) -m fogshift.runtime.jvm_archive & archive=$$!; \
	if [ ! -f $(COMPILED) ]; then \
	  $(PY) -m compileall -q -j 0 $(VENV)/lib fogshift > /dev/null || true; touch $(COMPILED); \
	fi; \
	wait $$archive

demo: setup
	$(VENV)/bin/fogshift demo

# Three workers on two cores, a module whole on one: with the tests' 2 s micro-batches a
# worker waits on its cluster about a quarter of the time, which the third fills (README,
# "How long the suite takes").
# (The tools only the tests drive: `make demo` as an ordinary user needs none of them.)
test: setup
	@scripts/check-test-tools.sh
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder

# Unit and in-process tests: no cluster, no Spark session.
test-fast: setup
	@scripts/check-test-tools.sh
	$(PY) -m pytest -q -m "not integration"

test-unit: test-fast

lint: setup
	$(VENV)/bin/ruff format --check fogshift tests
	$(VENV)/bin/ruff check fogshift tests
	$(VENV)/bin/mypy fogshift

format: setup
	$(VENV)/bin/ruff format fogshift tests
	$(VENV)/bin/ruff check --fix fogshift tests

# Resolve pyproject.toml's ranges anew in a scratch venv and record what they give.
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q "pip==$(PIP_VERSION)"
	.lock-venv/bin/python -m pip install -q --no-compile '.[dev,bench]'
	{ sed -n '/^#/p' constraints.txt; .lock-venv/bin/python -m pip freeze --exclude-editable \
	  | grep -v '^fogshift'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .lock-venv build fogshift.egg-info

clean:
	rm -rf $(VENV) .fogshift .fogshift-demo examples/case1/out .pytest_cache .mypy_cache .ruff_cache
