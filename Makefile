# Two commands do everything on a fresh machine: `make demo` and `make test` (CI runs this one).
# Both lint and test run ruff and type-check profkit, the tests, the benchmarks and the recipes
# with mypy (configured in pyproject.toml).
VENV ?= .venv
PY := $(VENV)/bin/python
PROFKIT := $(VENV)/bin/profkit
MYPY := $(VENV)/bin/mypy

.PHONY: setup demo test lint clean probes

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) recipes/demo.py

RUFF_PATHS := profkit recipes tests benchmarks scripts
# The tests run in three lanes at once (scripts/test_lanes.sh), the type check beside them;
# LANES=1 runs them in one, LANES=2 in two.
LANES ?= 3

test:
	@bash scripts/setup.sh --test
	@bash scripts/build_probes.sh --check
	@bash scripts/build_proto.sh --check
	@$(VENV)/bin/ruff check $(RUFF_PATHS)
	@$(VENV)/bin/ruff format --check $(RUFF_PATHS)
	@LANES=$(LANES) PY=$(PY) ALSO="$(MYPY)" bash scripts/test_lanes.sh $(PYTEST_ARGS)

lint: setup
	@$(VENV)/bin/ruff check $(RUFF_PATHS)
	@$(VENV)/bin/ruff format --check $(RUFF_PATHS)
	@$(MYPY)

# The CO-RE objects, built again from their sources (commit them).
probes:
	@bash scripts/build_probes.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache
