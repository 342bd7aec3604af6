"""Benchmarks run by `make bench`: each writes its result to bench-results/<name>.json."""
