# Two commands do everything on a fresh machine: `make demo` and `make test` (CI runs this one).
# Both lint and test type-check profkit with mypy (configured in pyproject.toml).
VENV ?= .venv
PY := $(VENV)/bin/python
PROFKIT := $(VENV)/bin/profkit
MYPY := $(VENV)/bin/mypy

.PHONY: setup demo test lint clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) recipes/demo.py

test:
	@bash scripts/setup.sh --test
	@$(MYPY)
	@$(PY) -m pytest -ra $(PYTEST_ARGS)

lint: setup
	@$(VENV)/bin/ruff check profkit recipes tests benchmarks
	@$(VENV)/bin/ruff format --check profkit recipes tests benchmarks
	@$(MYPY)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache
