"""Arrays: parsing both wire forms into nested lists, PostgreSQL's text output, Arrow lists.

Text form (array_out): ``{1,NULL,"a b"}``, nested braces per dimension, elements quoted when
empty, spelled NULL, or holding a quote, backslash, brace, the delimiter or whitespace (with ``\\``
escaping quotes and backslashes inside quotes), prefixed by ``[2:3]={...}`` when a lower bound
is not 1. Binary form (array_send): int32 ndim, int32 has-nulls flag, uint32 element type OID,
ndim pairs of int32 (size, lower bound), then each element as int32 length (-1 for NULL) and
bytes.

Python values are nested lists (lower bounds are not kept; an empty array is ``[]``). Arrow
columns are ``list_`` types nested once per dimension, built column-wise: all elements of the
batch are converted in one call of the element type's Arrow conversion.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from pgcdc.protocol.values.errors import ConversionError

__all__ = [
    "ParsedArray",
    "array_text",
    "arrow_lists",
    "map_nested",
    "parse_binary_array",
    "parse_text_array",
    "quote_element",
]

T = TypeVar("T")
_HEADER = struct.Struct(">iiI")
_DIM = struct.Struct(">ii")
_INT32 = struct.Struct(">i")
_MAXDIM = 6
_SPACE = " \t\n\r\v\f"
_NOT_SIMPLE = re.compile('["\\\\{}' + _SPACE + "]")  # quotes, escapes, nesting, whitespace


@dataclass(frozen=True, slots=True)
class ParsedArray:
    """One array value: its dimension sizes, lower bounds and elements as nested lists.

    ``elements`` is ``[]`` for an empty array (``dims == ()``); element values are the raw text
    (str) or binary (bytes) forms, or None for NULL. ``element_oid`` is the element type OID a
    binary array declares (0 for text).
    """

    dims: tuple[int, ...]
    lower_bounds: tuple[int, ...]
    elements: list[Any]
    element_oid: int = 0


# -- text -----------------------------------------------------------------------------------


def _bad_array(reason: str) -> ConversionError:
    return ConversionError(f"text array value is malformed: {reason}")


def parse_text_array(text: str, delimiter: str = ",") -> ParsedArray:
    """array_in's reading of array_out's output, elements left as text (None for NULL)."""
    lower_bounds: tuple[int, ...] = ()
    body = text
    if text.startswith("["):
        decoration, eq, body = text.partition("=")
        if not eq:
            raise _bad_array("dimension decoration without '='")
        bounds = re.findall(r"\[(-?\d+):(-?\d+)\]", decoration)
        if "".join(f"[{lo}:{hi}]" for lo, hi in bounds) != decoration:
            raise _bad_array("bad dimension decoration")
        lower_bounds = tuple(int(lo) for lo, _ in bounds)
    if not body.startswith("{") or not body.endswith("}"):
        raise _bad_array("missing braces")
    if body == "{}":
        return ParsedArray((), (), [])
    inner = body[1:-1]
    if not _NOT_SIMPLE.search(inner):
        # one dimension, nothing quoted, no whitespace: array_out's common case
        raw = inner.split(delimiter)
        if "" in raw:
            raise _bad_array("empty unquoted element")
        if lower_bounds and len(lower_bounds) != 1:
            raise _bad_array("decoration does not match the number of dimensions")
        items = [None if len(v) == 4 and v.upper() == "NULL" else v for v in raw]
        return ParsedArray((len(items),), lower_bounds or (1,), items)
    elements, end = _parse_level(body, 0, delimiter)
    if end != len(body):
        raise _bad_array("text after the closing brace")
    dims = _dims_of(elements)
    if lower_bounds and len(lower_bounds) != len(dims):
        raise _bad_array("decoration does not match the number of dimensions")
    return ParsedArray(dims, lower_bounds or (1,) * len(dims), elements)


def _is_null(item: str) -> bool:
    return len(item) == 4 and item.upper() == "NULL"


def _unquoted(item: str) -> str | None:
    stripped = item.strip(_SPACE)
    if not stripped:
        raise _bad_array("empty unquoted element")
    return None if _is_null(stripped) else stripped


def _parse_level(text: str, pos: int, delimiter: str) -> tuple[list[Any], int]:
    """Parse ``{...}`` starting at ``text[pos]``; the items and the position after '}'."""
    items: list[Any] = []
    pos += 1
    n = len(text)
    while True:
        while pos < n and text[pos] in _SPACE:
            pos += 1
        if pos >= n:
            raise _bad_array("unterminated braces")
        ch = text[pos]
        if ch == "}" and not items:
            return items, pos + 1
        if ch == "{":
            sub, pos = _parse_level(text, pos, delimiter)
            items.append(sub)
        elif ch == '"':
            buf = []
            pos += 1
            while True:
                if pos >= n:
                    raise _bad_array("unterminated quotes")
                c = text[pos]
                if c == "\\":
                    buf.append(text[pos + 1 : pos + 2])
                    pos += 2
                elif c == '"':
                    pos += 1
                    break
                else:
                    buf.append(c)
                    pos += 1
            items.append("".join(buf))
        else:
            buf = []
            escaped = False
            trailing = 0  # unescaped whitespace at the end of buf
            while pos < n and text[pos] != delimiter and text[pos] != "}":
                c = text[pos]
                if c == "\\":
                    buf.append(text[pos + 1 : pos + 2])
                    escaped = True
                    trailing = 0
                    pos += 2
                    continue
                if c in '{"':
                    raise _bad_array("unexpected character in an unquoted element")
                buf.append(c)
                trailing = trailing + 1 if c in _SPACE else 0
                pos += 1
            value = "".join(buf[: len(buf) - trailing] if trailing else buf)
            if not value and not escaped:
                raise _bad_array("empty unquoted element")
            items.append(None if not escaped and _is_null(value) else value)
        while pos < n and text[pos] in _SPACE:
            pos += 1
        if pos >= n:
            raise _bad_array("unterminated braces")
        if text[pos] == "}":
            return items, pos + 1
        if text[pos] != delimiter:
            raise _bad_array("expected a delimiter")
        pos += 1


def _dims_of(elements: list[Any]) -> tuple[int, ...]:
    dims = []
    level: Any = elements
    while isinstance(level, list):
        dims.append(len(level))
        level = level[0] if level else None
    if len(dims) > _MAXDIM:
        raise _bad_array(f"more than {_MAXDIM} dimensions")
    _check_rectangular(elements, dims, 0)
    return tuple(dims)


def _check_rectangular(items: list[Any], dims: list[int], depth: int) -> None:
    if len(items) != dims[depth]:
        raise _bad_array("sub-arrays of different sizes")
    last = depth == len(dims) - 1
    for item in items:
        if isinstance(item, list) == last:
            raise _bad_array("sub-arrays nested to different depths")
        if not last:
            _check_rectangular(item, dims, depth + 1)


_QUOTE_NEEDED: dict[str, re.Pattern[str]] = {}


def quote_element(text: str, delimiter: str = ",") -> str:
    """An element's text as array_out writes it: quoted and escaped only when needed."""
    pattern = _QUOTE_NEEDED.get(delimiter)
    if pattern is None:
        pattern = re.compile("[" + re.escape('"\\{}' + delimiter + _SPACE) + "]")
        _QUOTE_NEEDED[delimiter] = pattern
    if text and not pattern.search(text) and not _is_null(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def array_text(parsed: ParsedArray, render: Callable[[Any], str], delimiter: str = ",") -> str:
    """array_out of a parsed array, elements printed with ``render`` (None prints NULL)."""
    if not parsed.dims:
        return "{}"
    prefix = ""
    if any(lb != 1 for lb in parsed.lower_bounds):
        prefix = (
            "".join(
                f"[{lb}:{lb + size - 1}]"
                for lb, size in zip(parsed.lower_bounds, parsed.dims, strict=True)
            )
            + "="
        )

    def level(items: list[Any]) -> str:
        parts = []
        for item in items:
            if isinstance(item, list):
                parts.append(level(item))
            elif item is None:
                parts.append("NULL")
            else:
                parts.append(quote_element(render(item), delimiter))
        return "{" + delimiter.join(parts) + "}"

    return prefix + level(parsed.elements)


# -- binary ---------------------------------------------------------------------------------


def parse_binary_array(data: bytes) -> ParsedArray:
    """array_recv's reading of array_send's output, elements left as bytes (None for NULL)."""
    try:
        ndim, flags, element_oid = _HEADER.unpack_from(data)
        if ndim < 0 or ndim > _MAXDIM or flags not in (0, 1):
            raise ConversionError("binary array value has an invalid header")
        if ndim == 0:
            return ParsedArray((), (), [], element_oid)
        dims = []
        lbs = []
        pos = 12
        for _ in range(ndim):
            size, lb = _DIM.unpack_from(data, pos)
            if size < 0:
                raise ConversionError("binary array value has a negative dimension")
            dims.append(size)
            lbs.append(lb)
            pos += 8
        total = 1
        for size in dims:
            total *= size
        flat: list[bytes | None] = []
        unpack = _INT32.unpack_from
        for _ in range(total):
            (length,) = unpack(data, pos)
            pos += 4
            if length < 0:
                flat.append(None)
            else:
                end = pos + length
                if end > len(data):
                    raise struct.error
                flat.append(data[pos:end])
                pos = end
    except struct.error:
        raise ConversionError("binary array value is truncated") from None
    if pos != len(data):
        raise ConversionError("binary array value has bytes after its last element")
    if total == 0:
        return ParsedArray((), (), [], element_oid)
    return ParsedArray(tuple(dims), tuple(lbs), _nest(flat, dims), element_oid)


def _nest(flat: list[Any], dims: Sequence[int]) -> list[Any]:
    items = flat
    for size in reversed(dims[1:]):
        items = [items[i : i + size] for i in range(0, len(items), size)]
    return items


# -- conversion of the elements -------------------------------------------------------------


def map_nested(items: list[Any], fn: Callable[[Any], T]) -> list[Any]:
    """Nested lists with ``fn`` applied to every non-None leaf."""
    return [
        map_nested(item, fn) if isinstance(item, list) else None if item is None else fn(item)
        for item in items
    ]


def arrow_lists(
    parsed: Sequence[ParsedArray | None],
    ndims: int,
    convert_leaves: Callable[[list[Any]], pa.Array],
    list_type: Any,
    type_name: str,
) -> pa.Array:
    """A ``list_`` column nested ``ndims`` deep from parsed arrays (None for NULL rows).

    ``convert_leaves`` turns the flat list of all elements (raw text/bytes or None) into the
    element Arrow array. An empty array is an empty list whatever ``ndims`` is; any other array
    must have exactly ``ndims`` dimensions.
    """
    n = len(parsed)
    offsets: list[list[int]] = [[0] for _ in range(ndims)]
    leaves: list[Any] = []
    mask = np.zeros(n, dtype=np.bool_)
    for row, value in enumerate(parsed):
        top = offsets[0]
        if value is None:
            mask[row] = True
            top.append(top[-1])
            continue
        if not value.dims:
            top.append(top[-1])
            continue
        if len(value.dims) != ndims:
            raise ConversionError(
                f"{type_name} value has {len(value.dims)} dimension(s) but the column is mapped "
                f"with ndims={ndims}: pass the ndims the column's arrays really have"
            )
        if ndims == 1:
            top.append(top[-1] + len(value.elements))
            leaves.extend(value.elements)
        else:
            _flatten(value.elements, 0, ndims, offsets, leaves)
    values = convert_leaves(leaves)
    for depth in range(ndims - 1, 0, -1):
        values = pa.ListArray.from_arrays(pa.array(offsets[depth], pa.int32()), values)
    result = pa.ListArray.from_arrays(
        pa.array(offsets[0], pa.int32()), values, mask=pa.array(mask) if mask.any() else None
    )
    return result.cast(list_type) if result.type != list_type else result


def _flatten(
    items: list[Any], depth: int, ndims: int, offsets: list[list[int]], leaves: list[Any]
) -> None:
    level = offsets[depth]
    level.append(level[-1] + len(items))
    if depth == ndims - 1:
        leaves.extend(items)
    else:
        for item in items:
            _flatten(item, depth + 1, ndims, offsets, leaves)
