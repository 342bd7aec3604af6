"""uuid values: Python ``uuid.UUID``, Arrow string (the lowercase hyphenated text form).

The binary form is the 16 bytes of the UUID.
"""

from __future__ import annotations

from uuid import UUID

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, text_converter
from pgcdc.protocol.values.errors import ConversionError

__all__ = ["CONVERTERS", "uuid_text"]


def _check(data: bytes) -> bytes:
    if len(data) != 16:
        raise ConversionError(f"binary uuid value must be 16 bytes, got {len(data)}")
    return data


def uuid_text(data: bytes) -> str:
    """uuid_out of a binary uuid."""
    h = _check(data).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _from_text(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise ConversionError("text uuid value is not a UUID") from None


def _from_binary(data: bytes) -> UUID:
    return UUID(bytes=_check(data))


CONVERTERS: dict[int, Converter] = {
    oids.UUID_OID: text_converter("uuid", uuid_text, _from_text, _from_binary),
}
