"""Integer, oid, numeric and money values.

int2/int4/int8 load as int and map to Arrow int16/int32/int64, oid to uint32. numeric loads as
``decimal.Decimal`` with the value's exact scale (NaN and ±Infinity as ``Decimal('NaN')`` and
``Decimal('±Infinity')``, never float) and maps to Arrow ``decimal128(p, s)`` when the column has
a precision (``decimal256`` above 38 digits); see ``numeric_arrow_type`` for the exact rules.
money loads as a Decimal with two fraction digits and maps to Arrow string.

The numeric binary format (numeric_send): uint16 ndigits, int16 weight, uint16 sign, int16 dscale,
then ndigits base-10000 digits (int16), the first worth 10000**weight.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import (
    Converter,
    fixed_width_numpy,
    rendered_strings,
    string_arrow_text,
)
from pgcdc.protocol.values.errors import ConversionError

__all__ = [
    "CONVERTERS",
    "NUMERIC_NAN",
    "NUMERIC_NEG",
    "NUMERIC_NINF",
    "NUMERIC_PINF",
    "NUMERIC_POS",
    "numeric_arrow_type",
    "numeric_from_binary",
    "numeric_precision_scale",
    "numeric_text",
]

NUMERIC_POS = 0x0000
NUMERIC_NEG = 0x4000
NUMERIC_NAN = 0xC000
NUMERIC_PINF = 0xD000
NUMERIC_NINF = 0xF000
_SPECIAL_TEXT = {NUMERIC_NAN: "NaN", NUMERIC_PINF: "Infinity", NUMERIC_NINF: "-Infinity"}
_SPECIAL_KIND = {"NaN": "NaN", "Infinity": "+Infinity", "-Infinity": "-Infinity"}

_NUMERIC_HEAD = struct.Struct(">HhHh")  # ndigits is read as uint16 by numeric_recv
_VARHDRSZ = 4
_MAX_DECIMAL256_PRECISION = 76
_MAX_DECIMAL128_PRECISION = 38
_INT64 = struct.Struct(">q")


# -- integers -------------------------------------------------------------------------------


def _int_converter(name: str, fmt: str, arrow: Any) -> Converter:
    st = struct.Struct(">" + fmt)
    dtype = ">" + {"h": "i2", "i": "i4", "q": "i8", "I": "u4", "Q": "u8"}[fmt]

    def from_text(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise ConversionError(f"text {name} value is not an integer") from None

    return fixed_width_converter(name, st, dtype, arrow, from_text=from_text, fmt=str)


def fixed_width_converter(
    name: str,
    st: struct.Struct,
    dtype: str,
    arrow: Any,
    *,
    from_text: Callable[[str], Any],
    fmt: Callable[[Any], str],
) -> Converter:
    """The converter of a fixed-width binary number (integers, floats): ``st`` unpacks one
    value, ``dtype`` is its big-endian numpy type, ``fmt`` renders it as the server would."""
    width = st.size

    def from_binary(data: bytes) -> Any:
        try:
            return st.unpack(data)[0]
        except struct.error:
            raise ConversionError(
                f"binary {name} value must be {width} bytes, got {len(data)}"
            ) from None

    def render(data: bytes, timezone: str) -> str:
        return fmt(from_binary(data))

    def arrow_type(typmod: int) -> Any:
        return arrow

    def arrow_text(values: list[str | None], arrow_type: Any) -> pa.Array:
        return cast_text(values, arrow_type, name)

    def arrow_binary(values: list[bytes | None], arrow_type: Any) -> pa.Array:
        array, mask = fixed_width_numpy(values, width, dtype, name)
        return pa.array(array, type=arrow_type, mask=mask)

    return Converter(name, from_text, from_binary, render, arrow_type, arrow_text, arrow_binary)


def cast_text(values: list[str | None], arrow_type: Any, type_name: str) -> pa.Array:
    """Text values parsed by Arrow's cast kernel; ConversionError (without the value) if bad."""
    try:
        return pc.cast(pa.array(values, pa.string()), arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ConversionError(
            f"text {type_name} column holds a value Arrow cannot parse as {arrow_type}"
        ) from None


# -- numeric --------------------------------------------------------------------------------


def numeric_precision_scale(type_modifier: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric type modifier, None for unconstrained numeric.

    The scale may be negative or larger than the precision (PostgreSQL 15+).
    """
    if type_modifier < _VARHDRSZ:
        return None
    t = type_modifier - _VARHDRSZ
    precision = (t >> 16) & 0xFFFF
    scale = ((t & 0x7FF) ^ 1024) - 1024
    return precision, scale


def numeric_arrow_type(type_modifier: int) -> Any:
    """The Arrow type of a numeric column.

    numeric(p, s) -> decimal128(p, s) for p <= 38, decimal256(p, s) for p <= 76. A negative
    scale (numeric(5,-2) holds multiples of 100 below 10**7) becomes decimal(p - s, 0); a scale
    larger than the precision (numeric(3,5) holds 0.00xyz) becomes decimal(s, s): Arrow
    consumers such as Parquet and Spark require 0 <= s <= p. Unconstrained numeric, and numeric
    with more than 76 digits, map to string holding PostgreSQL's exact text.
    """
    ps = numeric_precision_scale(type_modifier)
    if ps is None:
        return pa.string()
    precision, scale = ps
    if scale < 0:
        precision, scale = precision - scale, 0
    elif scale > precision:
        precision = scale
    if precision <= _MAX_DECIMAL128_PRECISION:
        return pa.decimal128(precision, scale)
    if precision <= _MAX_DECIMAL256_PRECISION:
        return pa.decimal256(precision, scale)
    return pa.string()


def _numeric_parts(data: bytes) -> tuple[int, int, int, tuple[int, ...]]:
    try:
        ndigits, weight, sign, dscale = _NUMERIC_HEAD.unpack_from(data)
        if len(data) != 8 + 2 * ndigits or ndigits < 0:
            raise struct.error
        groups: tuple[int, ...] = struct.unpack_from(f">{ndigits}H", data, 8)
    except struct.error:
        raise ConversionError(
            "binary numeric value is malformed: its length does not match its digit count"
        ) from None
    if sign not in (NUMERIC_POS, NUMERIC_NEG, NUMERIC_NAN, NUMERIC_PINF, NUMERIC_NINF):
        raise ConversionError(f"binary numeric value has an invalid sign word 0x{sign:04x}")
    return sign, weight, dscale, groups


def numeric_text(data: bytes) -> str:
    """numeric_out of a binary numeric: its exact digits with exactly its display scale."""
    sign, weight, dscale, groups = _numeric_parts(data)
    special = _SPECIAL_TEXT.get(sign)
    if special is not None:
        return special
    n = len(groups)
    if weight < 0:
        int_part = "0"
    else:
        first = str(groups[0]) if n else "0"
        rest = "".join(f"{groups[i]:04d}" if i < n else "0000" for i in range(1, weight + 1))
        int_part = first + rest
    text = ("-" if sign == NUMERIC_NEG else "") + int_part
    if dscale > 0:
        count = (dscale + 3) // 4
        frac = "".join(
            f"{groups[weight + j]:04d}" if 0 <= weight + j < n else "0000"
            for j in range(1, count + 1)
        )
        text += "." + frac[:dscale]
    return text


def numeric_from_binary(data: bytes) -> Decimal:
    """A binary numeric as a Decimal with the value's exact scale."""
    return Decimal(numeric_text(data))


def _numeric_from_text(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        raise ConversionError("text numeric value is not a number") from None


def _unscaled_from_binary(data: bytes, precision: int, scale: int, arrow_type: Any) -> int:
    sign, weight, _, groups = _numeric_parts(data)
    if sign in _SPECIAL_TEXT:
        raise _special_error(_SPECIAL_KIND[_SPECIAL_TEXT[sign]], arrow_type)
    acc = 0
    for g in groups:
        acc = acc * 10000 + g
    exponent = 4 * (weight - len(groups) + 1) + scale
    if acc and exponent > 0:
        if exponent + 4 * len(groups) > precision + 8:
            raise _overflow_error(arrow_type)
        acc *= 10**exponent
    elif exponent < 0:
        acc, rest = divmod(acc, 10**-exponent)
        if rest:
            raise ConversionError(
                f"numeric value has more fraction digits than its Arrow type {arrow_type} "
                "holds (the column's values do not match its type modifier)"
            )
    if acc >= 10**precision:
        raise _overflow_error(arrow_type)
    return -acc if sign == NUMERIC_NEG else acc


def _special_error(kind: str, arrow_type: Any) -> ConversionError:
    return ConversionError(
        f"numeric {kind} cannot be stored in an Arrow {arrow_type} column: decimals have no "
        f"{kind}. Map the column to string (convert it as unconstrained numeric: type modifier "
        "-1), or declare it without a precision in PostgreSQL"
    )


def _overflow_error(arrow_type: Any) -> ConversionError:
    return ConversionError(
        f"numeric value has more digits than its Arrow type {arrow_type} holds (the column's "
        "values do not match its type modifier)"
    )


def _decimal_array(unscaled: list[int | None], arrow_type: Any) -> pa.Array:
    width = 16 if pa.types.is_decimal128(arrow_type) else 32
    n = len(unscaled)
    data = b"".join(
        (0 if u is None else u).to_bytes(width, "little", signed=True) for u in unscaled
    )
    nulls = unscaled.count(None)
    validity = None
    if nulls:
        valid = np.fromiter((u is not None for u in unscaled), dtype=np.bool_, count=n)
        validity = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(data)], null_count=nulls)


def _numeric_arrow_text(values: list[str | None], arrow_type: Any) -> pa.Array:
    array = pa.array(values, pa.string())
    if not pa.types.is_decimal(arrow_type):
        return array
    try:
        return pc.cast(array, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    for text, kind in _SPECIAL_KIND.items():
        if pc.any(pc.equal(array, text)).as_py():
            raise _special_error(kind, arrow_type) from None
    raise _overflow_error(arrow_type) from None


def _numeric_arrow_binary(values: list[bytes | None], arrow_type: Any) -> pa.Array:
    if not pa.types.is_decimal(arrow_type):
        return pa.array([None if v is None else numeric_text(v) for v in values], arrow_type)
    p, s = arrow_type.precision, arrow_type.scale
    unscaled = [None if v is None else _unscaled_from_binary(v, p, s, arrow_type) for v in values]
    return _decimal_array(unscaled, arrow_type)


def _numeric_render(data: bytes, timezone: str) -> str:
    return numeric_text(data)


NUMERIC = Converter(
    "numeric",
    _numeric_from_text,
    numeric_from_binary,
    _numeric_render,
    numeric_arrow_type,
    _numeric_arrow_text,
    _numeric_arrow_binary,
)


# -- money ----------------------------------------------------------------------------------


def money_text(data: bytes) -> str:
    """cash_out with lc_monetary C: ``$1,234.56``, ``-$1,234.56``."""
    try:
        (cents,) = _INT64.unpack(data)
    except struct.error:
        raise ConversionError(f"binary money value must be 8 bytes, got {len(data)}") from None
    units, frac = divmod(abs(cents), 100)
    return f"{'-' if cents < 0 else ''}${units:,}.{frac:02d}"


def _money_from_binary(data: bytes) -> Decimal:
    (cents,) = _INT64.unpack(data)
    return Decimal(f"{cents}E-2")


def _money_from_text(text: str) -> Decimal:
    negative = text.startswith("-") or text.startswith("(")
    digits = text.strip("-()$ ").replace(",", "").replace("$", "")
    try:
        value = Decimal(digits)
    except InvalidOperation:
        raise ConversionError(
            "text money value is not in the C locale's format ($1,234.56); set lc_monetary to C "
            "on the server"
        ) from None
    return -value if negative else value


def _money_render(data: bytes, timezone: str) -> str:
    return money_text(data)


def _string_type(typmod: int) -> Any:
    return pa.string()


MONEY = Converter(
    "money",
    _money_from_text,
    _money_from_binary,
    _money_render,
    _string_type,
    string_arrow_text,
    rendered_strings(_money_render),
)


CONVERTERS: dict[int, Converter] = {
    oids.INT2_OID: _int_converter("int2", "h", pa.int16()),
    oids.INT4_OID: _int_converter("int4", "i", pa.int32()),
    oids.INT8_OID: _int_converter("int8", "q", pa.int64()),
    oids.OID_OID: _int_converter("oid", "I", pa.uint32()),
    oids.XID_OID: _int_converter("xid", "I", pa.uint32()),
    oids.CID_OID: _int_converter("cid", "I", pa.uint32()),
    oids.XID8_OID: _int_converter("xid8", "Q", pa.uint64()),
    oids.NUMERIC_OID: NUMERIC,
    oids.MONEY_OID: MONEY,
}
