"""Ranges and multiranges: their binary form read, and PostgreSQL's text output of it.

range_send (rangetypes.c): one flags byte, then the lower bound if the range has one, then the
upper bound, each as int32 length and the bound type's own binary form. multirange_send
(multirangetypes.c): int32 range count, then each range as int32 length and its range_send
bytes. range_out prints ``empty`` or ``[lower,upper)`` (a bracket or parenthesis per inclusive
or exclusive bound, nothing for an infinite one), each bound quoted by range_bound_escape;
multirange_out prints ``{`` ranges joined by ``,`` ``}``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.records import RECORD_SPECIAL, quote_doubled

__all__ = ["multirange_text", "range_text"]

# rangetypes.h
RANGE_EMPTY = 0x01
RANGE_LB_INC = 0x02
RANGE_UB_INC = 0x04
RANGE_LB_INF = 0x08
RANGE_UB_INF = 0x10
RANGE_LB_NULL = 0x20
RANGE_UB_NULL = 0x40

_INT32 = struct.Struct(">i")
#: range_bound_escape quotes a bound holding these: record_out's set, and brackets
_QUOTED = RECORD_SPECIAL | frozenset("[]")


def _take(data: bytes, pos: int, what: str) -> tuple[bytes, int]:
    if pos + 4 > len(data):
        raise ConversionError(f"binary {what} is truncated")
    (length,) = _INT32.unpack_from(data, pos)
    pos += 4
    if length < 0 or pos + length > len(data):
        raise ConversionError(f"binary {what} has a bad length")
    return data[pos : pos + length], pos + length


def range_text(data: bytes, render_bound: Callable[[bytes], str]) -> str:
    """range_out of a range_send value, its bounds printed with ``render_bound``."""
    if not data:
        raise ConversionError("binary range value is empty")
    flags = data[0]
    if flags & RANGE_EMPTY:
        if len(data) != 1:
            raise ConversionError("binary empty range has trailing bytes")
        return "empty"
    pos = 1
    lower = upper = ""
    if not flags & (RANGE_LB_INF | RANGE_LB_NULL):
        bound, pos = _take(data, pos, "range lower bound")
        lower = quote_doubled(render_bound(bound), _QUOTED)
    if not flags & (RANGE_UB_INF | RANGE_UB_NULL):
        bound, pos = _take(data, pos, "range upper bound")
        upper = quote_doubled(render_bound(bound), _QUOTED)
    if pos != len(data):
        raise ConversionError("binary range value has trailing bytes")
    opening = "[" if flags & RANGE_LB_INC else "("
    closing = "]" if flags & RANGE_UB_INC else ")"
    return f"{opening}{lower},{upper}{closing}"


def multirange_text(data: bytes, render_range: Callable[[bytes], str]) -> str:
    """multirange_out of a multirange_send value, its ranges printed with ``render_range``."""
    if len(data) < 4:
        raise ConversionError("binary multirange value is truncated")
    (count,) = _INT32.unpack_from(data, 0)
    if count < 0:
        raise ConversionError("binary multirange value has a negative range count")
    pos = 4
    ranges = []
    for _ in range(count):
        value, pos = _take(data, pos, "multirange's range")
        ranges.append(render_range(value))
    if pos != len(data):
        raise ConversionError("binary multirange value has trailing bytes")
    return "{" + ",".join(ranges) + "}"
