"""spark_session's Spark home for local sessions (``python_spark_home``): pyspark's own home
linked without ``python/lib/pyspark.zip``, so the Python workers Spark starts import the
installed (compiled) pyspark, not the zip's uncompiled copy; made once, reused after; none
where the cache folder cannot be made."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyspark

from pgcdc.spark.session import python_spark_home


def test_the_home_links_everything_but_the_pyspark_zip(tmp_path: Path) -> None:
    home = Path(pyspark.__file__).resolve().parent
    made = python_spark_home(tmp_path)
    assert made is not None and made.parent == tmp_path
    assert sorted(p.name for p in made.iterdir()) == sorted(p.name for p in home.iterdir())
    assert (made / "bin").resolve() == home / "bin"
    assert (made / "jars").resolve() == home / "jars"
    lib = sorted(p.name for p in (made / "python" / "lib").iterdir())
    assert lib == sorted(
        p.name for p in (home / "python" / "lib").iterdir() if p.name != "pyspark.zip"
    )
    assert any(name.startswith("py4j") for name in lib)
    # made once: the same folder again, and no staging folder left behind
    assert python_spark_home(tmp_path) == made
    assert [p.name for p in tmp_path.iterdir()] == [made.name]


def test_a_cache_that_cannot_be_made_gives_no_home(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert python_spark_home(blocker / "cache") is None


def test_workers_of_a_local_session_import_the_installed_pyspark(spark: Any) -> None:
    installed = str(Path(pyspark.__file__).resolve().parent)
    assert os.environ["SPARK_HOME"] == str(python_spark_home())

    def where(_: object) -> str:
        import pyspark as worker_pyspark

        return str(Path(worker_pyspark.__file__).resolve().parent)

    found = spark.sparkContext.parallelize([0, 1], 2).map(where).collect()
    assert found == [installed, installed]
