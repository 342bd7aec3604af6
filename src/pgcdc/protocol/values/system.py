"""PostgreSQL's own bookkeeping types: pg_lsn, pg_snapshot and txid_snapshot, tid, oidvector and
int2vector; their text form as str, Arrow string.

Binary forms: pg_lsn an uint64 (printed ``%X/%X``, its high and low halves); pg_snapshot and
txid_snapshot an int32 count of in-progress ids, xmin and xmax (int64), then those ids (printed
``xmin:xmax:id,id``); tid a block number (uint32) and an item offset (uint16), printed
``(block,offset)``; oidvector and int2vector are sent as one-dimensional arrays (array_send)
and printed as their elements separated by spaces.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.array import parse_binary_array
from pgcdc.protocol.values.converter import Converter, text_converter
from pgcdc.protocol.values.errors import ConversionError

__all__ = ["CONVERTERS"]

_TID = struct.Struct(">IH")
_SNAPSHOT = struct.Struct(">iqq")


def pg_lsn_text(data: bytes) -> str:
    if len(data) != 8:
        raise ConversionError(f"binary pg_lsn value must be 8 bytes, got {len(data)}")
    (lsn,) = struct.unpack(">Q", data)
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def snapshot_text(data: bytes) -> str:
    if len(data) < _SNAPSHOT.size:
        raise ConversionError("binary snapshot value is shorter than its header")
    count, xmin, xmax = _SNAPSHOT.unpack_from(data)
    if count < 0 or len(data) != _SNAPSHOT.size + 8 * count:
        raise ConversionError("binary snapshot value's length does not match its id count")
    running = struct.unpack_from(f">{count}q", data, _SNAPSHOT.size)
    return f"{xmin}:{xmax}:" + ",".join(map(str, running))


def tid_text(data: bytes) -> str:
    if len(data) != _TID.size:
        raise ConversionError(f"binary tid value must be {_TID.size} bytes, got {len(data)}")
    block, offset = _TID.unpack(data)
    return f"({block},{offset})"


def _vector(element: str, code: str, width: int) -> Callable[[bytes], str]:
    def text(data: bytes) -> str:
        parsed = parse_binary_array(data)
        if len(parsed.dims) > 1:
            raise ConversionError(f"binary {element}vector value has more than one dimension")
        out = []
        for value in parsed.elements:
            if value is None or len(value) != width:
                raise ConversionError(
                    f"binary {element}vector value has a NULL or malformed element"
                )
            out.append(str(struct.unpack(code, value)[0]))
        return " ".join(out)

    return text


oidvector_text = _vector("oid", ">I", 4)
int2vector_text = _vector("int2", ">h", 2)


CONVERTERS: dict[int, Converter] = {
    oids.PG_LSN_OID: text_converter("pg_lsn", pg_lsn_text),
    oids.PG_SNAPSHOT_OID: text_converter("pg_snapshot", snapshot_text),
    oids.TXID_SNAPSHOT_OID: text_converter("txid_snapshot", snapshot_text),
    oids.TID_OID: text_converter("tid", tid_text),
    oids.OIDVECTOR_OID: text_converter("oidvector", oidvector_text),
    oids.INT2VECTOR_OID: text_converter("int2vector", int2vector_text),
}
