# fedclock — the two commands a fresh machine needs are `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-slow lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0   # the CPU wheel; must come before anything that needs torch
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Install, then tour the four methods on digits (SALF, FedBuff/async FedAvg, Fed-RAA, CIS): four tables, their conclusions, runs/demo/report.html
demo: $(STAMP)
	$(BIN)/fedclock tour --out runs/demo

## Install, then run the fast test suite
test: $(STAMP)
	$(BIN)/python -m pytest

## End-to-end runs on real data (MNIST from ../shared/data or $$FEDCLOCK_DATA; skipped if absent, failed under CI=true)
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
