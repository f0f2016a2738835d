# The project's commands. Each target installs what it needs itself:
# uv is bootstrapped with `python3 -m pip install uv` when missing, then `uv sync`.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")
PKG := amplifier_module_context_simple
OLDEST_CORE := 1.6.1
OLDEST_ENV := .venv-core-$(OLDEST_CORE)

.PHONY: help uv-bootstrap setup demo test quick test-deep test-core-oldest check bench clean

help:
	@echo "make demo              run the real-session demo (the main job)"
	@echo "make test              run the whole default suite in parallel (branch coverage >= 95%)"
	@echo "make quick             the edit-run loop: the suite without coverage and the slow tiers"
	@echo "                       (add DIAGNOSTICS=1 to either for the sweep / property diagnostics)"
	@echo "make test-deep         run the deep hypothesis / sweep tier"
	@echo "make test-core-oldest  run the suite against amplifier-core $(OLDEST_CORE)"
	@echo "make check             ruff (lint + format check), mypy --strict, flake8-async (whole tree)"
	@echo "make bench             print the benchmark table"

# uv itself: installed with pip into the user's Python when it is not on PATH.
uv-bootstrap:
	@command -v uv >/dev/null 2>&1 || $(PYTHON) -m uv --version >/dev/null 2>&1 \
	  || $(PYTHON) -m pip install --quiet uv


setup: uv-bootstrap
	$(UV) sync --frozen

demo: setup
	$(UV) run --frozen python examples/demo.py

# Coverage (branch, the package only; floor and report in pyproject's [tool.coverage]) and
# the per-test timeout (pyproject's `timeout`) apply to every run of the suite.
COVERAGE := --cov --cov-report=term

# The suite runs on every core (pytest-xdist; JOBS=1 for one worker). `--dist loadgroup`
# keeps the tests of one xdist_group on one worker, one after another: the timed scaling
# tests are grouped so two timings never overlap. pytest-cov combines the workers' data and
# enforces the floor as before.
JOBS ?= auto
PARALLEL := -n $(JOBS) --dist loadgroup
# The fault-sweep and property diagnostics (tests/conftest.py) print only when asked:
# `make test DIAGNOSTICS=1` (pytest's --diagnostics).
DIAGNOSTICS ?=
DIAGNOSE := $(if $(DIAGNOSTICS),--diagnostics)

test: setup
	$(UV) run --frozen python -m pytest $(PARALLEL) $(COVERAGE) $(DIAGNOSE)

# The edit-run loop: in parallel, without coverage and without the slowest tiers, chosen
# with --durations=30 (together about half the suite's time; `make test` runs them all):
# the real-conversation replays (and the count correction's end-to-end replays), the sliced
# fault sweeps, the largest property test and the timed scaling tests.
QUICK_DESELECT := \
  --deselect tests/test_realdata.py \
  --deselect tests/test_reconciliation.py \
  --deselect tests/reliability/test_slice_sweeps.py \
  --deselect tests/context/test_properties.py::test_views_meet_invariants_at_every_pressure \
  --deselect tests/test_scaling.py \
  --deselect tests/context/test_ladder.py::test_four_times_the_history_costs_less_than_five_times_the_time

quick: setup
	$(UV) run --frozen python -m pytest $(PARALLEL) $(QUICK_DESELECT) $(DIAGNOSE)

# The deep profile runs 20x the examples of the default one (its slowest test took 95 s on
# a loaded 2-core machine): a per-test timeout of 10 minutes instead of 2.
test-deep: setup
	HYPOTHESIS_PROFILE=deep $(UV) run --frozen python -m pytest -m "deep or not deep" --run-deep \
	  --timeout=600

# The oldest supported kernel, in a separate environment so the lock stays on the newest.
test-core-oldest: uv-bootstrap
	UV_PROJECT_ENVIRONMENT=$(OLDEST_ENV) $(UV) sync --frozen
	$(UV) pip install --quiet --python $(OLDEST_ENV)/bin/python "amplifier-core==$(OLDEST_CORE)"
	$(OLDEST_ENV)/bin/python -c "import importlib.metadata as m; v = m.version('amplifier-core'); print('amplifier-core', v); assert v == '$(OLDEST_CORE)'"
	$(OLDEST_ENV)/bin/python -m pytest $(COVERAGE)

check: setup
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .
	$(UV) run --frozen mypy
	$(UV) run --frozen flake8-async --anyio --enable=ASYNC102,ASYNC110,ASYNC910,ASYNC911 \
	  $$(find $(PKG) tests examples benchmarks -name '*.py')

bench: setup
	$(UV) run --frozen python -m benchmarks

clean:
	rm -rf .venv $(OLDEST_ENV) .pytest_cache .mypy_cache .ruff_cache .coverage
