"""pgcdc on Spark: the ``pgcdc`` data source (PySpark's Python Data Source API, Spark 4.2+).

Layer: uses ``pgcdc.protocol``, ``pgcdc.replication`` and (for snapshot row filters)
``pgcdc.filters``.

Stream: ``spark.readStream.format("pgcdc")`` (or ``read_stream(spark, dsn, slot, publications)``)
reads one logical replication slot, for every table of its publications, into ONE DataFrame:
metadata columns plus one struct column per table (``table_column(schema, table)``), typed from
the catalog; ``table_changes(df, "schema.table")`` flattens one table's rows. Offsets are commit
LSNs; a batch holds whole transactions; the slot is confirmed only in ``commit()``, after Spark
committed the batch, so a restart replays an uncommitted batch with exactly the same rows. The
WAL is received once, in the driver-side reader process, spooled to local disk and served to
executors over TCP; executors need no shared disk. See ``pgcdc.spark.stream``.

Snapshot: ``spark.read.format("pgcdc")`` (or ``read_snapshot(spark, dsn, exported=...)``) copies
the tables in parallel inside the snapshot the slot exported, in the same schema. See
``pgcdc.spark.snapshot``.

Options: ``pgcdc.spark.options``. Schema and type mapping: ``pgcdc.spark.schema``. A table
definition change the query's schema lacks fails the batch with ``SchemaChanged``
(``is_schema_changed`` recognises it through Spark's wrapping); restart the query.

Public API:

* ``register(spark)``: register the ``pgcdc`` data source;
* ``spark_session(master="local[2]", app_name="pgcdc", conf=None)``;
* ``read_stream(spark, dsn, slot, publications, **options)``,
  ``read_snapshot(spark, dsn, exported=..., publications=..., tables=..., row_filters=...)``,
  ``snapshot_reader(snapshot_options(dsn, ...))`` (the same snapshot's reader, to run its
  partitions yourself);
* ``table_column(schema, table)``, ``parse_table_column(name)``, ``table_changes(df, table)``,
  ``METADATA_COLUMNS``;
* ``SchemaChanged``, ``CopyAgain``, ``is_schema_changed``, ``raised_as``, ``SparkSourceError``,
  ``OptionError``.
"""

from pgcdc.spark.errors import (
    SCHEMA_CHANGED_MARKER,
    CopyAgain,
    EndpointError,
    OptionError,
    ReplayError,
    SchemaChanged,
    SparkSourceError,
    is_schema_changed,
    raised_as,
)
from pgcdc.spark.schema import METADATA_COLUMNS, parse_table_column, table_column
from pgcdc.spark.session import (
    read_snapshot,
    read_stream,
    register,
    snapshot_options,
    snapshot_reader,
    spark_session,
    table_changes,
)

__all__ = [
    "METADATA_COLUMNS",
    "SCHEMA_CHANGED_MARKER",
    "CopyAgain",
    "EndpointError",
    "OptionError",
    "ReplayError",
    "SchemaChanged",
    "SparkSourceError",
    "is_schema_changed",
    "parse_table_column",
    "raised_as",
    "read_snapshot",
    "read_stream",
    "register",
    "snapshot_options",
    "snapshot_reader",
    "spark_session",
    "table_changes",
    "table_column",
]
