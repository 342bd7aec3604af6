"""spark_session's Spark home for local sessions (``python_spark_home``): pyspark's own home
linked without ``python/lib/pyspark.zip``, so the Python workers Spark starts import the
installed (compiled) pyspark, not the zip's uncompiled copy; made once, reused after; none
where the cache folder cannot be made. The driver JVM's options (``driver_java_options``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pyspark

from pgcdc.spark.console import log4j2_option
from pgcdc.spark.jvm import java_binary
from pgcdc.spark.session import driver_java_options, python_spark_home


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


def test_the_driver_jvm_exits_on_out_of_memory_and_has_4_mib_g1_regions(spark: Any) -> None:
    """The tests' session has Spark's default 1 GiB heap: G1 would make 1 MiB regions, and
    every array just over 1 MiB would take two."""
    jvm = spark.sparkContext._jvm
    management = jvm.java.lang.management.ManagementFactory
    arguments = list(management.getRuntimeMXBean().getInputArguments())
    assert "-XX:+ExitOnOutOfMemoryError" in arguments
    assert log4j2_option() in arguments
    hotspot = management.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert hotspot.getVMOption("G1HeapRegionSize").getValue() == str(4 << 20)
    assert hotspot.getVMOption("ExitOnOutOfMemoryError").getValue() == "true"


def test_the_configuration_s_java_options_come_after_pgcdc_s() -> None:
    log4j2 = log4j2_option()  # pgcdc's log4j 2 configuration (pgcdc.spark.console)
    assert log4j2 is not None
    pgcdc = f"-XX:+ExitOnOutOfMemoryError {log4j2}"
    assert driver_java_options({}) == f"{pgcdc} -XX:G1HeapRegionSize=4m"
    assert driver_java_options({"spark.driver.memory": "7g"}).endswith("G1HeapRegionSize=4m")
    # from 8 GiB G1's own regions are 4 MiB or larger
    for memory in ("8g", "8192m", "32g"):
        options = driver_java_options({"spark.driver.memory": memory})
        assert options == pgcdc, memory
    own = "-XX:G1HeapRegionSize=8m -Dpgcdc.test=1"
    conf = {"spark.driver.memory": "512m", "spark.driver.extraJavaOptions": own}
    options = driver_java_options(conf)
    assert options == f"{pgcdc} -XX:G1HeapRegionSize=4m {own}"
    # the JVM takes the later value of an option: the configuration's
    java = java_binary()
    assert java is not None
    flags = subprocess.run(
        [str(java), *options.split(), "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    region = [line.split() for line in flags.splitlines() if " G1HeapRegionSize " in line]
    assert region and region[0][3] == str(8 << 20), region
