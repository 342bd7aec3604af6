"""Developer tools run with `python -m tools.<name>` (generators, benchmarks); not shipped."""
