"""The geometric types (point, line, lseg, box, path, polygon, circle): their text form as str,
Arrow string.

Their binary forms (geo_ops.c's ``*_send``) are float8 coordinates, big-endian: point ``x y``;
line ``A B C``; lseg ``x1 y1 x2 y2``; box ``high.x high.y low.x low.y``; path a closed byte,
an int32 point count, the points; polygon an int32 point count, the points; circle ``x y
radius``. Their output functions print each coordinate with float8out (extra_float_digits 1:
the shortest exact digits) in geo_ops.c's ``path_encode`` shapes: ``(x,y)``, ``{A,B,C}``,
``[(x1,y1),(x2,y2)]``, ``(x1,y1),(x2,y2)``, ``[(..),..]`` open or ``((..),..)`` closed,
``<(x,y),r>``.
"""

from __future__ import annotations

import struct

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, text_converter
from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.floats import format_float8

__all__ = ["CONVERTERS"]

_COUNT = struct.Struct(">i")


def _floats(data: bytes, count: int, name: str) -> tuple[float, ...]:
    if len(data) != 8 * count:
        raise ConversionError(
            f"binary {name} value must be {8 * count} bytes ({count} float8), got {len(data)}"
        )
    return struct.unpack(f">{count}d", data)


def _points(values: tuple[float, ...]) -> str:
    """path_encode's points: ``(x,y)`` each, comma-separated."""
    return ",".join(
        f"({format_float8(values[i])},{format_float8(values[i + 1])})"
        for i in range(0, len(values), 2)
    )


def _counted_points(data: bytes, offset: int, name: str) -> tuple[float, ...]:
    if len(data) < offset + 4:
        raise ConversionError(f"binary {name} value is shorter than its point count")
    (count,) = _COUNT.unpack_from(data, offset)
    if count < 0 or len(data) != offset + 4 + 16 * count:
        raise ConversionError(f"binary {name} value's length does not match its {count} points")
    return struct.unpack_from(f">{2 * count}d", data, offset + 4)


def point_text(data: bytes) -> str:
    return _points(_floats(data, 2, "point"))


def line_text(data: bytes) -> str:
    a, b, c = _floats(data, 3, "line")
    return f"{{{format_float8(a)},{format_float8(b)},{format_float8(c)}}}"


def lseg_text(data: bytes) -> str:
    return f"[{_points(_floats(data, 4, 'lseg'))}]"


def box_text(data: bytes) -> str:
    return _points(_floats(data, 4, "box"))


def path_text(data: bytes) -> str:
    if not data or data[0] not in (0, 1):
        raise ConversionError("binary path value must start with a closed flag of 0 or 1")
    points = _points(_counted_points(data, 1, "path"))
    return f"({points})" if data[0] else f"[{points}]"


def polygon_text(data: bytes) -> str:
    return f"({_points(_counted_points(data, 0, 'polygon'))})"


def circle_text(data: bytes) -> str:
    x, y, radius = _floats(data, 3, "circle")
    return f"<({format_float8(x)},{format_float8(y)}),{format_float8(radius)}>"


CONVERTERS: dict[int, Converter] = {
    oids.POINT_OID: text_converter("point", point_text),
    oids.LINE_OID: text_converter("line", line_text),
    oids.LSEG_OID: text_converter("lseg", lseg_text),
    oids.BOX_OID: text_converter("box", box_text),
    oids.PATH_OID: text_converter("path", path_text),
    oids.POLYGON_OID: text_converter("polygon", polygon_text),
    oids.CIRCLE_OID: text_converter("circle", circle_text),
}
