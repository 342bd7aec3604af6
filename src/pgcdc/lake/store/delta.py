"""Delta Lake's Spark connector: how pgcdc's Spark sessions load it, and pgcdc's writes through it.

Every Delta table of a lake is written by one library over its whole life: Delta Lake's own
Spark connector (``delta-spark``, the reference implementation of the format), on the
executors. pgcdc reads tables with delta-rs too (``pgcdc.lake.store.target``: status, verification,
tests), never writes them with it.

Sessions (``delta_settings``): the connector's jars through ``spark.jars`` (the same for local,
standalone and spark-submit runs: the driver serves them to its executors), found in
``$PGCDC_JARS``, else in the checkout's ``.cache/jars`` that ``make`` fetches from Maven Central
(``tools/jars/pom.xml``); without either, ``spark.jars.packages`` makes Spark fetch
``DELTA_PACKAGE`` itself. Plus the two settings that make Delta Spark's SQL and catalog, and a
few defaults sized for small, frequent commits (``DEFAULTS``).

Tables (``create_table``; ``on_create`` hears of each one created, wherever: the initial
copy, a table the stream creates later) have deletion vectors (a MERGE marks the rows it
replaces in a small bitmap file instead of rewriting their Parquet files: merge-on-read),
column mapping by name (any column name PostgreSQL allows, and dropping a column without
rewriting the table), and statistics on the columns MERGEs match on
(``delta.dataSkippingStatsColumns``), so a MERGE reads only the files whose key ranges hold a
key of the batch.

Writes are idempotent: each data commit carries Delta's application transaction
``(app id, version)`` (``tagged``: Delta's ``txnAppId``/``txnVersion``, for MERGE as session
settings), and Delta skips a write whose version is not above the one recorded for its app id,
so a replayed micro-batch is never applied twice. Each commit's ``userMetadata`` is
``{"pgcdc": {...}}`` (batch id, LSN range; never row values).

Commits of files pgcdc's own tasks wrote (the initial copy, the indexed write) go through the
connector's commit API, in ``pgcdc.lake.store.deltalog``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

__all__ = [
    "CHECKPOINT_EVERY",
    "CHECKPOINT_FALLBACK",
    "DELTA_PACKAGE",
    "DELTA_VERSION",
    "LOCAL_FS",
    "PGCDC_JAR",
    "append_rows",
    "cache_level",
    "conflicts",
    "conform",
    "connector_jars",
    "create_table",
    "delta_settings",
    "grows",
    "is_delta_table",
    "local_file_system",
    "on_create",
    "plain_type",
    "quiet_logs",
    "quote_name",
    "stats_json",
    "table_schema",
    "tagged",
    "user_metadata",
]

log = logging.getLogger("pgcdc.lake")

#: the connector's version (tools/jars/pom.xml and the delta-spark Python package: the same)
DELTA_VERSION = "4.4.0"
#: its Maven coordinates, for sessions without the jars at hand (``spark.jars.packages``)
DELTA_PACKAGE = f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

#: Delta's idempotent-write settings (MERGE, UPDATE, DELETE read them from the session)
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"

#: Settings pgcdc's sessions get unless ``[spark.conf]`` sets them:
DEFAULTS = {
    # rebuilding a table's state from its log after each commit runs as a Spark job in this
    # many partitions (Delta's default, 50, is sized for logs of millions of files; a lake's
    # tables have a checkpoint every ten commits): 50 tasks cost more than the work
    "spark.databricks.delta.snapshotPartitions": "2",
    # MERGE copies its source before running (a job and a copy) unless it is made of Delta
    # scans only, and refuses a cached source without that copy (a cached Delta table is not
    # pinned to a version). pgcdc's sources are cached micro-batches, a fixed range of whole
    # transactions read the same again when Spark recomputes them, and the Delta tables they
    # join are pinned when the MERGE is planned: the copy would only cost a job and the rows
    "spark.databricks.delta.merge.materializeSource": "none",
    "spark.databricks.delta.merge.failSourceCachedAfterMaterialization": "false",
    # Spark writes timestamps as INT96 by default, which readers outside Spark (delta-rs,
    # pyarrow) read as nanoseconds: outside 1677-2262 they overflow. PostgreSQL's range is wider
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # vacuum's retention is [lake] vacuum_retention_hours, which may be under Delta's 168 h
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    # a commit's checksum file (.crc, optional for every reader) is one more file written per
    # commit; the commit passes the new version's checksum to the table's state in memory
    # anyway (``deltalog.TableLog.commit``)
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
    # PySpark records each DataFrame call's Python call site in the JVM (for error messages):
    # four more gateway calls per call, and a batch of many tables builds its plan from tens
    # of thousands of them
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

#: a Delta table's log gets a checkpoint every this many commits, by maintenance
#: (``pgcdc.lake.write.maintenance``), beside the batches (``[lake] checkpoint_commits``).
#: Not Delta's 10: a checkpoint is a few Spark jobs, and a batch over many tables commits to
#: each of them
CHECKPOINT_EVERY = 50
#: the tables' own ``delta.checkpointInterval``: Delta's checkpoint in the committing thread,
#: only should maintenance fall far behind (``[lake] checkpoint_commits`` stays at most half)
CHECKPOINT_FALLBACK = 20 * CHECKPOINT_EVERY

#: every table pgcdc creates
TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "true",
    "delta.columnMapping.mode": "name",
    # Delta writes a checkpoint in the committing thread, after the commit and before the
    # commit call returns (2-4 s here, a batch's whole time again): maintenance writes them
    # instead, and this is only the fallback should it fall far behind
    "delta.checkpointInterval": str(CHECKPOINT_FALLBACK),
}


def connector_jars(*, s3: bool = False) -> tuple[Path, ...]:
    """The jars of Delta's connector to load: ``$PGCDC_JARS`` (a folder), else the source
    checkout's ``.cache/jars`` (``make`` fills it); empty when neither has any. With ``s3``,
    also Hadoop's S3A connector: ``$PGCDC_S3_JARS``, else ``.cache/jars-s3``."""
    cache = Path(__file__).resolve().parents[4] / ".cache"
    folders = [Path(os.environ.get("PGCDC_JARS") or cache / "jars")]
    if s3:
        folders.append(Path(os.environ.get("PGCDC_S3_JARS") or cache / "jars-s3"))
    return tuple(
        jar for folder in folders if folder.is_dir() for jar in sorted(folder.glob("*.jar"))
    )


def s3_jars_missing() -> str | None:
    """Why an s3:// lake cannot be written (no S3A connector among the jars), if so."""
    if any(j.name.startswith("hadoop-aws-") for j in connector_jars(s3=True)):
        return None
    return (
        "an s3:// lake needs Hadoop's S3A connector (hadoop-aws), which is not in "
        "$PGCDC_S3_JARS or .cache/jars-s3. Fix: run `make setup` (it fetches the jars of "
        "tools/jars/s3/pom.xml from Maven Central)"
    )


def _add_to_list(
    settings: dict[str, str], key: str, values: Sequence[str], *, sep: str = ","
) -> None:
    """Append ``values`` to a ``sep``-separated setting, keeping what it had first."""
    have = [v.strip() for v in settings.get(key, "").split(sep) if v.strip()]
    settings[key] = sep.join(have + [v for v in values if v not in have])


#: pgcdc's own jar (``jvm/``, built by ``make setup`` into ``.cache/jars``): Hadoop's local
#: file system without forked shell commands, and the batched calls of a Delta commit
#: (``pgcdc.lake.store.deltalog``)
PGCDC_JAR = "pgcdc-jvm-"
#: Hadoop's classes for file:// paths when that jar is loaded. Without Hadoop's native library
#: (no Maven artifact ships it) Hadoop forks ``chmod`` for every file and folder Spark or Delta
#: creates and ``readlink`` twice for every rename through FileContext: eight processes a
#: Delta commit, most of a many-table batch's commit time on a local lake
LOCAL_FS = {
    "spark.hadoop.fs.file.impl": "dev.pgcdc.hadoop.ForklessLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "dev.pgcdc.hadoop.ForklessLocalFs",
}


def local_file_system(settings: dict[str, str]) -> None:
    """Add ``LOCAL_FS`` to the settings of a local session (``local[N]``: the driver is the
    executors) when pgcdc's own jar is among the jars, keeping classes ``settings`` sets: the
    jar on the driver's class path too (Hadoop loads its file system classes before Spark adds
    ``spark.jars``). A cluster's executors keep Hadoop's classes: a jar's path here means
    nothing on their machines."""
    jar = next((j for j in connector_jars() if j.name.startswith(PGCDC_JAR)), None)
    if jar is None or any(key in settings for key in LOCAL_FS):
        return
    settings.update(LOCAL_FS)
    _add_to_list(settings, "spark.driver.extraClassPath", [str(jar)], sep=os.pathsep)


def delta_settings(conf: Mapping[str, str] | None = None, *, s3: bool = False) -> dict[str, str]:
    """``conf`` (a session's Spark settings) with Delta's connector added: its jars (or its
    package), SQL extension and catalog, and ``DEFAULTS`` where ``conf`` has no value; with
    ``s3``, Hadoop's S3A connector's jars too."""
    settings = dict(conf or {})
    jars = connector_jars(s3=s3)
    if jars:
        _add_to_list(settings, "spark.jars", [str(j) for j in jars])
    else:
        log.info(
            "no jars of Delta's Spark connector in $PGCDC_JARS or .cache/jars: Spark fetches "
            "%s from Maven at start",
            DELTA_PACKAGE,
        )
        _add_to_list(settings, "spark.jars.packages", [DELTA_PACKAGE])
    _add_to_list(settings, "spark.sql.extensions", [EXTENSION])
    settings.setdefault("spark.sql.catalog.spark_catalog", CATALOG)
    for key, value in DEFAULTS.items():
        settings.setdefault(key, value)
    return settings


def cache_level() -> Any:
    """How pgcdc caches a DataFrame it reads more than once (a micro-batch; a table's MERGE
    source): serialized in memory, else on disk (``MEMORY_AND_DISK``), not ``persist``'s
    default ``MEMORY_AND_DISK_DESER``: a deserialized block on disk is unrolled into memory
    again by every later read, as far as memory lasts, and memory a task is unrolling into
    cannot be taken back for another task's sort; a serialized block on disk is read into
    memory only when all of it fits, and otherwise read from the disk."""
    from pyspark import StorageLevel

    return StorageLevel.MEMORY_AND_DISK


def plain_type(dtype: Any) -> Any:
    """A Spark type with every nested field nullable and without field metadata (what two
    schemas are compared by)."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, plain_type(f.dataType), True) for f in dtype])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(plain_type(dtype.elementType), True)
    if isinstance(dtype, T.MapType):
        return T.MapType(plain_type(dtype.keyType), plain_type(dtype.valueType), True)
    return dtype


def grows(current: Any, wanted: Any) -> bool:
    """Whether ``wanted`` is ``current`` with fields added to (nested) structs only: what
    Delta adds to a table's schema without rewriting it."""
    from pyspark.sql import types as T

    if isinstance(current, T.StructType) and isinstance(wanted, T.StructType):
        have = {f.name: f.dataType for f in wanted.fields}
        return all(f.name in have and grows(f.dataType, have[f.name]) for f in current.fields)
    if isinstance(current, T.ArrayType) and isinstance(wanted, T.ArrayType):
        return grows(current.elementType, wanted.elementType)
    if isinstance(current, T.MapType) and isinstance(wanted, T.MapType):
        return grows(current.keyType, wanted.keyType) and grows(current.valueType, wanted.valueType)
    return bool(plain_type(current) == plain_type(wanted))


def conform(column: Any, current: Any, wanted: Any) -> Any:
    """``column`` (of Spark type ``current``) as type ``wanted``: struct fields matched by
    name (a field ``current`` lacks is NULL, one ``wanted`` lacks is left out), everything
    else cast."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if plain_type(current) == plain_type(wanted):
        return column
    if isinstance(current, T.StructType) and isinstance(wanted, T.StructType):
        have = {f.name: f.dataType for f in current.fields}
        fields = [
            (
                conform(column.getField(f.name), have[f.name], f.dataType)
                if f.name in have
                else F.lit(None).cast(f.dataType)
            ).alias(f.name)
            for f in wanted.fields
        ]
        return F.when(column.isNotNull(), F.struct(*fields))
    if isinstance(current, T.ArrayType) and isinstance(wanted, T.ArrayType):
        return F.transform(
            column, lambda element: conform(element, current.elementType, wanted.elementType)
        )
    return column.cast(wanted)


def append_rows(
    spark: Any,
    path: Path | str,
    rows: Any,
    *,
    app_id: str,
    version: int,
    metadata: Mapping[str, Any],
) -> None:
    """Append ``rows`` (a Spark DataFrame) to the Delta table at ``path`` in one commit tagged
    with the application transaction ``(app_id, version)`` (a replayed append is skipped), in
    the table's column order and types: a column the rows lack is NULL (a source column dropped
    since, kept by the table), struct fields are matched by name."""
    from pyspark.sql import functions as F

    stored = table_schema(spark, path)
    have = {f.name: f.dataType for f in rows.schema.fields}
    aligned = rows.select(
        *[
            (
                conform(F.col(quote_name(f.name)), have[f.name], f.dataType)
                if f.name in have
                else F.lit(None).cast(f.dataType)
            ).alias(f.name)
            for f in stored.fields
        ]
    )
    (
        aligned.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", str(int(version)))
        .option("userMetadata", user_metadata(metadata))
        .save(str(path))
    )


#: Delta's loggers that report, as errors, what is not one: with column mapping, a scan of a
#: table with deletion vectors cannot push its internal "row deleted" filter into the Parquet
#: reader and logs "Failed to translate filter" for every file it reads (the filter is applied
#: after the read instead; the rows are right)
QUIET_LOGGERS = ("org.apache.spark.sql.delta.DeltaParquetFileFormat",)


def quiet_logs(spark: Any) -> None:
    """Silence ``QUIET_LOGGERS`` in the driver's JVM (which runs a local session's tasks)."""
    jvm = spark.sparkContext._jvm
    off = jvm.org.apache.logging.log4j.Level.OFF
    for name in QUIET_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, off)


def quote_name(name: str) -> str:
    """A column name as Spark SQL and Delta's table properties quote it (backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def is_delta_table(spark: Any, path: Path | str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, str(path)))


#: called with (session, path) after ``create_table`` created a table (``on_create``)
_CREATED: list[Callable[[Any, str], None]] = []


@contextlib.contextmanager
def on_create(listener: Callable[[Any, str], None]) -> Iterator[None]:
    """Within the block, ``listener`` is called with the session and the path (as given) of
    every Delta table ``create_table`` creates, in any thread, after its first commit; what it
    raises fails the creating call (the table stays)."""
    _CREATED.append(listener)
    try:
        yield
    finally:
        _CREATED.remove(listener)


def create_table(
    spark: Any,
    path: Path | str,
    schema: Any,
    *,
    stats_columns: Sequence[str],
    what: str,
) -> bool:
    """Create the Delta table at ``path`` with ``schema`` (a Spark ``StructType``) unless one is
    there; whether it was created. ``stats_columns``: the columns whose min/max each file
    records (what MERGEs match on)."""
    from delta.tables import DeltaTable

    if is_delta_table(spark, path):
        return False
    builder = DeltaTable.createIfNotExists(spark).location(str(path)).addColumns(schema)
    for key, value in TABLE_PROPERTIES.items():
        builder = builder.property(key, value)
    if stats_columns:
        builder = builder.property(
            "delta.dataSkippingStatsColumns", ",".join(quote_name(c) for c in stats_columns)
        )
    builder.execute()
    log.info("created Delta table for %s at %s", what, path)
    for listener in tuple(_CREATED):
        listener(spark, str(path))
    return True


def table_schema(spark: Any, path: Path | str) -> Any:
    """The current schema (a Spark ``StructType``) of the Delta table at ``path``."""
    return spark.read.format("delta").load(str(path)).schema


def user_metadata(metadata: Mapping[str, Any]) -> str:
    """A commit's ``userMetadata``: ``{"pgcdc": metadata}`` as JSON."""
    return json.dumps({"pgcdc": dict(metadata)}, sort_keys=True, default=str)


@contextlib.contextmanager
def tagged(
    spark: Any, app_id: str | None, version: int | None, metadata: Mapping[str, Any]
) -> Iterator[None]:
    """Within the block, the session's Delta writes (MERGE, UPDATE, DELETE) carry the
    application transaction ``(app_id, version)`` (none when ``app_id`` is None) and
    ``metadata`` as their commit's ``userMetadata``. Writes run one at a time per session in a
    pipeline (the threads writing a batch's tables each have a session of their own), so
    session settings are safe here."""
    conf = spark.conf
    keys = [USER_METADATA]
    conf.set(USER_METADATA, user_metadata(metadata))
    if app_id is not None and version is not None:
        conf.set(TXN_APP_ID, app_id)
        conf.set(TXN_VERSION, str(int(version)))
        keys += [TXN_APP_ID, TXN_VERSION]
    try:
        yield
    finally:
        for key in keys:
            conf.unset(key)


def _json_value(value: Any) -> str:
    """A statistic's value as JSON; decimals as exact JSON numbers (as Delta writes them)."""
    if isinstance(value, Decimal):
        text = format(value, "f")
        return text if text not in ("NaN", "Infinity", "-Infinity") else "null"
    return json.dumps(value, ensure_ascii=False)


def stats_json(
    rows: int,
    minimum: Mapping[str, Any],
    maximum: Mapping[str, Any],
    nulls: Mapping[str, int],
) -> str:
    """Delta's per-file statistics (``numRecords``, ``minValues``, ``maxValues``,
    ``nullCount``; keys are the columns' physical names), values already in their JSON form
    (``_json_value``)."""

    def obj(values: Mapping[str, Any]) -> str:
        return "{" + ",".join(f"{json.dumps(k)}:{_json_value(v)}" for k, v in values.items()) + "}"

    return (
        f'{{"numRecords":{int(rows)},"minValues":{obj(minimum)},"maxValues":{obj(maximum)},'
        f'"nullCount":{obj(nulls)}}}'
    )


def conflicts() -> tuple[type[BaseException], ...]:
    """Delta's exceptions for a commit that lost to a concurrent one (nothing of it is in the
    table; writing it again is safe)."""
    # each of Delta's Python conflict classes derives from PySparkException alone
    from delta.exceptions import (
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
    )

    return (
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
    )
