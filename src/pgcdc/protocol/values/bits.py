"""bit and varbit values: a str of '0' and '1' characters, Arrow string.

The binary form (bit_send/varbit_send) is an int32 bit count followed by the bits, packed
most significant first, the last byte padded with zero bits.
"""

from __future__ import annotations

import struct

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, text_converter
from pgcdc.protocol.values.errors import ConversionError

__all__ = ["CONVERTERS", "bits_text"]

_INT32 = struct.Struct(">i")


def bits_text(data: bytes) -> str:
    """bit_out of a binary bit/varbit value."""
    try:
        (nbits,) = _INT32.unpack_from(data)
    except struct.error:
        raise ConversionError("binary bit value is shorter than its 4-byte length") from None
    body = data[4:]
    if nbits < 0 or len(body) != (nbits + 7) // 8:
        raise ConversionError("binary bit value's length does not match its bit count")
    if not nbits:
        return ""
    return format(int.from_bytes(body, "big"), f"0{len(body) * 8}b")[:nbits]


CONVERTERS: dict[int, Converter] = {
    oids.BIT_OID: text_converter("bit", bits_text),
    oids.VARBIT_OID: text_converter("varbit", bits_text),
}
