"""Typed Arrow arrays straight from value bytes in a message buffer, one column at a time.

``ColumnSlices`` says where the values of one column are (buffer offsets, lengths, kind bytes,
as ``framing.walk_tuples`` found them); ``column_reader`` picks, per PostgreSQL type and type
modifier, the Arrow type and a reader that turns those slices into an Arrow array without a
Python object per value:

* text format ('t'): the values become an Arrow string array *over the message buffer itself*
  (no copy): its offsets interleave each value with the bytes between values, and the validity
  bitmap hides those in-between entries. Arrow's C++ casts then parse numbers, decimals, dates
  and timestamps; the even entries of the result are the column. Text-like types take the even
  entries as a compact string array and check their UTF-8.
* binary format ('b'): fixed-width integers, floats, dates and timestamps are gathered with a
  big-endian numpy view in one step; numeric(p<=18, s) digits are summed base 10000 in numpy;
  jsonb drops its version byte.

Every other type, and values a fast path cannot take (NaN or infinite numerics, BC dates, years
past 9999, timestamps at the edge of the range), goes through ``pgcdc.protocol.values.to_arrow``,
value by value. A value that cannot be read raises ``BadValue`` naming the row; the caller turns
it into a ProtocolError with the message's position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.errors import PgcdcError
from pgcdc.protocol.arrow.framing import KIND_BINARY, KIND_TEXT, MessageTable

if TYPE_CHECKING:
    from pgcdc.protocol.values.registry import TypeRegistry

__all__ = ["BadValue", "ColumnReader", "ColumnSlices", "column_reader", "text_reader"]

I64 = npt.NDArray[np.int64]
U32 = npt.NDArray[np.uint32]
U8 = npt.NDArray[np.uint8]
Bools = npt.NDArray[np.bool_]

# type OIDs (pg_type.oid of the built-in types)
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, FLOAT4, FLOAT8, UNKNOWN, BPCHAR, VARCHAR = 114, 142, 700, 701, 705, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC = 1082, 1083, 1114, 1184, 1186, 1700
UUID, JSONB = 2950, 3802

#: Days and microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
PG_EPOCH_DAYS = 10_957
PG_EPOCH_MICROS = 946_684_800_000_000
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: Arrow string arrays with 32-bit offsets address at most this many bytes.
MAX_STRING_BUFFER = 2**31 - 1

_POW10 = np.array([10**k for k in range(19)], dtype=np.int64)
_POW10000 = np.array([10_000**k for k in range(4)], dtype=np.int64)
#: _SPREAD[b]: the 8 bits of b moved to the even bits of a 16-bit word (little-endian bitmaps).
_SPREAD = np.array(
    [sum(((b >> i) & 1) << (2 * i) for i in range(8)) for b in range(256)], dtype="<u2"
)


class BadValue(PgcdcError):
    """Row ``row`` of a column holds a value its type cannot take (``reason`` says why)."""

    def __init__(self, row: int, reason: str) -> None:
        super().__init__(row, reason)
        self.row = row
        self.reason = reason


@dataclass(frozen=True, slots=True, eq=False)
class ColumnSlices:
    """Where one column's values are in the message buffer, for each row.

    ``starts``/``lengths`` are meaningful only where ``has_value`` (kind 't' or 'b');
    ``row_starts`` (the row's message start) is a safe offset for the other rows.
    """

    table: MessageTable
    kinds: U8
    starts: I64
    lengths: U32
    has_value: Bools
    row_starts: I64

    def __len__(self) -> int:
        return len(self.kinds)

    def only(self, mask: Bools) -> ColumnSlices:
        """The same rows, with values kept only where ``mask`` (others read as NULL)."""
        return ColumnSlices(
            self.table, self.kinds, self.starts, self.lengths, self.has_value & mask,
            self.row_starts,
        )  # fmt: skip

    def first(self, mask: Bools) -> int:
        return int(np.flatnonzero(mask)[0])

    def raw(self, row: int) -> bytes:
        start = int(self.starts[row])
        raw: bytes = self.table.buffer[start : start + int(self.lengths[row])].to_pybytes()
        return raw


Reader = Callable[[ColumnSlices], pa.Array]


@dataclass(frozen=True, slots=True)
class ColumnReader:
    """How one column becomes an Arrow array: its Arrow type, and readers per value format."""

    type_name: str
    arrow_type: pa.DataType
    read_text: Reader
    read_binary: Reader

    def read(self, column: ColumnSlices) -> pa.Array:
        """The column as an Arrow array of ``arrow_type`` (NULL where there is no value)."""
        kinds = column.kinds
        has_value = column.has_value
        text = kinds == KIND_TEXT
        if not text.any():
            if not has_value.any():
                return pa.nulls(len(column), self.arrow_type)
            return self.read_binary(column)
        binary = kinds == KIND_BINARY
        if not binary.any():
            return self.read_text(column)
        # both formats in one column (PostgreSQL never does this; the format allows it)
        from_text = self.read_text(column.only(text))
        from_binary = self.read_binary(column.only(binary))
        return pc.if_else(pa.array(text), from_text, from_binary)


# -- helpers -----------------------------------------------------------------------------------


def _validity(valid: Bools) -> pa.Buffer | None:
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _safe_starts(column: ColumnSlices, valid: Bools, all_valid: bool) -> I64:
    """Value starts, with each value-less row at its message start (keeps offsets sorted)."""
    if all_valid:
        return column.starts
    return np.where(valid, column.starts, column.row_starts)


def _interleaved(
    column: ColumnSlices, valid: Bools, skip: int = 0, binary: bool = False
) -> pa.Array:
    """A 2n-entry string (or binary) array over the message buffer: entry 2i is row i's value
    (after ``skip`` leading bytes), entry 2i+1 the bytes up to the next value, hidden as NULL."""
    n = len(column)
    all_valid = bool(valid.all())
    starts = _safe_starts(column, valid, all_valid)
    lengths = column.lengths if all_valid else np.where(valid, column.lengths, 0)
    if skip:
        step = skip if all_valid else np.where(valid, skip, 0)
        starts = starts + step
        lengths = lengths - step
    wide = len(column.table.buffer) > MAX_STRING_BUFFER
    offsets = np.empty(2 * n + 1, dtype=np.int64 if wide else np.int32)
    offsets[0 : 2 * n : 2] = starts
    offsets[1 : 2 * n : 2] = starts + lengths
    offsets[2 * n] = offsets[2 * n - 1] if n else 0
    if all_valid:
        bitmap = np.full((2 * n + 7) // 8, 0x55, dtype=np.uint8)
    else:
        bitmap = _SPREAD[np.packbits(valid, bitorder="little")].view(np.uint8)
    if binary:
        kind = pa.large_binary() if wide else pa.binary()
    else:
        kind = pa.large_string() if wide else pa.string()
    return pa.Array.from_buffers(
        kind, 2 * n, [pa.py_buffer(bitmap), pa.py_buffer(offsets), column.table.buffer]
    )


def _even_entries(interleaved: pa.Array, n: int) -> pa.Array:
    """Entries 0, 2, 4, ... of an interleaved array (a compact copy)."""
    return interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


def _even_fixed(result: pa.Array, n: int, arrow_type: pa.DataType, valid: Bools) -> pa.Array:
    """Entries 0, 2, 4, ... of a fixed-width cast result, with the column's validity."""
    width = arrow_type.byte_width
    cells = np.frombuffer(
        result.buffers()[1], dtype=np.dtype((np.void, width)), count=result.offset + 2 * n
    )
    data = np.ascontiguousarray(cells[result.offset :: 2])
    return pa.Array.from_buffers(arrow_type, n, [_validity(valid), pa.py_buffer(data)])


def _string_result(array: pa.Array, first_bad: Callable[[], int]) -> pa.Array:
    if array.type == pa.large_string():
        array = array.cast(pa.string())
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        raise BadValue(first_bad(), "is not valid UTF-8") from None
    return array


def _first_bad_utf8(column: ColumnSlices, valid: Bools, skip: int = 0) -> int:
    for row in np.flatnonzero(valid):
        try:
            column.raw(int(row))[skip:].decode("utf-8")
        except UnicodeDecodeError:
            return int(row)
    return int(np.flatnonzero(valid)[0])


# -- readers -----------------------------------------------------------------------------------


def _text_strings(column: ColumnSlices) -> pa.Array:
    valid = column.has_value
    strings = _even_entries(_interleaved(column, valid), len(column))
    return _string_result(strings, lambda: _first_bad_utf8(column, valid))


def _binary_strings(column: ColumnSlices) -> pa.Array:
    """Binary format of text-like types (text, varchar, bpchar, name, json, ...): the raw text."""
    return _text_strings(column)


def _binary_jsonb(column: ColumnSlices) -> pa.Array:
    valid = column.has_value
    versions = column.table.data[_safe_starts(column, valid, bool(valid.all()))]
    bad = valid & ((column.lengths < 1) | (versions != 1))
    if bad.any():
        raise BadValue(column.first(bad), "is not jsonb binary format version 1")
    strings = _even_entries(_interleaved(column, valid, skip=1), len(column))
    return _string_result(strings, lambda: _first_bad_utf8(column, valid, 1))


def _bytes(column: ColumnSlices) -> pa.Array:
    valid = column.has_value
    return _even_entries(_interleaved(column, valid, binary=True), len(column)).cast(pa.binary())


def _cast_text(arrow_type: pa.DataType, fallback: Reader) -> Reader:
    """Text values parsed by an Arrow cast; ``fallback`` when the cast refuses any of them."""

    def read(column: ColumnSlices) -> pa.Array:
        valid = column.has_value
        try:
            parsed = pc.cast(_interleaved(column, valid), arrow_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return fallback(column)
        return _even_fixed(parsed, len(column), arrow_type, valid)

    return read


def _text_bool(column: ColumnSlices) -> pa.Array:
    valid = column.has_value
    first = column.table.data[_safe_starts(column, valid, bool(valid.all()))]
    is_true = first == 0x74  # 't'
    bad = valid & ((column.lengths != 1) | ~(is_true | (first == 0x66)))  # 'f'
    if bad.any():
        raise BadValue(column.first(bad), "is not a boolean ('t' or 'f')")
    bits = np.packbits(is_true & valid, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(column), [_validity(valid), pa.py_buffer(bits)])


def _fixed_values(column: ColumnSlices, dtype: str, type_name: str) -> tuple[Any, Bools]:
    """Big-endian fixed-width binary values, native order; zeros where there is none."""
    valid = column.has_value
    width = np.dtype(dtype).itemsize
    bad = valid & (column.lengths != width)
    if bad.any():
        raise BadValue(column.first(bad), f"is not {width} bytes long as binary {type_name} is")
    view = column.table.be_view(dtype)
    values = view[np.where(valid, column.starts, 0)].astype(np.dtype(dtype).newbyteorder("="))
    return values, valid


def _binary_fixed(dtype: str, arrow_type: pa.DataType, type_name: str) -> Reader:
    def read(column: ColumnSlices) -> pa.Array:
        values, valid = _fixed_values(column, dtype, type_name)
        return pa.Array.from_buffers(
            arrow_type, len(column), [_validity(valid), pa.py_buffer(values)]
        )

    return read


def _binary_bool(column: ColumnSlices) -> pa.Array:
    values, valid = _fixed_values(column, "u1", "bool")
    bits = np.packbits((values != 0) & valid, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(column), [_validity(valid), pa.py_buffer(bits)])


def _binary_date(fallback: Reader) -> Reader:
    def read(column: ColumnSlices) -> pa.Array:
        days, valid = _fixed_values(column, ">i4", "date")
        if ((days == INT32_MAX) | (days == INT32_MIN)).any():
            return fallback(column)  # +-infinity: the values module's rule
        shifted = (days.astype(np.int64) + PG_EPOCH_DAYS).astype(np.int32)
        return pa.Array.from_buffers(
            pa.date32(), len(column), [_validity(valid), pa.py_buffer(shifted)]
        )

    return read


def _binary_timestamp(arrow_type: pa.DataType, fallback: Reader) -> Reader:
    def read(column: ColumnSlices) -> pa.Array:
        micros, valid = _fixed_values(column, ">i8", "timestamp")
        infinite = (micros == INT64_MAX) | (micros == INT64_MIN)
        if (~infinite & (micros > INT64_MAX - PG_EPOCH_MICROS)).any():
            return fallback(column)  # past Arrow's range: the values module's rule
        unix = np.where(infinite, micros, micros + PG_EPOCH_MICROS)
        return pa.Array.from_buffers(
            arrow_type, len(column), [_validity(valid), pa.py_buffer(unix)]
        )

    return read


def _binary_numeric(precision: int, scale: int, fallback: Reader) -> Reader:
    """numeric(p, s) in binary, for p + (s rounded up to 4) - s <= 16: the base-10000 digits
    summed at a scale that is a multiple of 4 in int64, then brought to scale s, as decimal128.
    """
    arrow_type = pa.decimal128(precision, scale)
    groups_after_point = -(-scale // 4)
    shift = _POW10[4 * groups_after_point - scale]
    top = (precision + 4 * groups_after_point - scale - 1) // 4  # highest power of 10000
    limit = 10**precision

    def read(column: ColumnSlices) -> pa.Array:
        valid = column.has_value
        table = column.table
        i16 = table.be_view(">i2")
        at = np.where(valid, column.starts, 0)
        bad = valid & (column.lengths < 8)
        if bad.any():
            raise BadValue(column.first(bad), "is shorter than a binary numeric header")
        # the header in one gather: ndigits, weight (int16), sign, dscale (uint16)
        header = table.be_view(">u8")[at]
        ndigits = np.where(valid, (header >> 48).astype(np.uint16).view(np.int16), 0)
        bad = valid & ((ndigits < 0) | (column.lengths != 8 + 2 * ndigits.astype(np.int64)))
        if bad.any():
            raise BadValue(column.first(bad), "has a digit count that does not match its length")
        sign = (header >> 16).astype(np.uint16)
        if (valid & (sign != 0) & (sign != 0x4000)).any():
            return fallback(column)  # NaN or infinity: the values module's rule
        weight = (header >> 32).astype(np.uint16).view(np.int16).astype(np.int64)
        # digit k of every row, shaped (digits, rows) so numpy loops over the long axis
        k = np.arange(int(ndigits.max(initial=0)))[:, None]
        present = k < ndigits
        digits = np.where(present, i16[np.where(present, at + 8 + 2 * k, 0)], 0)
        power = weight + groups_after_point - k
        nonzero = digits != 0
        if (nonzero & ((power < 0) | (power > top) | (digits < 0) | (digits >= 10_000))).any():
            return fallback(column)  # more digits than numeric(p, s) holds
        scaled = (digits.astype(np.int64) * _POW10000[np.clip(power, 0, top)]).sum(axis=0)
        total, rest = np.divmod(scaled, shift)
        if rest.any() or (total >= limit).any():
            return fallback(column)
        total = np.where(sign == 0x4000, -total, total)
        cells = np.empty((len(column), 2), dtype=np.int64)
        cells[:, 0] = total
        cells[:, 1] = total >> 63
        return pa.Array.from_buffers(
            arrow_type, len(column), [_validity(valid), pa.py_buffer(cells)]
        )

    return read


def _through_values(
    type_id: int, type_modifier: int, arrow_type: pa.DataType, registry: TypeRegistry | None
) -> Reader:
    """A reader handing the values to ``pgcdc.protocol.values.to_arrow`` (value by value)."""

    def read(column: ColumnSlices) -> pa.Array:
        from pgcdc.protocol.values import to_arrow

        values: list[str | bytes | None] = [None] * len(column)
        for row in np.flatnonzero(column.has_value).tolist():
            raw = column.raw(row)
            if column.kinds[row] == KIND_TEXT:
                try:
                    values[row] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise BadValue(row, "is not valid UTF-8") from None
            else:
                values[row] = raw
        try:
            array = to_arrow(values, type_id, type_modifier, registry)
        except (ValueError, ArithmeticError):
            row, reason = _first_refused(values, type_id, type_modifier, registry)
            raise BadValue(row, reason) from None
        if pa.types.is_binary(array.type) and not pa.types.is_binary(arrow_type):
            # a binary-format value of a type pgcdc has no binary reader for: its bytes are
            # not the column's type (the row Decoder hands them over as bytes instead)
            row = int(np.flatnonzero(column.has_value)[0])
            raise BadValue(
                row,
                "is in binary format, which pgcdc cannot read for this type: "
                "ask for text format (binary off)",
            )
        if array.type != arrow_type:
            try:
                array = array.cast(arrow_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                row = int(np.flatnonzero(column.has_value)[0])
                raise BadValue(row, f"cannot be read as {arrow_type}") from None
        return array

    return read


def _first_refused(
    values: list[str | bytes | None],
    type_id: int,
    type_modifier: int,
    registry: TypeRegistry | None,
) -> tuple[int, str]:
    """The first value ``to_arrow`` refuses, and why (its messages never quote the value)."""
    from pgcdc.protocol.values import to_arrow

    for row, value in enumerate(values):
        if value is None:
            continue
        try:
            to_arrow([value], type_id, type_modifier, registry)
        except (ValueError, ArithmeticError) as exc:
            return row, f"cannot be converted: {exc}"
    first = next((row for row, value in enumerate(values) if value is not None), 0)
    return first, "cannot be converted together with the other values of its column"


# -- type plans --------------------------------------------------------------------------------

_STRING_TYPES = frozenset({TEXT, VARCHAR, BPCHAR, NAME, JSON, XML, UNKNOWN})
_FIXED: dict[int, tuple[str, pa.DataType, str]] = {
    INT2: (">i2", pa.int16(), "int2"),
    INT4: (">i4", pa.int32(), "int4"),
    INT8: (">i8", pa.int64(), "int8"),
    OID: (">u4", pa.uint32(), "oid"),
    FLOAT4: (">f4", pa.float32(), "float4"),
    FLOAT8: (">f8", pa.float64(), "float8"),
}


def numeric_precision_scale(type_modifier: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric type modifier, None for numeric without one."""
    if type_modifier < 4:
        return None
    packed = type_modifier - 4
    precision = (packed >> 16) & 0xFFFF
    scale = ((packed & 0x7FF) ^ 1024) - 1024  # 11-bit signed since PostgreSQL 15
    return precision, scale


def _values_arrow_type(
    type_id: int, type_modifier: int, registry: TypeRegistry | None
) -> pa.DataType:
    from pgcdc.protocol.values import arrow_type

    result: pa.DataType = arrow_type(type_id, type_modifier, registry)
    return result


def text_reader(
    type_id: int, type_modifier: int, registry: TypeRegistry | None = None
) -> ColumnReader:
    """A reader giving any type's values as the text its output function prints: text-format
    values as sent, binary ones rendered by ``pgcdc.protocol.values.pg_text`` (ISO dates, UTC).
    For values no typed Arrow column holds (numeric NaN under a typmod, ``24:00:00``, arrays of
    more dimensions than declared)."""

    def read_binary(column: ColumnSlices) -> pa.Array:
        from pgcdc.protocol.values import pg_text

        values: list[str | None] = [None] * len(column)
        for row in np.flatnonzero(column.has_value).tolist():
            try:
                values[row] = pg_text(column.raw(row), type_id, type_modifier, registry)
            except (ValueError, ArithmeticError) as exc:
                raise BadValue(row, f"cannot be printed as text: {exc}") from None
        return pa.array(values, pa.string())

    return ColumnReader("text", pa.string(), _text_strings, read_binary)


def column_reader(
    type_id: int, type_modifier: int, registry: TypeRegistry | None = None
) -> ColumnReader:
    """The Arrow type and readers for a column of this type."""
    base_id, base_modifier = type_id, type_modifier
    if registry is not None and type_id >= 10_000:
        info = registry.resolve(type_id)  # a domain over a built-in type reads as its base
        if info is not None and info.oid < 10_000 and info.kind == "base":
            base_id = info.oid
            if base_modifier == -1:
                base_modifier = registry.domain_type_modifier(type_id)
    fallback_type = None
    if base_id not in _FIXED and base_id not in _STRING_TYPES and base_id not in (
        BOOL, BYTEA, JSONB, UUID, DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC,
    ):  # fmt: skip
        fallback_type = _values_arrow_type(type_id, type_modifier, registry)
        slow = _through_values(type_id, type_modifier, fallback_type, registry)
        return ColumnReader(f"oid {type_id}", fallback_type, slow, slow)

    def through(arrow_type: pa.DataType) -> Reader:
        return _through_values(type_id, type_modifier, arrow_type, registry)

    if base_id in _FIXED:
        dtype, arrow, name = _FIXED[base_id]
        return ColumnReader(
            name, arrow, _cast_text(arrow, through(arrow)), _binary_fixed(dtype, arrow, name)
        )
    if base_id in _STRING_TYPES:
        return ColumnReader("text", pa.string(), _text_strings, _binary_strings)
    if base_id == UUID:
        return ColumnReader("uuid", pa.string(), _text_strings, through(pa.string()))
    if base_id == JSONB:
        return ColumnReader("jsonb", pa.string(), _text_strings, _binary_jsonb)
    if base_id == BOOL:
        return ColumnReader("bool", pa.bool_(), _text_bool, _binary_bool)
    if base_id == BYTEA:
        return ColumnReader("bytea", pa.binary(), through(pa.binary()), _bytes)
    if base_id == DATE:
        slow = through(pa.date32())
        return ColumnReader("date", pa.date32(), _cast_text(pa.date32(), slow), _binary_date(slow))
    if base_id in (TIMESTAMP, TIMESTAMPTZ):
        arrow = pa.timestamp("us", tz="UTC" if base_id == TIMESTAMPTZ else None)
        slow = through(arrow)
        name = "timestamptz" if base_id == TIMESTAMPTZ else "timestamp"
        return ColumnReader(name, arrow, _cast_text(arrow, slow), _binary_timestamp(arrow, slow))
    # numeric
    ps = numeric_precision_scale(base_modifier)
    if ps is None:
        slow = through(pa.string())
        return ColumnReader("numeric", pa.string(), _text_strings, slow)
    precision, scale = ps
    if not (1 <= precision <= 76 and 0 <= scale <= precision):
        arrow = _values_arrow_type(type_id, type_modifier, registry)
        slow = through(arrow)
        return ColumnReader("numeric", arrow, slow, slow)
    arrow = pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    slow = through(arrow)
    fits = precision + 4 * -(-scale // 4) - scale <= 16
    binary = _binary_numeric(precision, scale, slow) if fits else slow
    return ColumnReader("numeric", arrow, _cast_text(arrow, slow), binary)
