"""SparkSession helpers: a session whose Python workers run this interpreter, with pgcdc
registered, and shortcuts that fill in the options a Spark session already knows.

Spark starts its Python workers with ``python3`` from PATH unless told otherwise;
``spark_session`` points every worker (driver-side planners, the streaming source's runner,
executors) at ``sys.executable``, so they import the same pgcdc and PyArrow as the caller.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on its Python workers' path. With a
pip-installed pyspark, that zip holds the same modules as the installed package, but without
bytecode: every Python process Spark starts (a daemon per worker module: data source lookup,
creation, planning, the streaming source's runner, the executors' workers) compiles pyspark
from source again, about 0.4 s of CPU each. A local session started without ``SPARK_HOME``
therefore gets one of its own (``python_spark_home``): the pyspark package's directories
linked, without the zip, so the workers import the installed, compiled pyspark.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcdc.spark.console import launch_gateway, log4j2_option, quiet_callback_errors
from pgcdc.spark.jvm import ArchiveWriter, JavaLaunch, deaf_to_sigterm, launch_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pgcdc.replication import ExportedSnapshot
    from pgcdc.spark.snapshot import PgcdcSnapshotReader

__all__ = [
    "driver_exit",
    "python_spark_home",
    "read_snapshot",
    "read_stream",
    "register",
    "snapshot_options",
    "snapshot_reader",
    "spark_session",
    "table_changes",
]


log = logging.getLogger("pgcdc.spark")


def python_spark_home(cache: Path | None = None) -> Path | None:
    """A Spark home for local sessions whose Python workers import the installed pyspark.

    pyspark's own Spark home (its package directory, with ``bin``, ``jars``, ...) with every
    entry linked except ``python/lib/pyspark.zip`` (the py4j zip is linked), made once per
    pyspark installation under ``cache`` (default: ``$XDG_CACHE_HOME/pgcdc`` or
    ``~/.cache/pgcdc``, else the temporary directory). None when pyspark's home has no such
    zip (a Spark distribution: its workers import what it ships) or the folder cannot be made.
    """
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    lib = home / "python" / "lib"
    if not (lib / "pyspark.zip").is_file() or not (home / "bin" / "spark-submit").is_file():
        return None
    tag = hashlib.sha256(f"{home}:{pyspark.__version__}".encode()).hexdigest()[:16]
    roots = [cache] if cache is not None else _cache_roots()
    for root in roots:
        target = root / f"spark-home-{tag}"
        if (target / "bin" / "spark-submit").exists():
            return target
        try:
            root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=root))
            try:
                for entry in home.iterdir():
                    if entry.name != "python":
                        (staging / entry.name).symlink_to(entry)
                (staging / "python" / "lib").mkdir(parents=True)
                for entry in lib.iterdir():
                    if entry.name != "pyspark.zip":
                        (staging / "python" / "lib" / entry.name).symlink_to(entry)
                staging.rename(target)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if not (target / "bin" / "spark-submit").exists():  # not made by another
                    raise
        except OSError as exc:
            log.debug("no Spark home of pgcdc's under %s (%s)", root, exc)
            continue
        return target
    return None


def _cache_roots() -> list[Path]:
    roots = []
    if os.environ.get("XDG_CACHE_HOME"):
        roots.append(Path(os.environ["XDG_CACHE_HOME"]) / "pgcdc")
    roots.append(Path.home() / ".cache" / "pgcdc")
    roots.append(Path(tempfile.gettempdir()) / f"pgcdc-{os.getuid()}")
    return roots


def register(spark: SparkSession) -> None:
    """Register the ``pgcdc`` data source with a session (idempotent)."""
    from pgcdc.spark.source import PgcdcDataSource

    spark.dataSource.register(PgcdcDataSource)


def local_cores(master: str) -> int:
    """The cores of a ``local``, ``local[N]``, ``local[*]`` or ``local[N,F]`` master."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master.strip())
    if match is None or match.group(1) is None:
        return 1
    if match.group(1) == "*":
        return os.cpu_count() or 1
    return max(int(match.group(1)), 1)


#: G1 regions no smaller than this: the default for heaps under 8 GiB is smaller
G1_REGION = 4 << 20


def driver_java_options(settings: Mapping[str, str]) -> str:
    """``spark.driver.extraJavaOptions`` of ``settings`` after pgcdc's own options (which it can
    override: of two values of an option the JVM takes the later one): exit on
    OutOfMemoryError, so that pgcdc reports it, instead of going on with dead threads; pgcdc's
    log4j 2 configuration (``pgcdc.spark.console``); and, for a heap (``spark.driver.memory``)
    under 8 GiB, G1 regions of 4 MiB instead of G1's 1 or 2 MiB.

    G1 gives an object of half a region or more regions of its own (a humongous object), and
    Spark allocates many arrays just over 1 MiB (a sort's spill readers, a cached micro-batch's
    column buffers): with 1 MiB regions each takes two regions, twice its size; with 4 MiB
    regions they share regions with other objects."""
    options = ["-XX:+ExitOnOutOfMemoryError"]
    log4j2 = log4j2_option()
    if log4j2 is not None:
        options.append(log4j2)
    memory = settings.get("spark.driver.memory", "1g")
    heap = _jvm_size(memory)
    if heap is None or heap < 2048 * G1_REGION:
        options.append(f"-XX:G1HeapRegionSize={G1_REGION >> 20}m")
    options.append(settings.get("spark.driver.extraJavaOptions", ""))
    return " ".join(options).strip()


def _jvm_size(text: str) -> int | None:
    """Bytes of a JVM memory setting such as ``512m`` or ``4g`` (a number alone is MiB, as
    ``spark.driver.memory`` reads it); None if it is not one."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(b|[kmgtp]b?)?\s*", text.lower())
    if match is None:
        return None
    unit = (match.group(2) or "m")[0]
    return int(match.group(1)) << {"b": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50}[unit]


def spark_session(
    master: str = "local[2]",
    app_name: str = "pgcdc",
    conf: Mapping[str, str] | None = None,
    *,
    class_data_sharing: bool = True,
) -> SparkSession:
    """A SparkSession (created or reused) with pgcdc registered.

    ``master``: ``local[N]``, ``spark://host:port`` (standalone) or ``sc://host:port`` (Spark
    Connect; the server's own configuration decides its Python). Python workers use
    ``sys.executable``; local sessions bind the driver to 127.0.0.1, use as many shuffle
    partitions (and default parallelism) as they have cores, and, without ``SPARK_HOME`` in the
    environment, ``python_spark_home`` (see the module doc); the UI is off, the session time
    zone is UTC, and the driver JVM gets pgcdc's options (``driver_java_options``) before
    ``conf``'s ``spark.driver.extraJavaOptions`` (which can override them). A driver JVM this
    call launches maps Spark's classes from a class data sharing archive, or writes one when it
    exits (``pgcdc.spark.jvm``), unless ``class_data_sharing`` is False. It starts with SIGTERM
    ignored, as do the processes it starts (``pgcdc.spark.jvm.deaf_to_sigterm``, with the
    daemon module ``pgcdc.spark.daemon`` unless ``conf`` names another): a stop signal is for
    the caller, which stops Spark, or exits and takes Spark with it. It writes its standard
    output and error into this process, which logs them (``pgcdc.spark.console``, which also
    keeps Py4J's records of a failed callback for DEBUG).
    """
    from pyspark.sql import SparkSession

    python = sys.executable
    if master.startswith("sc://"):
        builder = SparkSession.builder.remote(master).appName(app_name)
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        register(spark)
        return spark
    os.environ["PYSPARK_PYTHON"] = python
    os.environ["PYSPARK_DRIVER_PYTHON"] = python
    quiet_callback_errors()
    # pyspark's Py4J converters import its test helpers, which check the pandas version and
    # warn; pgcdc does not use pandas
    warnings.filterwarnings(
        "ignore", "PySpark does not yet fully support pandas", FutureWarning, "pyspark"
    )
    settings: dict[str, str] = {
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        "spark.executorEnv.PYSPARK_PYTHON": python,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.daemon.module": "pgcdc.spark.daemon",
    }
    if master.startswith("local"):
        if not os.environ.get("SPARK_HOME"):
            spark_home = python_spark_home()
            if spark_home is not None:
                # read when the JVM is launched (a session already running keeps its own)
                os.environ["SPARK_HOME"] = str(spark_home)
                log.debug("Spark home %s: workers import the installed pyspark", spark_home)
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        cores = str(local_cores(master))
        settings["spark.sql.shuffle.partitions"] = cores
        settings["spark.default.parallelism"] = cores
    settings.update(conf or {})
    settings["spark.driver.extraJavaOptions"] = driver_java_options(settings)
    launching = _launches_jvm()
    launch = _class_data_sharing(settings) if class_data_sharing and launching else None
    if launch is not None:
        options = settings.get("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = " ".join([options, *launch.options]).strip()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        with deaf_to_sigterm():
            jvm = {**settings, "spark.master": master, "spark.app.name": app_name}
            spark = _get_or_create(builder, jvm if launching else None)
    except BaseException:
        if launch is not None and launch.writer is not None:
            launch.writer.finish(None)  # releases the lock
        raise
    if launch is not None and launch.writer is not None:
        atexit.register(_write_archive, launch.writer)
    register(spark)
    return spark


def driver_exit(timeout: float = 10.0) -> int | None:
    """The exit status of the driver JVM this process launched, once it exited (waiting up to
    ``timeout`` seconds for one that is exiting), as ``subprocess`` gives it: ``-N`` when
    signal N killed it; None while it runs, or when this process launched none."""
    import subprocess

    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is None:
        return None
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return int(code)


#: seconds the exit hook waits for Spark to stop before it lets the JVM exit anyway
STOP_TIMEOUT = 120.0


def _write_archive(writer: ArchiveWriter) -> None:
    """At exit of a process whose JVM writes the class data archive: stop Spark, then let the
    JVM exit and install what it wrote."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:

        def stop() -> None:
            with contextlib.suppress(Exception):  # a context broken already: the JVM exits anyway
                context.stop()

        # a wedged JVM must not hang the exit: finish() bounds its own wait for the JVM
        stopper = threading.Thread(target=stop, name="pgcdc-spark-stop", daemon=True)
        stopper.start()
        stopper.join(STOP_TIMEOUT)
    writer.finish(getattr(SparkContext._gateway, "proc", None))


def _launches_jvm() -> bool:
    """Whether the next SparkContext of this process launches the driver JVM: not when one
    runs already, or ``spark-submit`` launched it (pyspark connects to its gateway)."""
    from pyspark import SparkContext

    return SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT")


def _get_or_create(builder: Any, jvm_settings: Mapping[str, str] | None) -> SparkSession:
    """``builder.getOrCreate()``; given ``jvm_settings`` to launch the driver JVM with (this
    call launches it), launched first with its console relayed (``pgcdc.spark.console``)."""
    if jvm_settings is not None:
        launch_gateway(jvm_settings)
    return builder.getOrCreate()  # type: ignore[no-any-return]


def _class_data_sharing(settings: Mapping[str, str]) -> JavaLaunch | None:
    """``pgcdc.spark.jvm.launch_options`` for the driver JVM this process is about to launch."""
    from pyspark.find_spark_home import _find_spark_home

    try:
        spark_home = Path(os.environ.get("SPARK_HOME") or _find_spark_home())
    except Exception:  # no Spark home found: the launch fails on its own
        return None
    return launch_options(spark_home, settings, _cache_roots())


def _driver_host(spark: SparkSession) -> str | None:
    try:
        value = spark.conf.get("spark.driver.host", None)
    except Exception:  # Spark Connect may not expose it
        return None
    return str(value) if value else None


def _parallelism(spark: SparkSession) -> int | None:
    """The session's default parallelism (cores of a local session), if it says."""
    try:
        value = spark.conf.get("spark.default.parallelism", None)
    except Exception:  # Spark Connect may not expose it
        return None
    try:
        parallelism = int(value) if value else 0
    except ValueError:
        return None
    return parallelism if parallelism > 0 else None


def read_stream(
    spark: SparkSession,
    dsn: str,
    slot: str,
    publications: Iterable[str],
    **options: Any,
) -> DataFrame:
    """``spark.readStream.format("pgcdc")`` with ``driverHost`` from ``spark.driver.host``.

    ``options`` are the source's options (see ``pgcdc.spark.options``), e.g.
    ``maxChangesPerTrigger=10000``. ``minPartitions`` defaults to ``spark.default.parallelism``
    when the session sets it (local sessions made by ``spark_session`` do: their cores).
    """
    names = [publications] if isinstance(publications, str) else list(publications)
    reader = (
        spark.readStream.format("pgcdc")
        .option("dsn", dsn)
        .option("slot", slot)
        .option("publications", _json_list(names))
    )
    if "driverHost" not in options:
        host = _driver_host(spark)
        if host:
            reader = reader.option("driverHost", host)
    if "minPartitions" not in options:
        parallelism = _parallelism(spark)
        if parallelism is not None:
            reader = reader.option("minPartitions", str(parallelism))
    for key, value in options.items():
        reader = reader.option(key, _option_text(value))
    return reader.load()


def read_snapshot(
    spark: SparkSession,
    dsn: str,
    *,
    exported: ExportedSnapshot | None = None,
    publications: Iterable[str] = (),
    tables: Iterable[str | tuple[str, str]] = (),
    row_filters: Mapping[str, str | list[str]] | None = None,
    **options: Any,
) -> DataFrame:
    """``spark.read.format("pgcdc")`` over an exported snapshot.

    ``exported`` (from ``pgcdc.replication.create_slot_with_snapshot``) gives the snapshot and
    its consistent point; keep it held until the DataFrame has been written. ``row_filters``:
    table -> SQL expression(s), OR-combined with the publications' filters.
    """
    texts = snapshot_options(
        dsn,
        exported=exported,
        publications=publications,
        tables=tables,
        row_filters=row_filters,
        **options,
    )
    return spark.read.format("pgcdc").options(**texts).load()


def snapshot_reader(
    options: Mapping[str, str], *, only: Collection[str] | None = None
) -> PgcdcSnapshotReader:
    """The snapshot reader a ``spark.read.format("pgcdc")`` with these ``options`` (say from
    ``snapshot_options``) reads through, for callers that run its partitions themselves
    (``partitions()``, then ``read(partition)`` on executors: Arrow record batches of
    ``arrow_output_schema(reader.schema)``), as the lake's initial copy does to write Parquet
    files in the same task that decodes the rows. Reads the catalog now. ``only``: read just
    these of the tables the options name (``schema.table``), as the publications publish them
    (their row filters and columns): the lake's copy of tables added to a pipeline."""
    import dataclasses

    from pgcdc.spark.errors import OptionError
    from pgcdc.spark.options import snapshot_settings, type_choices
    from pgcdc.spark.schema import source_schema
    from pgcdc.spark.snapshot import PgcdcSnapshotReader
    from pgcdc.spark.source import load_source_catalog

    settings = snapshot_settings(options)
    catalog = load_source_catalog(options)
    if only is not None:
        wanted = set(only)
        kept = tuple(t for t in catalog.tables if f"{t.schema}.{t.name}" in wanted)
        missing = wanted - {f"{t.schema}.{t.name}" for t in kept}
        if missing:
            raise OptionError(
                f"table(s) {', '.join(sorted(missing))} are not among the tables read",
                "publish them, or name them in the 'tables' option",
            )
        catalog = dataclasses.replace(catalog, tables=kept)
    schema = source_schema(catalog, type_choices(options))
    point = PgcdcSnapshotReader.resolve_consistent_point(settings)
    return PgcdcSnapshotReader(settings, catalog, schema, point)


def snapshot_options(
    dsn: str,
    *,
    exported: ExportedSnapshot | None = None,
    publications: Iterable[str] = (),
    tables: Iterable[str | tuple[str, str]] = (),
    row_filters: Mapping[str, str | list[str]] | None = None,
    **options: Any,
) -> dict[str, str]:
    """The ``pgcdc`` source's options (text) for a snapshot read (``read_snapshot``'s
    parameters)."""
    import json

    texts = {"dsn": dsn}
    pubs = [publications] if isinstance(publications, str) else list(publications)
    if pubs:
        texts["publications"] = _json_list(pubs)
    names = list(tables)
    if names:
        texts["tables"] = json.dumps([list(n) if isinstance(n, tuple) else n for n in names])
    if exported is not None:
        texts["snapshot"] = exported.snapshot_name
        texts["consistentPoint"] = str(exported.consistent_point)
    if row_filters:
        texts["rowFilters"] = json.dumps(dict(row_filters))
    for key, value in options.items():
        texts[key] = _option_text(value)
    return texts


def _json_list(names: list[str]) -> str:
    import json

    return json.dumps(names)


def _option_text(value: object) -> str:
    """An option's text: booleans as true/false, mappings and lists (``textColumns``) as JSON."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(dict(value) if isinstance(value, Mapping) else list(value))
    return str(value)


def table_changes(df: DataFrame, table: str | tuple[str, str]) -> DataFrame:
    """One table's rows of a pgcdc DataFrame, flat: the metadata columns, the new image's columns
    by name, the old image's as ``_old_<name>``, ``_old_kind`` and ``_unchanged``.

    ``table`` is ``"schema.table"`` (exactly as in ``_table_id``; double-quote parts that
    contain dots) or a ``(schema, table)`` pair.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from pgcdc.spark.options import parse_qualified_names
    from pgcdc.spark.schema import METADATA_COLUMNS, parse_table_column

    available = {
        parsed: field
        for field in df.schema.fields
        if (parsed := parse_table_column(field.name)) is not None
    }
    if isinstance(table, tuple):
        wanted = table
    elif "." in table and table.split(".", 1) and tuple(table.split(".", 1)) in available:
        wanted = tuple(table.split(".", 1))  # type: ignore[assignment]
    else:
        (wanted,) = parse_qualified_names("table", table)
    field = available.get(wanted)
    if field is None:
        known = ", ".join(sorted(f"{s}.{t}" for s, t in available))
        raise ValueError(f"the DataFrame has no table {wanted[0]}.{wanted[1]} (it has: {known})")
    column = F.col(field.name)
    struct_type = field.dataType
    assert isinstance(struct_type, StructType)
    image = struct_type["new"].dataType
    assert isinstance(image, StructType)
    names = [f.name for f in image.fields]
    return df.where(column.isNotNull()).select(
        *[F.col(c) for c in METADATA_COLUMNS],
        *[column["new"][name].alias(name) for name in names],
        *[column["old"][name].alias(f"_old_{name}") for name in names],
        column["old_kind"].alias("_old_kind"),
        column["unchanged"].alias("_unchanged"),
    )
