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

# Chaos tests at full size: CHAOS_KILLS (default 20) kill -9s of `pgcdc run` per PostgreSQL
# version, the indexed write killed at each of its points, network faults, failures;
# `make test` runs them shortened (3 kills, 2 into a bucket, 2 of the 5 kill points, PostgreSQL 18).
# Replay a run with PGCDC_CHAOS_SEED=<the printed seed>.
.PHONY: chaos
CHAOS_KILLS ?= 20

chaos: setup
	CHAOS_KILLS=$(CHAOS_KILLS) $(PY) -m tools.chaos

# Coverage-guided fuzzing (atheris) of the decoders, the Spark framer and the assembler:
# FUZZ_SECONDS per target; findings are written as crash-* files in .fuzz/.
.PHONY: fuzz
FUZZ_SECONDS ?= 60

fuzz: setup
	mkdir -p .fuzz/corpus && $(PY) -m tools.fuzz --seeds .fuzz/corpus
	cd .fuzz && for target in decoder columnar framer assembler; do \
		PYTHONPATH=$(CURDIR) ../$(PY) -m tools.fuzz $$target -max_total_time=$(FUZZ_SECONDS) corpus || exit 1; \
	done

# Benchmarks (never part of `make test`; they never fail on speed). BENCH_SCALE=0.05 for a
# quick run; results, README.md table and bench.png in bench-results/.
.PHONY: bench-catchup bench-snapshot bench-memory bench-latency bench-scale bench-wide \
	bench-lifecycle bench-report
BENCH_ARGS ?=

bench: setup
	$(PY) -m tools.bench $(BENCH_ARGS)

bench-decode: setup
	$(PY) -m tools.bench.decode

bench-catchup: setup
	$(PY) -m tools.bench.catchup $(BENCH_ARGS)

bench-snapshot: setup
	$(PY) -m tools.bench.snapshot $(BENCH_ARGS)

bench-memory: setup
	$(PY) -m tools.bench.memory $(BENCH_ARGS)

bench-latency: setup
	$(PY) -m tools.bench.latency $(BENCH_ARGS)

# The mixed workload (2,000 changes/s for 120 s, 70/20/10, random keys) at 1M and 10M rows,
# beside the native subscriber; BENCH_SCALE shrinks the sizes and the run
bench-scale: setup
	$(PY) -m tools.bench.scale $(BENCH_ARGS)

# Many small tables (issue 42): 10 and 100 tables of 10,000 rows, 500 changes/s for 120 s in
# transactions of 10 changes over 1 to 3 tables, history and changelog off then on, beside the
# native subscriber; BENCH_ARGS="--tables 10,100,500" adds 500 tables (at scale 1)
bench-wide: setup
	$(PY) -m tools.bench.wide $(BENCH_ARGS)

# A 1M-row table added to a running pipeline while 2,000 changes/s stream into ten others
# (issue 43): its copy beside the offline copy, the others' latency before and during it
bench-lifecycle: setup
	$(PY) -m tools.bench.lifecycle $(BENCH_ARGS)

bench-report:
	$(PY) -m tools.bench.report

clean:
	rm -rf .venv .tools .cache
