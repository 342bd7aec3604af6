"""Composite values (a composite type's, or an anonymous record's): their binary form read, and
PostgreSQL's text output of it.

record_send (rowtypes.c): int32 column count (dropped columns left out), then per column its
type OID (uint32) and its value as int32 length (-1 for NULL) and the column type's own binary
form. record_out prints ``(`` the columns joined by ``,`` ``)``: NULL as nothing, a value quoted
when empty or holding a quote, backslash, parenthesis, comma or whitespace, with quotes and
backslashes doubled inside.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pgcdc.protocol.values.errors import ConversionError

__all__ = ["RECORD_SPECIAL", "quote_doubled", "record_text"]

_HEADER = struct.Struct(">i")
_COLUMN = struct.Struct(">Ii")
#: what makes record_out quote a column: a quote, backslash, parenthesis, comma, or isspace()
RECORD_SPECIAL = frozenset('"\\(),') | frozenset(" \t\n\r\v\f")


def quote_doubled(text: str, special: frozenset[str]) -> str:
    """``text`` as record_out and range_out print a value: in double quotes when empty or
    holding any of ``special`` (each caller's set includes the quote and the backslash), with
    quotes and backslashes doubled inside."""
    if text and not any(ch in special for ch in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def record_text(data: bytes, render_column: Callable[[int, bytes], str]) -> str:
    """record_out of a record_send value, each column printed with ``render_column(type OID,
    bytes)``."""
    if len(data) < 4:
        raise ConversionError("binary record value is truncated")
    (count,) = _HEADER.unpack_from(data, 0)
    if count < 0:
        raise ConversionError("binary record value has a negative column count")
    pos = 4
    parts = []
    for _ in range(count):
        if pos + 8 > len(data):
            raise ConversionError("binary record value is truncated")
        oid, length = _COLUMN.unpack_from(data, pos)
        pos += 8
        if length == -1:
            parts.append("")
            continue
        if length < 0 or pos + length > len(data):
            raise ConversionError("binary record column has a bad length")
        parts.append(quote_doubled(render_column(oid, data[pos : pos + length]), RECORD_SPECIAL))
        pos += length
    if pos != len(data):
        raise ConversionError("binary record value has trailing bytes")
    return "(" + ",".join(parts) + ")"
