"""Full-text search values, tsvector and tsquery: their text form as str, Arrow string.

tsvectorsend: an int32 lexeme count, then per lexeme its text with a NUL terminator, an int16
position count and the positions (int16: the weight in the top two bits, 3 = A to 0 = D, the
position in the low fourteen). tsvectorout prints ``'lexeme':1A,2`` per lexeme, space-separated,
with quotes and backslashes doubled.

tsquerysend: an int32 item count, then the items in the query's stored (prefix) order: an
operand is type 1, a weight bit mask (8 = A, 4 = B, 2 = C, 1 = D), a prefix flag and its
NUL-terminated text; an operator is type 2 and its code (1 NOT, 2 AND, 3 OR, 4 PHRASE, which
carries an int16 distance). An operator is followed by its right operand, then its left one.
tsqueryout's ``infix`` prints them with the parentheses the priorities need (NOT 4, PHRASE 3,
AND 2, OR 1; a phrase as the right operand of a phrase is always parenthesized).
"""

from __future__ import annotations

import struct

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, text_converter
from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.string import decode_utf8

__all__ = ["CONVERTERS", "tsquery_text", "tsvector_text"]

_INT32 = struct.Struct(">i")
_UINT16 = struct.Struct(">H")
_WEIGHTS = ("", "C", "B", "A")  # WEP_GETWEIGHT 0 (D, printed as nothing) to 3
_WEIGHT_BITS = ((8, "A"), (4, "B"), (2, "C"), (1, "D"))  # a tsquery operand's weight mask
OP_NOT, OP_AND, OP_OR, OP_PHRASE = 1, 2, 3, 4
_PRIORITY = {OP_NOT: 4, OP_AND: 2, OP_OR: 1, OP_PHRASE: 3}
QI_VAL, QI_OPR = 1, 2


def _quoted(text: str) -> str:
    """A lexeme as tsvectorout and tsqueryout print it: quoted, ``'`` and ``\\`` doubled."""
    return "'" + text.replace("'", "''").replace("\\", "\\\\") + "'"


def _cstring(data: bytes, pos: int, name: str) -> tuple[str, int]:
    end = data.find(b"\0", pos)
    if end < 0:
        raise ConversionError(f"binary {name} value has a string without its terminator")
    return decode_utf8(data[pos:end]), end + 1


def tsvector_text(data: bytes) -> str:
    """tsvectorout of a binary tsvector."""
    try:
        (count,) = _INT32.unpack_from(data)
        pos = 4
        out = []
        for _ in range(count):
            lexeme, pos = _cstring(data, pos, "tsvector")
            (npos,) = _UINT16.unpack_from(data, pos)
            pos += 2
            positions = struct.unpack_from(f">{npos}H", data, pos)
            pos += 2 * npos
            word = _quoted(lexeme)
            if positions:
                word += ":" + ",".join(f"{p & 0x3FFF}{_WEIGHTS[p >> 14]}" for p in positions)
            out.append(word)
    except struct.error:
        raise ConversionError("binary tsvector value is truncated") from None
    if count < 0 or pos != len(data):
        raise ConversionError("binary tsvector value's length does not match its lexemes")
    return " ".join(out)


class _Query:
    """tsqueryout's ``infix`` over the items of a binary tsquery, read in their order."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 4
        self.items = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ConversionError("binary tsquery value is truncated")
        self.pos += 1
        return self.data[self.pos - 1]

    def infix(self, parent: int, right_phrase: bool) -> str:
        self.items += 1
        kind = self.byte()
        if kind == QI_VAL:
            weight, prefix = self.byte(), self.byte()
            text, self.pos = _cstring(self.data, self.pos, "tsquery")
            out = _quoted(text)
            if weight or prefix:
                out += ":" + "*" * bool(prefix)
                out += "".join(c for bit, c in _WEIGHT_BITS if weight & bit)
            return out
        if kind != QI_OPR:
            raise ConversionError(f"binary tsquery value has an item of unknown type {kind}")
        op = self.byte()
        if op not in _PRIORITY:
            raise ConversionError(f"binary tsquery value has an unknown operator {op}")
        priority = _PRIORITY[op]
        if op == OP_NOT:
            operand = "!" + self.infix(priority, False)
            return f"( {operand} )" if priority < parent else operand
        distance = 1
        if op == OP_PHRASE:
            if self.pos + 2 > len(self.data):
                raise ConversionError("binary tsquery value is truncated")
            (distance,) = struct.unpack_from(">h", self.data, self.pos)
            self.pos += 2
        right = self.infix(priority, op == OP_PHRASE)
        left = self.infix(priority, False)
        symbol = {OP_OR: "|", OP_AND: "&"}.get(op) or ("<->" if distance == 1 else f"<{distance}>")
        out = f"{left} {symbol} {right}"
        parenthesized = priority < parent or (op == OP_PHRASE and right_phrase)
        return f"( {out} )" if parenthesized else out


def tsquery_text(data: bytes) -> str:
    """tsqueryout of a binary tsquery (an empty query prints as nothing)."""
    if len(data) < 4:
        raise ConversionError("binary tsquery value is shorter than its item count")
    (count,) = _INT32.unpack_from(data)
    if count < 0:
        raise ConversionError("binary tsquery value has a negative item count")
    if count == 0:
        if len(data) != 4:
            raise ConversionError("binary tsquery value has bytes after its items")
        return ""
    query = _Query(data)
    out = query.infix(-1, False)
    # the items form one expression, read to the end: as many as the count says
    if query.pos != len(data) or query.items != count:
        raise ConversionError("binary tsquery value has bytes after its items")
    return out


CONVERTERS: dict[int, Converter] = {
    oids.TSVECTOR_OID: text_converter("tsvector", tsvector_text),
    oids.TSQUERY_OID: text_converter("tsquery", tsquery_text),
}
