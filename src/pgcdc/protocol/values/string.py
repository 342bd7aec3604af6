"""Character and byte string values: text, varchar, bpchar, name, "char", xml, refcursor, bytea,
and the labels of enums.

All character types load as str and map to Arrow string; their binary form is the text itself
(UTF-8, the replication connection's client encoding). "char" is a single byte whose output
prints bytes >= 0x80 as a backslash and three octal digits. bytea loads as bytes and maps to Arrow
binary; its text form is ``\\x`` and hex digits (bytea_output = hex; the escape format is read
too), its binary form the raw bytes.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, text_converter
from pgcdc.protocol.values.errors import ConversionError

__all__ = ["BYTEA", "CONVERTERS", "ENUM", "bytea_from_text", "char_text", "decode_utf8"]


def decode_utf8(data: bytes) -> str:
    """A binary text value: the string in UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConversionError(
            "binary text value is not valid UTF-8: set client_encoding to UTF8 on the "
            "replication connection"
        ) from None


def char_text(data: bytes) -> str:
    """charout of a binary "char": the character, ``\\ooo`` above 0x7f, '' for NUL."""
    if len(data) != 1:
        raise ConversionError(f'binary "char" value must be 1 byte, got {len(data)}')
    byte = data[0]
    if byte >= 0x80:
        return f"\\{byte:03o}"
    return "" if byte == 0 else chr(byte)


def bytea_from_text(text: str) -> bytes:
    """byteain of bytea_out's output: hex (``\\x0102``) or the escape format."""
    if text.startswith("\\x"):
        try:
            return bytes.fromhex(text[2:])
        except ValueError:
            raise ConversionError("text bytea value has invalid hex digits") from None
    if "\\" not in text:
        return text.encode("utf-8")
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
        elif text[i + 1 : i + 2] == "\\":
            out.append(0x5C)
            i += 2
        else:
            octal = text[i + 1 : i + 4]
            if len(octal) != 3 or not all(c in "01234567" for c in octal):
                raise ConversionError("text bytea value has an invalid escape sequence")
            out.append(int(octal, 8) & 0xFF)
            i += 4
    return bytes(out)


def _bytea_text(data: bytes) -> str:
    return "\\x" + data.hex()


def _bytea_from_binary(data: bytes) -> bytes:
    return bytes(data)


def _bytea_render(data: bytes, timezone: str) -> str:
    return _bytea_text(data)


def _binary_type(typmod: int) -> Any:
    return pa.binary()


def _bytea_arrow_text(values: list[str | None], arrow_type: Any) -> pa.Array:
    return pa.array([None if v is None else bytea_from_text(v) for v in values], arrow_type)


def _bytea_arrow_binary(values: list[bytes | None], arrow_type: Any) -> pa.Array:
    return pa.array(values, arrow_type)


BYTEA = Converter(
    "bytea",
    bytea_from_text,
    _bytea_from_binary,
    _bytea_render,
    _binary_type,
    _bytea_arrow_text,
    _bytea_arrow_binary,
)

#: Enum values: the label, sent as text in both formats.
ENUM = text_converter("enum", decode_utf8)

CONVERTERS: dict[int, Converter] = {
    oids.TEXT_OID: text_converter("text", decode_utf8),
    oids.VARCHAR_OID: text_converter("varchar", decode_utf8),
    oids.BPCHAR_OID: text_converter("bpchar", decode_utf8),
    oids.NAME_OID: text_converter("name", decode_utf8),
    oids.XML_OID: text_converter("xml", decode_utf8),
    oids.REFCURSOR_OID: text_converter("refcursor", decode_utf8),
    # a stored expression's node tree (pg_node_tree_send is textsend)
    oids.PG_NODE_TREE_OID: text_converter("pg_node_tree", decode_utf8),
    # an untyped literal (a column of ``ROW(1, 'a')``): unknownsend and unknownout are text's
    oids.UNKNOWN_OID: text_converter("unknown", decode_utf8),
    oids.CHAR_OID: text_converter('"char"', char_text),
    oids.BYTEA_OID: BYTEA,
}
