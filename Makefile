# Two commands on a fresh machine with Python 3.11+: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit chaos bench clean services unasync

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/retrysafe demo --host 127.0.0.1 --port 8000

lint: $(STAMP)
	$(BIN)/ruff format --check src tests bench scripts examples
	$(BIN)/ruff check src tests bench scripts examples
	$(BIN)/python scripts/unasync.py --check

# Regenerate the sync runner (src/retrysafe/_sync/runner.py) from the async one.
unasync: $(STAMP)
	$(BIN)/python scripts/unasync.py

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -m "not chaos" $(PYTEST_ARGS)

test: lint typecheck unit

BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

chaos: $(STAMP)
	$(BIN)/pytest -m chaos $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) bench/.venv-bench-peers .pytest_cache .mypy_cache .ruff_cache test-artifacts
