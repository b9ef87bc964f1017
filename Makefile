# Two commands on a fresh machine with Python 3.11+: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit package compiled test-compiled matrix chaos chaos-tasks bench clean services unasync docs compat

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# `make demo [PORT=8000] [STORE=URL] [BROKER=URL]`: OrderHub and its Celery worker in the
# foreground, with only what they need (retrysafe[demo]: Starlette, FastAPI, Flask, Django,
# uvicorn, gunicorn, prometheus-client, Celery; plus the redis, postgres or mysql extra when
# STORE names one). The worker's broker is a folder (kombu's file-system transport, no server) unless BROKER
# names one (redis://...). Every run keeps its data in a new, empty folder under $TMPDIR (default
# /tmp), never in the source tree: a second run starts empty.
PORT ?= 8000
STORE ?=
BROKER ?=
COMMA := ,
DEMO_EXTRAS := demo$(if $(filter redis%,$(STORE)),$(COMMA)redis)$(if $(filter postgres%,$(STORE)),$(COMMA)postgres)$(if $(filter mysql% mariadb%,$(STORE)),$(COMMA)mysql)
DEMO_STAMP := $(VENV)/.installed-$(subst $(COMMA),-,$(DEMO_EXTRAS))

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing retrysafe[$(DEMO_EXTRAS)] into $(VENV): Starlette, FastAPI, Flask, Django," \
	    "uvicorn, gunicorn, prometheus-client, Celery (no test tools)"
	$(BIN)/python -m pip install --quiet -e '.[$(DEMO_EXTRAS)]'
	touch $@

demo: $(DEMO_STAMP)
	@data=$$(mktemp -d "$${TMPDIR:-/tmp}/retrysafe-demo.XXXXXX") && \
	echo "OrderHub keeps this run's data in $$data (a new, empty folder each run)" && \
	cd "$$data" && exec "$(abspath $(BIN))/retrysafe" demo --host 127.0.0.1 --port $(PORT) \
	    $(if $(STORE),--store '$(STORE)') $(if $(BROKER),--broker '$(BROKER)')

lint: $(STAMP)
	$(BIN)/ruff format --check src tests bench scripts examples hatch_build.py
	$(BIN)/ruff check src tests bench scripts examples hatch_build.py
	$(BIN)/python scripts/unasync.py --check

# Regenerate the sync runner (src/retrysafe/_sync/runner.py) from the async one.
unasync: $(STAMP)
	$(BIN)/python scripts/unasync.py

typecheck: $(STAMP)
	$(BIN)/mypy

# Three pytest-xdist workers: most tests wait on servers, workers and brokers they start, so
# three share two cores well. A test file stays on one worker (its module fixtures: servers,
# brokers), except in the unit, contract and calls suites, whose tests are spread one by one
# (tests/conftest.py's scheduler for --dist loadfile). PYTEST_XDIST=0 runs serially.
PYTEST_XDIST ?= 3
unit: $(STAMP)
	$(BIN)/pytest -m "not chaos" $(if $(filter-out 0,$(PYTEST_XDIST)),-n $(PYTEST_XDIST) --dist loadfile) $(PYTEST_ARGS)

# The unit, contract and calls suites on the other supported Pythons (3.12, 3.13: pyenv's, else
# pythonX.Y on PATH), each in a virtualenv of its own (.venv-3.12, .venv-3.13) built by uv. These
# suites have no module- or session-wide fixtures (each test makes its own store, app and names),
# so their tests are spread one by one over the workers (worksteal): contract/test_wire.py alone
# holds 1,374 of them.
COMPAT_PYTHONS ?= 3.12 3.13
COMPAT_SUITES ?= tests/unit tests/contract tests/calls
compat: $(STAMP)
	@set -e; for v in $(COMPAT_PYTHONS); do \
	  py=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python 2>/dev/null | sort -V | tail -n 1); \
	  [ -n "$$py" ] || py=$$(command -v python$$v) || { echo "compat: no Python $$v"; exit 1; }; \
	  test -x .venv-$$v/bin/pytest || $(BIN)/uv venv -q -p "$$py" .venv-$$v; \
	  $(BIN)/uv pip install -q -p .venv-$$v/bin/python -e '.[test]'; \
	  echo "compat: Python $$v ($$py)"; \
	  .venv-$$v/bin/pytest -q -m "not chaos" $(if $(filter-out 0,$(PYTEST_XDIST)),-n $(PYTEST_XDIST) --dist worksteal) $(COMPAT_SUITES) $(PYTEST_ARGS); \
	done

# The sdist and the wheel, checked as PyPI would (twine); tests/install installs the wheel.
package: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build
	$(BIN)/twine check --strict dist/*

# The compiled build (opt-in; `make package` stays pure): the platform wheel, the hot path compiled
# with mypyc from the same source (RETRYSAFE_COMPILE=1, hatch_build.py), in dist-compiled/.
compiled: $(STAMP)
	rm -rf dist-compiled
	RETRYSAFE_COMPILE=1 $(BIN)/python -m build --wheel --outdir dist-compiled

# The contract, calls and unit suites on the compiled build, installed from its wheel into a
# virtualenv of its own (.venv-compiled; the tests import it, not src/).
COMPILED_VENV ?= .venv-compiled
test-compiled: compiled
	test -x $(COMPILED_VENV)/bin/python || $(BIN)/uv venv --seed -q $(COMPILED_VENV)
	$(BIN)/uv pip install -q -p $(COMPILED_VENV)/bin/python --reinstall-package retrysafe \
	    "$$(ls dist-compiled/retrysafe-*.whl)[test]"
	$(COMPILED_VENV)/bin/retrysafe --version | grep -q "compiled with mypyc"
	$(COMPILED_VENV)/bin/pytest tests/unit tests/contract tests/calls -m "not chaos" \
	    $(if $(filter-out 0,$(PYTEST_XDIST)),-n $(PYTEST_XDIST) --dist loadfile) $(PYTEST_ARGS)

# The install matrix alone (part of `unit`): each extra in a fresh virtualenv from the wheel.
matrix: $(STAMP)
	$(BIN)/pytest tests/install $(PYTEST_ARGS)

# The package (built, checked by twine, each extra installed from it) and the strict site build
# are tests of the suite (tests/install, tests/docs), not steps of their own.
test: lint typecheck unit

# The documentation site: build it, then serve it on http://127.0.0.1:$(DOCS_PORT)/ (8001, so it
# runs beside `make demo` on PORT's 8000; make docs DOCS_PORT=9001).
DOCS_PORT ?= 8001
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

chaos: $(STAMP)
	$(BIN)/pytest -m chaos $(PYTEST_ARGS)

# The task queues' long crash runs alone: Celery (Redis and RabbitMQ brokers x SQLite, PostgreSQL,
# Redis stores, Django's ORM on PostgreSQL, and the plain-Celery controls) and Dramatiq; each
# run's line in test-artifacts/tasks-chaos.txt. CHAOS_TASKS=300 CHAOS_KILLS=10 by default.
chaos-tasks: $(STAMP)
	$(BIN)/pytest -m chaos tests/tasks -s $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-3.12 .venv-3.13 $(COMPILED_VENV) dist-compiled bench/.venv-bench-peers .pytest_cache .mypy_cache .ruff_cache test-artifacts dist site
