# pgcdc developer entry points. `make demo` and `make test` set everything up themselves.
.PHONY: setup demo test lint typecheck pytest bench bench-decode clean

PY := .venv/bin/python
PYTEST_ARGS ?=

setup:
	@tools/setup.sh

demo: setup
	$(PY) -m pgcdc demo

test: setup lint typecheck pytest

lint:
	.venv/bin/ruff check src tests tools
	.venv/bin/ruff format --check src tests tools

typecheck:
	.venv/bin/mypy

pytest:
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup bench-decode

bench-decode: setup
	$(PY) -m tools.bench.decode

clean:
	rm -rf .venv .tools .cache
