"""The ``pgcdc`` data source: one class for the stream and for the initial snapshot.

``spark.readStream.format("pgcdc")`` gives a ``PgcdcStreamReader``, ``spark.read.format("pgcdc")``
a ``PgcdcSnapshotReader``; both produce the schema of ``pgcdc.spark.schema``. ``schema()`` reads
the catalog once, when the DataFrame is defined; the result travels inside this object (Spark
pickles the data source after calling ``schema()``) to every worker that needs it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from pgcdc.protocol.filter_sql import RowFilterSQL
from pgcdc.spark.catalog import SourceCatalog, load_catalog
from pgcdc.spark.diagnostics import worker_logging
from pgcdc.spark.errors import OptionError
from pgcdc.spark.options import (
    _get,
    _names,
    parse_qualified_names,
    renamed_columns,
    snapshot_settings,
    stream_settings,
    text_columns,
    type_choices,
)
from pgcdc.spark.schema import source_schema

__all__ = ["PgcdcDataSource", "load_source_catalog"]


def load_source_catalog(options: Any) -> SourceCatalog:
    """The catalog the source's options (``dsn``, ``publications``, ``tables``, row filters)
    describe, read from the database now."""
    dsn = _get(options, "dsn")
    if not dsn:
        raise OptionError(
            "the pgcdc source needs the option 'dsn'",
            '.option("dsn", "host=... dbname=... user=...")',
        )
    tables_text = _get(options, "tables")
    publications_text = _get(options, "publications")
    extra: dict[tuple[str, str], list[RowFilterSQL]] = {}
    if publications_text or tables_text:
        # row filters only matter for the snapshot; resolve them against the tables read
        from pgcdc.spark.snapshot import render_filter

        settings = snapshot_settings(options)
        extra = {
            table: [render_filter(text) for text in texts]
            for table, texts in settings.row_filters.items()
        }
    catalog = load_catalog(
        dsn,
        publications=_names("publications", publications_text) if publications_text else (),
        tables=parse_qualified_names("tables", tables_text) if tables_text else (),
        extra_filters=extra,
        text_columns=text_columns(options),
    )
    renames = renamed_columns(options)
    if renames:
        catalog = dataclasses.replace(
            catalog,
            tables=tuple(
                dataclasses.replace(t, renamed=tuple(renames[(t.schema, t.name)].items()))
                if (t.schema, t.name) in renames
                else t
                for t in catalog.tables
            ),
        )
    skip_text = _get(options, "skipTables")
    return catalog.without(parse_qualified_names("skipTables", skip_text) if skip_text else ())


class PgcdcDataSource(DataSource):
    """PostgreSQL change data capture (pgoutput) as a Spark data source named ``pgcdc``."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self._catalog: SourceCatalog | None = None
        worker_logging()

    @classmethod
    def name(cls) -> str:
        return "pgcdc"

    def _load(self) -> SourceCatalog:
        if self._catalog is None:
            self._catalog = load_source_catalog(self.options)
        return self._catalog

    def schema(self) -> StructType:
        return source_schema(self._load(), type_choices(self.options))

    def _checked_schema(self, schema: StructType) -> StructType:
        ours = source_schema(self._load(), type_choices(self.options))
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in ours.fields
        ]:
            raise OptionError(
                "the pgcdc source computes its schema from the catalog; the schema given with "
                ".schema(...) differs from it",
                "do not pass a schema to spark.read/readStream.format('pgcdc')",
            )
        return schema

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pgcdc.spark.stream import PgcdcStreamReader

        worker_logging()
        settings = stream_settings(self.options)
        return PgcdcStreamReader(settings, self._load(), self._checked_schema(schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        from pgcdc.spark.snapshot import PgcdcSnapshotReader

        worker_logging()
        settings = snapshot_settings(self.options)
        point = PgcdcSnapshotReader.resolve_consistent_point(settings)
        return PgcdcSnapshotReader(settings, self._load(), self._checked_schema(schema), point)
