"""bool values: Python bool, Arrow bool_. Text form 't'/'f', binary form one byte 1/0."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, fixed_width_numpy
from pgcdc.protocol.values.errors import ConversionError

__all__ = ["CONVERTERS"]

_TEXT = {"t": True, "f": False}
_BINARY = {b"\x01": True, b"\x00": False}


def _from_text(text: str) -> bool:
    try:
        return _TEXT[text]
    except KeyError:
        raise ConversionError("text bool value must be 't' or 'f' (boolout's output)") from None


def _from_binary(data: bytes) -> bool:
    try:
        return _BINARY[data]
    except KeyError:
        raise ConversionError("binary bool value must be one byte, 0 or 1") from None


def _render(data: bytes, timezone: str) -> str:
    return "t" if _from_binary(data) else "f"


def _arrow_type(typmod: int) -> Any:
    return pa.bool_()


def _arrow_text(values: list[str | None], arrow_type: Any) -> pa.Array:
    array = pa.array(values, pa.string())
    true = pc.equal(array, "t")
    valid = pc.or_(true, pc.equal(array, "f"))
    if pc.min(pc.fill_null(valid, True)).as_py() is False:
        raise ConversionError("text bool column holds a value other than 't' and 'f'")
    return true


def _arrow_binary(values: list[bytes | None], arrow_type: Any) -> pa.Array:
    array, mask = fixed_width_numpy(values, 1, "u1", "bool")
    if array.size and array.max() > 1:
        raise ConversionError("binary bool column holds a byte other than 0 and 1")
    return pa.array(array.astype(np.bool_), type=arrow_type, mask=mask)


CONVERTERS: dict[int, Converter] = {
    oids.BOOL_OID: Converter(
        "bool", _from_text, _from_binary, _render, _arrow_type, _arrow_text, _arrow_binary
    ),
}
