"""Does the mirror equal its source table? Counts and an order-independent checksum per table.

Both sides are brought to the same canonical values: the lake's Arrow values as delta-rs stores
them, the source's through SQL expressions chosen by the lake column's type (text for string
columns, which is how the lake stores json, uuid, inet, bit, numeric beyond 38 digits, ...;
``float8`` for ``real``; microseconds since the epoch for timestamps, days for dates, the
storage type's extremes for infinities; months/days/microseconds for intervals). Each row
becomes a canonical text; the checksum is SHA-256 over the sorted row texts, so equal checksums
mean equal multisets of rows. The source side applies the table's row filter, as the
publication does. Reports carry counts, checksums and column names, never row values.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from pgcdc.filters import RowFilter
from pgcdc.lake.run.catalog import source_columns
from pgcdc.lake.store.tables import MIRROR_COLUMNS, LakeLayout, LakeTable
from pgcdc.lake.store.target import DeltaTarget
from pgcdc.replication.database import (
    UNLIMITED_TRANSACTION,
    connect_sql,
    with_codec_settings,
    without_time_limits,
)
from pgcdc.spark.catalog import relation_scope

__all__ = ["TableCheck", "compare_mirror", "compare_tables", "lake_rows", "source_rows"]

# What the Spark source gives for ±infinity: the ends of Spark's range (years 1 to 9999)
_TS_MIN = -62135596800000000  # 0001-01-01 00:00:00
_TS_MAX = 253402300799999999  # 9999-12-31 23:59:59.999999
_DATE_MIN = -719162  # 0001-01-01
_DATE_MAX = 2932896  # 9999-12-31


@dataclass(frozen=True, slots=True)
class TableCheck:
    table_id: str
    source_rows: int
    lake_rows: int
    source_checksum: str
    lake_checksum: str
    missing_columns: tuple[str, ...]  # in the source, not in the mirror
    extra_columns: tuple[str, ...]  # in the mirror, not in the source
    only_in_source: int  # rows (counted with multiplicity) the mirror lacks
    only_in_lake: int

    @property
    def equal(self) -> bool:
        return (
            not self.missing_columns
            and not self.extra_columns
            and self.source_checksum == self.lake_checksum
        )

    def describe(self) -> str:
        status = "equal" if self.equal else "DIFFERENT"
        text = (
            f"{self.table_id}: {status}; source {self.source_rows} rows "
            f"{self.source_checksum[:16]}, lake {self.lake_rows} rows {self.lake_checksum[:16]}"
        )
        if self.missing_columns:
            text += f"; columns missing in the lake: {', '.join(self.missing_columns)}"
        if self.extra_columns:
            text += f"; extra columns in the lake: {', '.join(self.extra_columns)}"
        if self.only_in_source or self.only_in_lake:
            text += (
                f"; {self.only_in_source} rows only in the source, {self.only_in_lake} only in "
                "the lake"
            )
        return text


def _canonical(value: Any) -> str:
    if value is None:
        return "∅"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return repr(value)
    if isinstance(value, Decimal):
        if value.is_nan():
            return "NaN"
        return format(value.normalize(), "f") if value else "0"
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, list | tuple):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_canonical(value[k])}" for k in sorted(value)) + "}"
    return f"{type(value).__name__}:{value}" if not isinstance(value, int | str) else str(value)


def _row_text(values: Sequence[Any]) -> str:
    return "\x1f".join(_canonical(v) for v in values)


def _lake_array(array: pa.ChunkedArray | pa.Array) -> list[Any]:
    """Python values of a lake column, timestamps and dates as integers."""
    values: list[Any] = _as_ints(array).to_pylist()
    return values


def _int_type(t: pa.DataType) -> pa.DataType | None:
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _int_type(t.value_type)
        return None if inner is None else pa.list_(inner)
    if pa.types.is_struct(t):
        fields = [(f.name, _int_type(f.type)) for f in t]
        if all(ft is None for _, ft in fields):
            return None
        return pa.struct([(n, ft if ft is not None else t.field(n).type) for n, ft in fields])
    return None


def _as_ints(array: Any) -> Any:
    target = _int_type(array.type)
    if target is None:
        return array
    return pc.cast(array, target)


def _source_expr(column: str, t: pa.DataType) -> sql.Composable:
    ident = sql.Identifier(column)
    return _expr(ident, t)


def _expr(ident: sql.Composable, t: pa.DataType) -> sql.Composable:
    if pa.types.is_timestamp(t):
        return sql.SQL(
            "CASE WHEN {c} IS NULL THEN NULL WHEN isfinite({c}) THEN "
            "(extract(epoch from {c}) * 1000000)::bigint "
            "WHEN {c} > 'epoch' THEN {max}::bigint ELSE {min}::bigint END"
        ).format(c=ident, max=sql.Literal(str(_TS_MAX)), min=sql.Literal(str(_TS_MIN)))
    if pa.types.is_date32(t):
        return sql.SQL(
            "CASE WHEN {c} IS NULL THEN NULL WHEN isfinite({c}) THEN ({c} - DATE '1970-01-01') "
            "WHEN {c} > DATE '1970-01-01' THEN {max}::int ELSE {min}::int END"
        ).format(c=ident, max=sql.Literal(str(_DATE_MAX)), min=sql.Literal(str(_DATE_MIN)))
    if pa.types.is_struct(t) and {f.name for f in t} == {"months", "days", "microseconds"}:
        return sql.SQL(
            "CASE WHEN {c} IS NULL THEN NULL ELSE json_build_object("
            "'months', (extract(year from {c}) * 12 + extract(month from {c}))::int, "
            "'days', extract(day from {c})::int, "
            "'microseconds', (extract(hour from {c}) * 3600000000 + extract(minute from {c}) "
            "* 60000000 + extract(microseconds from {c}))::bigint) END"
        ).format(c=ident)
    if pa.types.is_float32(t):
        return sql.SQL("{}::float8").format(ident)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        # the type's output function, as the stream carries it (::text trims char(n), adds
        # inet's netmask)
        return sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END").format(c=ident)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = t.value_type
        if pa.types.is_float32(inner):
            return sql.SQL("{}::float8[]").format(ident)
        if (
            _int_type(inner) is not None
            or pa.types.is_struct(inner)
            or pa.types.is_string(inner)
            or pa.types.is_large_string(inner)
        ):
            element = _expr(sql.Identifier("__u"), inner)
            return sql.SQL(
                "CASE WHEN {c} IS NULL THEN NULL ELSE ARRAY(SELECT {e} FROM unnest({c}) "
                "WITH ORDINALITY AS __a(__u, __n) ORDER BY __n) END"
            ).format(c=ident, e=element)
        return ident
    return ident


def lake_rows(target: DeltaTarget, columns: Sequence[str]) -> list[str]:
    """Canonical row texts of the mirror's ``columns``."""
    if not target.exists():
        return []
    table = target.read(columns=list(columns))
    arrays = [_lake_array(table.column(c)) for c in columns]
    return [_row_text(row) for row in zip(*arrays, strict=True)] if arrays else []


def source_rows(
    dsn: str,
    table: LakeTable,
    columns: Sequence[str],
    types: Sequence[pa.DataType],
) -> list[str]:
    """Canonical row texts of the source table (with its row filter)."""
    exprs = [_source_expr(c, t) for c, t in zip(columns, types, strict=True)]
    query = sql.SQL("SELECT {} FROM {}{}").format(
        sql.SQL(", ").join(exprs) if exprs else sql.SQL("1"),
        relation_scope(table.relkind),
        sql.Identifier(table.schema, table.name),
    )
    if table.row_filter:
        # the server's printed filter, parsed and printed back (plan_source checked it parses)
        where = RowFilter.parse(table.row_filter).sql()
        query = sql.SQL("{} WHERE ({})").format(query, sql.SQL(where.text))
    # under the output settings the lake's text was printed with (time zone, floats, dates),
    # and without the database's time limits, as the copy reads (a whole table takes a while)
    reader = without_time_limits(with_codec_settings(dsn))
    with connect_sql(reader) as conn, conn.cursor() as cur:
        cur.execute(UNLIMITED_TRANSACTION)
        cur.execute(query)
        return [_row_text(row) for row in cur] if exprs else ["" for _ in cur]


def _checksum(rows: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for row in sorted(rows):
        digest.update(row.encode("utf-8", "surrogatepass"))
        digest.update(b"\x1e")
    return digest.hexdigest()


def compare_mirror(dsn: str, layout: LakeLayout, table: LakeTable) -> TableCheck:
    """Compare one mirror with its source table (the columns both have, and the column sets)."""
    target = DeltaTarget(table.path(layout, "mirror"))
    schema = target.arrow_schema() or pa.schema([])
    lake_columns = [f.name for f in schema if f.name not in MIRROR_COLUMNS]
    columns_now = source_columns(dsn, table)
    common = [c for c in columns_now if c in lake_columns]
    types = [schema.field(c).type for c in common]
    lake = lake_rows(target, common)
    source = source_rows(dsn, table, common, types)
    lake_count, source_count = Counter(lake), Counter(source)
    return TableCheck(
        table_id=table.table_id,
        source_rows=len(source),
        lake_rows=len(lake),
        source_checksum=_checksum(source),
        lake_checksum=_checksum(lake),
        missing_columns=tuple(c for c in columns_now if c not in lake_columns),
        extra_columns=tuple(c for c in lake_columns if c not in columns_now),
        only_in_source=sum((source_count - lake_count).values()),
        only_in_lake=sum((lake_count - source_count).values()),
    )


def compare_tables(dsn: str, layout: LakeLayout, tables: Sequence[LakeTable]) -> list[TableCheck]:
    return [compare_mirror(dsn, layout, t) for t in tables]
