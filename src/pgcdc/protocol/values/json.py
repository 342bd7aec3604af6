"""json, jsonb and jsonpath values: the JSON text as str (not parsed: lossless), Arrow string.

json's binary form is its text; jsonb's and jsonpath's binary forms are a version byte (1)
followed by the text their output functions print (jsonb_out's normalized form, such as
``{"a": 1, "b": [1, 2]}``).
"""

from __future__ import annotations

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, text_converter
from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.string import decode_utf8

__all__ = ["CONVERTERS", "jsonb_text"]


def jsonb_text(data: bytes) -> str:
    """jsonb_out of a binary jsonb (also jsonpath): the text after the version byte."""
    if data[:1] != b"\x01":
        version = data[0] if data else None
        raise ConversionError(
            f"binary jsonb/jsonpath value has unsupported format version {version} (only 1 "
            "exists); stream the column in text format"
        )
    return decode_utf8(data[1:])


CONVERTERS: dict[int, Converter] = {
    oids.JSON_OID: text_converter("json", decode_utf8),
    oids.JSONB_OID: text_converter("jsonb", jsonb_text),
    oids.JSONPATH_OID: text_converter("jsonpath", jsonb_text),
}
