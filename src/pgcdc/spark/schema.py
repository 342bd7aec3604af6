"""The source's DataFrame schema: metadata columns, one struct column per table, type mapping.

One DataFrame carries every table of the publications (one slot, one decode of the WAL):

* metadata columns (``METADATA_FIELDS``): ``_table_id`` ("schema.table"), ``_schema``,
  ``_table``, ``_op`` ('I', 'U', 'D', 'T'), ``_commit_lsn`` (long), ``_commit_lsn_text``
  ("X/XXXXXXXX"), ``_end_lsn`` (long), ``_position`` (int: the row's position within its
  transaction, from 0; -1 for snapshot rows), ``_xid`` (long; null for snapshot rows) and
  ``_commit_time`` (timestamp; null for snapshot rows);
* per table one struct column named ``table_column(schema, table)``:
  ``struct<new: struct<columns>, old: struct<columns>, old_kind: string,
  unchanged: array<string>>``, null in the rows of other tables. ``new`` is null for a delete,
  ``old`` holds the replica identity key ('K', other columns null) or the whole old row ('O',
  REPLICA IDENTITY FULL) when the server sent one, ``unchanged`` names the columns whose value
  the server did not send because it is an unchanged TOASTed value (they read null in ``new``).
  A TRUNCATE gives one 'T' row per truncated table, with both images null.

Column naming: ``t__<schema>__<table>``, each part written as is when it is lower case letters
and digits in runs joined by single underscores (``public``, ``order_items``), else as ``_``
followed by the hex code of its UTF-8 bytes (``Orders`` -> ``_4f7264657273``). The result uses
only ``[a-z0-9_]``, needs no quoting, and no two tables share a name, even under Spark's
case-insensitive name resolution.

Types (PostgreSQL -> Spark), via the codec's Arrow types (``pgcdc.protocol.values``): bool ->
boolean; int2/int4/int8 -> short/int/long; oid, xid, cid -> long; xid8 -> decimal(20,0);
float4/float8 -> float/double; numeric(p,s) with p <= 38 -> decimal(p,s), wider or
unconstrained numeric -> string (its exact text; never a float); money -> string; text, varchar,
bpchar, name, "char", xml, uuid, inet, cidr, macaddr, bit, varbit, enums, timetz, jsonpath ->
string; json/jsonb -> string, or VARIANT with the option ``jsonAsVariant``; bytea -> binary;
date -> date; time -> string (``HH:MM:SS[.ffffff]``), or TIME(6) with the option
``timeAsTime`` (Spark needs ``spark.sql.timeType.enabled=true``); timestamp -> timestamp_ntz;
timestamptz -> timestamp;
interval -> struct<months: int, days: int, microseconds: long> (exact, no normalisation);
arrays -> array of the element's type; domains -> their base type; every type the codec does
not know (geometric, ranges, composites, extension types) -> string, its text form.
Infinite dates and timestamps read as the smallest/largest value of the storage type.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    TimeType,
    VariantType,
)

from pgcdc.protocol.arrow.typed_arrays import column_reader
from pgcdc.protocol.values import TypeRegistry, to_arrow
from pgcdc.protocol.values.adapt import UNKNOWN, plan_for
from pgcdc.spark.catalog import CatalogColumn, CatalogTable, SourceCatalog
from pgcdc.spark.conform import conform

__all__ = [
    "INTERVAL_TYPE",
    "METADATA_COLUMNS",
    "METADATA_FIELDS",
    "TableLayout",
    "TypeChoices",
    "arrow_output_schema",
    "codec_knows",
    "column_arrow_type",
    "parse_table_column",
    "registry_for",
    "source_schema",
    "spark_type",
    "table_column",
]

JSON_OID, JSONB_OID = 114, 3802

METADATA_FIELDS: tuple[StructField, ...] = (
    StructField("_table_id", StringType(), False),
    StructField("_schema", StringType(), False),
    StructField("_table", StringType(), False),
    StructField("_op", StringType(), False),
    StructField("_commit_lsn", LongType(), False),
    StructField("_commit_lsn_text", StringType(), False),
    StructField("_end_lsn", LongType(), False),
    StructField("_position", IntegerType(), False),
    StructField("_xid", LongType(), True),
    StructField("_commit_time", TimestampType(), True),
)
METADATA_COLUMNS: tuple[str, ...] = tuple(f.name for f in METADATA_FIELDS)

#: Spark type of an interval column.
INTERVAL_TYPE = StructType(
    [
        StructField("months", IntegerType(), True),
        StructField("days", IntegerType(), True),
        StructField("microseconds", LongType(), True),
    ]
)

_PLAIN = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
_COLUMN = re.compile(r"t__(.+)")


def _encode(part: str) -> str:
    if _PLAIN.fullmatch(part):
        return part
    return "_" + part.encode("utf-8").hex()


def _decode(part: str) -> str:
    if part.startswith("_"):
        return bytes.fromhex(part[1:]).decode("utf-8")
    return part


def table_column(schema: str, table: str) -> str:
    """The name of a table's struct column: ``t__<schema>__<table>`` (see the module doc)."""
    if not isinstance(schema, str) or not isinstance(table, str) or not schema or not table:
        raise ValueError(f"table_column needs a schema and a table name, not {schema!r}.{table!r}")
    return f"t__{_encode(schema)}__{_encode(table)}"


def parse_table_column(column: str) -> tuple[str, str] | None:
    """``(schema, table)`` of a name made by ``table_column``, None for any other name."""
    match = _COLUMN.fullmatch(column)
    if match is None:
        return None
    rest = match.group(1)
    cut = rest.find("__", 1)
    if cut < 0:
        return None
    first, second = rest[:cut], rest[cut + 2 :]
    try:
        schema, table = _decode(first), _decode(second)
    except (ValueError, UnicodeDecodeError):
        return None
    if table_column(schema, table) != column:
        return None
    return schema, table


def registry_for(catalog: SourceCatalog) -> TypeRegistry:
    """A type registry with the catalog's user types."""
    return TypeRegistry(catalog.types)


def missing_array(
    column: CatalogColumn, registry: TypeRegistry, target: pa.DataType
) -> pa.Array | None:
    """The column's missing value (``ADD COLUMN ... DEFAULT <constant>``: what rows written
    before the column was added read) as a one-element array of ``target``, decoded from its
    text as the stream's values are; None when it has none. Raises TypeError, ValueError,
    ArithmeticError or ``pa.ArrowException`` when it does not convert."""
    if column.missing is None:
        return None
    if column.as_text:  # attmissingval's text is what the type's output function printed
        return conform(pa.array([column.missing], pa.string()), target)
    decoded = to_arrow(
        [column.missing], column.type_oid, column.type_modifier, registry, binary=False
    )
    return conform(decoded, target)


def codec_knows(type_oid: int, registry: TypeRegistry) -> bool:
    """Whether the codec has a converter for the type (or its array element), so that its
    binary form can be read; unknown types must travel in text form."""
    plan = plan_for(type_oid, registry)
    while plan.element is not None:
        plan = plan.element
    return plan.converter is not UNKNOWN


def column_arrow_type(column: CatalogColumn, registry: TypeRegistry) -> pa.DataType:
    """The Arrow type the columnar decoder gives a column (text form for unknown types and for
    columns read as text)."""
    if column.as_text:
        return pa.string()
    return column_reader(column.type_oid, column.type_modifier, registry).arrow_type


def _is_json(type_oid: int, registry: TypeRegistry) -> bool:
    info = registry.resolve(type_oid)
    if info is not None and info.kind == "array":
        info = registry.resolve(info.element_oid)
    return info is not None and info.oid in (JSON_OID, JSONB_OID)


@dataclass(frozen=True, slots=True)
class TypeChoices:
    """Optional mappings: json/jsonb as VARIANT; time as TIME (Spark needs
    ``spark.sql.timeType.enabled``), else as its text."""

    json_as_variant: bool = False
    time_as_time: bool = False


def spark_type(
    arrow: pa.DataType, *, variant: bool = False, time_as_time: bool = False
) -> DataType:
    """The Spark type a decoded Arrow column becomes (``variant``: strings are JSON)."""
    if pa.types.is_boolean(arrow):
        return BooleanType()
    if pa.types.is_int16(arrow):
        return ShortType()
    if pa.types.is_int32(arrow):
        return IntegerType()
    if pa.types.is_int64(arrow) or pa.types.is_uint32(arrow):
        return LongType()
    if pa.types.is_uint64(arrow):
        return DecimalType(20, 0)
    if pa.types.is_float32(arrow):
        return FloatType()
    if pa.types.is_float64(arrow):
        return DoubleType()
    if pa.types.is_decimal128(arrow):
        return DecimalType(arrow.precision, arrow.scale)
    if pa.types.is_binary(arrow) or pa.types.is_large_binary(arrow):
        return BinaryType()
    if pa.types.is_date32(arrow):
        return DateType()
    if pa.types.is_time64(arrow):
        return TimeType(6) if time_as_time else StringType()
    if pa.types.is_timestamp(arrow):
        return TimestampType() if arrow.tz is not None else TimestampNTZType()
    if arrow == pa.month_day_nano_interval():
        return INTERVAL_TYPE
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        element = spark_type(arrow.value_type, variant=variant, time_as_time=time_as_time)
        return ArrayType(element, True)
    if variant and (pa.types.is_string(arrow) or pa.types.is_large_string(arrow)):
        return VariantType()
    return StringType()  # strings, decimal256 (numeric wider than 38 digits), anything else


def _column_metadata(column: CatalogColumn) -> dict[str, Any]:
    return {
        "pg_type": column.type_name,
        "pg_type_oid": column.type_oid,
        "pg_type_modifier": column.type_modifier,
        "key": column.key,
    }


def _image_type(table: CatalogTable, registry: TypeRegistry, choices: TypeChoices) -> StructType:
    fields = []
    for column in table.columns:
        arrow = column_arrow_type(column, registry)
        variant = (
            choices.json_as_variant and not column.as_text and _is_json(column.type_oid, registry)
        )
        typ = spark_type(arrow, variant=variant, time_as_time=choices.time_as_time)
        fields.append(StructField(column.name, typ, True, _column_metadata(column)))
    return StructType(fields)


def table_struct_type(
    table: CatalogTable, registry: TypeRegistry, choices: TypeChoices | None = None
) -> StructType:
    """``struct<new, old, old_kind, unchanged>`` of one table."""
    image = _image_type(table, registry, choices or TypeChoices())
    return StructType(
        [
            StructField("new", image, True),
            StructField("old", image, True),
            StructField("old_kind", StringType(), True),
            StructField("unchanged", ArrayType(StringType(), True), True),
        ]
    )


def source_schema(catalog: SourceCatalog, choices: TypeChoices | None = None) -> StructType:
    """The DataFrame schema of a source over ``catalog``'s tables."""
    registry = registry_for(catalog)
    fields = list(METADATA_FIELDS)
    seen: dict[str, str] = {}
    for table in catalog.tables:
        name = table_column(table.schema, table.name)
        if name.lower() in seen:  # impossible by construction; keep the invariant checked
            raise AssertionError(f"{table.qualified} and {seen[name.lower()]} share column {name}")
        seen[name.lower()] = table.qualified
        fields.append(
            StructField(
                name,
                table_struct_type(table, registry, choices),
                True,
                {
                    "pgcdc_schema": table.schema,
                    "pgcdc_table": table.name,
                    "pgcdc_relid": table.relid,
                    "pgcdc_replica_identity": table.replica_identity,
                    "pgcdc_key": [c.name for c in table.columns if c.key],
                },
            )
        )
    return StructType(fields)


def arrow_output_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects from ``read()`` for ``schema`` (exactly, field names and
    nullability included)."""
    return to_arrow_schema(schema, timezone="UTC")


@dataclass(frozen=True, slots=True, eq=False)
class TableLayout:
    """Where one table's rows go in the output: its struct column and Arrow types."""

    table: CatalogTable
    index: int  # position of the struct column in the output schema
    struct_type: pa.StructType  # struct<new, old, old_kind, unchanged>
    image_type: pa.StructType  # struct<columns>

    @classmethod
    def build(cls, tables: Sequence[CatalogTable], arrow: pa.Schema) -> dict[int, TableLayout]:
        """Layouts by relation OID for the tables of an output schema."""
        layouts: dict[int, TableLayout] = {}
        for table in tables:
            name = table_column(table.schema, table.name)
            index = arrow.get_field_index(name)
            if index < 0:
                continue
            struct_type = arrow.field(index).type
            layouts[table.relid] = cls(table, index, struct_type, struct_type.field("new").type)
        return layouts
