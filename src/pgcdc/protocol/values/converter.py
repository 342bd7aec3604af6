"""The per-type conversion record every type family module provides, and shared helpers.

A ``Converter`` bundles what the codec can do with one PostgreSQL type: load a value sent in text
format ('t', a str) or binary format ('b', bytes) into Python, render a binary value the way the
type's output function prints it, and map a column of values to Arrow. Family modules
(``numeric``, ``datetime``, ...) build them; ``adapt`` dispatches on type OIDs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pgcdc.protocol.values.errors import ConversionError

__all__ = [
    "ArrowFromBinary",
    "ArrowFromText",
    "Converter",
    "fixed_width_numpy",
    "rendered_strings",
    "string_arrow_text",
    "text_converter",
]

ArrowFromText = Callable[[list[str | None], Any], pa.Array]
ArrowFromBinary = Callable[[list[bytes | None], Any], pa.Array]


@dataclass(frozen=True, slots=True)
class Converter:
    """What the codec does with one type.

    ``from_text``/``from_binary`` load one non-NULL value; ``render`` turns a binary value into
    the type's text output (``timezone`` matters only for timestamptz); ``arrow_type`` maps a
    type modifier to the Arrow type; ``arrow_text``/``arrow_binary`` convert a column (values may
    be None) to an Arrow array of the given Arrow type.
    """

    name: str
    from_text: Callable[[str], object]
    from_binary: Callable[[bytes], object]
    render: Callable[[bytes, str], str]
    arrow_type: Callable[[int], Any]
    arrow_text: ArrowFromText
    arrow_binary: ArrowFromBinary


def string_arrow_text(values: list[str | None], arrow_type: Any) -> pa.Array:
    """A text-format column stored as its text: Arrow string (or large_string)."""
    return pa.array(values, type=arrow_type)


def rendered_strings(render: Callable[[bytes, str], str]) -> ArrowFromBinary:
    """A binary-format column stored as the text the type's output function prints."""

    def convert(values: list[bytes | None], arrow_type: Any) -> pa.Array:
        return pa.array([None if v is None else render(v, "UTC") for v in values], arrow_type)

    return convert


def _string_type(typmod: int) -> Any:
    return pa.string()


def text_converter(
    name: str,
    decode: Callable[[bytes], str],
    from_text: Callable[[str], object] | None = None,
    from_binary: Callable[[bytes], object] | None = None,
) -> Converter:
    """A type stored in Arrow as its text form; its Python value is that text unless given.

    ``decode`` renders a binary value as the type's text output.
    """

    def render(data: bytes, timezone: str) -> str:
        return decode(data)

    return Converter(
        name=name,
        from_text=from_text if from_text is not None else _identity,
        from_binary=from_binary if from_binary is not None else decode,
        render=render,
        arrow_type=_string_type,
        arrow_text=string_arrow_text,
        arrow_binary=rendered_strings(render),
    )


def _identity(value: str) -> object:
    return value


def fixed_width_numpy(
    values: Sequence[bytes | None], width: int, dtype: str, type_name: str
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
    """Big-endian fixed-width binary values as a native numpy array, plus a NULL mask (or None).

    NULL slots hold zeros. Raises ConversionError when a value has the wrong length.
    """
    n = len(values)
    mask: np.ndarray[Any, Any] | None = None
    filled: Sequence[bytes | None] = values
    if None in values:
        filler = bytes(width)
        filled = [filler if v is None else v for v in values]
        mask = np.fromiter((v is None for v in values), dtype=np.bool_, count=n)
    if n and set(map(len, filled)) != {width}:  # type: ignore[arg-type]
        raise ConversionError(
            f"binary {type_name} values must be {width} bytes long; the column holds a value of "
            "another length (a corrupt stream, or a column declared with the wrong type OID)"
        )
    joined = b"".join(filled)  # type: ignore[arg-type]
    array = np.frombuffer(joined, dtype=np.dtype(dtype)).astype(np.dtype(dtype).newbyteorder("="))
    return array, mask
