"""The ``pgcdc.lake`` package imports its public names lazily: each one resolves, and a Spark
worker that unpickles a copy task does not import the pipeline or its configuration."""

from __future__ import annotations

import subprocess
import sys

import pgcdc.lake


def test_every_public_name_resolves_to_its_module() -> None:
    assert sorted(pgcdc.lake.__all__) == sorted(pgcdc.lake._EXPORTS)
    for name in pgcdc.lake.__all__:
        value = getattr(pgcdc.lake, name)
        assert value.__module__ == pgcdc.lake._EXPORTS[name], name


def test_the_copy_task_module_does_not_import_the_pipeline() -> None:
    code = (
        "import sys, pgcdc.lake.write.snapshot; "
        "print(sorted(m for m in ('pgcdc.lake.run.pipeline', 'pgcdc.lake.config', 'pydantic') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
