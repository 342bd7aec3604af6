"""Message framing for column-wise decoding: many pgoutput messages in one buffer, read with numpy.

``MessageTable`` joins a list of messages into one Arrow buffer and gives, per message, its start,
end and type byte as numpy arrays, plus big-endian views that read an integer of any width at any
byte offset of the buffer in one vectorized gather.

``walk_tuples`` reads the TupleData parts of many messages of one relation at once: column by
column, for all rows together, it gathers the kind byte ('n', 'u', 't', 'b') and the value length,
and steps every row's position past the value, a block of rows at a time so their bytes stay in
the CPU cache. The result, ``TupleColumns``, says for every (column, row) its kind and where its
value bytes are in the buffer; no value is copied.

``walk_copy_rows`` does the same for the tuples of ``COPY ... TO STDOUT (FORMAT binary)``, whose
layout is TupleData's without the kind bytes: an Int16 field count, then per field an Int32
length (-1 for NULL) and the value's bytes, in its type's binary (send) form.

Nothing here raises ``ProtocolError``: any inconsistency (wrong column count, unknown kind,
negative length, a tuple that does not end where its message ends, a position outside the
buffer) raises ``FramingMismatch``, and the caller then finds and reports the exact first error
with the row decoder, which owns the error rules and offsets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pgcdc.errors import PgcdcError

__all__ = [
    "KIND_BINARY",
    "KIND_NULL",
    "KIND_TEXT",
    "KIND_UNCHANGED",
    "FramingMismatch",
    "MessageTable",
    "TupleColumns",
    "walk_copy_rows",
    "walk_tuples",
]

KIND_NULL = 0x6E  # 'n'
KIND_UNCHANGED = 0x75  # 'u'
KIND_TEXT = 0x74  # 't'
KIND_BINARY = 0x62  # 'b'

I64 = npt.NDArray[np.int64]
U32 = npt.NDArray[np.uint32]
U8 = npt.NDArray[np.uint8]
Bools = npt.NDArray[np.bool_]

#: True for the kinds followed by a length and value bytes.
HAS_VALUE: Bools = np.zeros(256, dtype=np.bool_)
HAS_VALUE[[KIND_TEXT, KIND_BINARY]] = True
#: True for the four kinds a TupleData column may have.
KNOWN_KIND: Bools = np.zeros(256, dtype=np.bool_)
KNOWN_KIND[[KIND_TEXT, KIND_BINARY, KIND_NULL, KIND_UNCHANGED]] = True
#: Rows walked together: their messages (about 200 bytes each) stay in the CPU cache.
_BLOCK_ROWS = 8192
#: Step back over the length a value-less kind does not have.
_BACK = np.int64(-4)


_TAIL = bytes(16)


class FramingMismatch(PgcdcError):
    """The vectorized reader met something malformed; the row decoder will say exactly what."""


def _be_view(buffer: pa.Buffer, dtype: str, offset: int, size: int) -> npt.NDArray[np.generic]:
    """A view reading ``dtype`` (big-endian) starting at every byte: view[q] is at q + offset."""
    count = max(len(buffer) - offset - size + 1, 0)
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.ndarray((count,), dtype=dtype, buffer=buffer, offset=offset, strides=(1,))


@dataclass(frozen=True, slots=True, eq=False)
class MessageTable:
    """Messages joined into one buffer, with per-message starts, ends and type bytes."""

    buffer: pa.Buffer
    data: U8  # the buffer as bytes
    starts: I64  # start of each message in the buffer
    ends: I64  # end (exclusive) of each message
    types: U8  # type byte of each message (0 for an empty message)
    u32: npt.NDArray[np.uint32]  # u32[q]: big-endian uint32 at q
    i16: npt.NDArray[np.int16]  # i16[q]: big-endian int16 at q
    len_after_kind: npt.NDArray[np.uint32]  # big-endian uint32 at q + 1 (after a kind byte)
    longest: int  # length of the longest message
    views: dict[str, npt.NDArray[Any]] = field(default_factory=dict)

    @classmethod
    def from_messages(cls, messages: Sequence[bytes | bytearray | memoryview]) -> MessageTable:
        # a zeroed tail after the last message keeps every fixed-size read of a well-formed
        # stream inside the buffer (the walk reads a length after every kind byte, even 'n')
        n = len(messages)
        padded = [*messages, _TAIL]
        try:
            joined = pa.array(padded, type=pa.large_binary())
        except (TypeError, pa.ArrowException):
            joined = pa.array([bytes(m) for m in padded], type=pa.large_binary())
        _, offsets_buf, data_buf = joined.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=n + 1)
        data = np.frombuffer(data_buf, dtype=np.uint8)
        starts = offsets[:-1]
        ends = offsets[1:]
        types = np.zeros(n, dtype=np.uint8)
        nonempty = ends > starts
        if nonempty.all():
            types = data[starts]
        else:
            types[nonempty] = data[starts[nonempty]]
        return cls(
            buffer=data_buf,
            data=data,
            starts=starts,
            ends=ends,
            types=types,
            u32=_be_view(data_buf, ">u4", 0, 4),  # type: ignore[arg-type]
            i16=_be_view(data_buf, ">i2", 0, 2),  # type: ignore[arg-type]
            len_after_kind=_be_view(data_buf, ">u4", 1, 4),  # type: ignore[arg-type]
            longest=int((ends - starts).max(initial=0)),
        )

    def __len__(self) -> int:
        return len(self.starts)

    def be_view(self, dtype: str) -> npt.NDArray[Any]:
        """A view reading ``dtype`` (say ``">i8"``) at any byte offset: view[q] is at q."""
        view = self.views.get(dtype)
        if view is None:
            if np.dtype(dtype).itemsize == 1:
                view = self.data.view(dtype)
            else:
                view = _be_view(self.buffer, dtype, 0, np.dtype(dtype).itemsize)
            self.views[dtype] = view
        return view


@dataclass(frozen=True, slots=True, eq=False)
class TupleColumns:
    """Where each value of many TupleData parts is: arrays shaped (columns, rows).

    ``kinds`` holds the kind byte; ``starts`` the buffer offset of the value bytes and
    ``lengths`` their length, both meaningful only where ``has_value`` (kind 't' or 'b').
    ``row_starts`` is each row's message start, a safe in-bounds offset for rows without a value.
    """

    kinds: U8
    starts: I64
    lengths: U32
    has_value: Bools
    row_starts: I64

    def take(self, rows: npt.NDArray[np.intp], total: int, row_starts: I64) -> TupleColumns:
        """These columns spread over ``total`` rows at ``rows``; other rows get NULL ('n')."""
        ncols = self.kinds.shape[0]
        kinds = np.full((ncols, total), KIND_NULL, dtype=np.uint8)
        kinds[:, rows] = self.kinds
        starts = np.broadcast_to(row_starts, (ncols, total)).copy()
        starts[:, rows] = self.starts
        lengths = np.zeros((ncols, total), dtype=np.uint32)
        lengths[:, rows] = self.lengths
        has_value = np.zeros((ncols, total), dtype=np.bool_)
        has_value[:, rows] = self.has_value
        return TupleColumns(kinds, starts, lengths, has_value, row_starts)


def walk_tuples(
    table: MessageTable, positions: I64, ncols: int, row_starts: I64
) -> tuple[TupleColumns, I64]:
    """Read the TupleData parts starting at ``positions`` (their Int16 column count).

    Every part must have exactly ``ncols`` columns. Returns the columns and, per row, the
    position right after the part; the caller checks that against what must follow (the end
    of the message or an 'N' marker). Raises ``FramingMismatch`` for anything malformed.
    """

    def walk(pos: I64, block: slice, out: TupleColumns) -> I64:
        return _walk_block(
            table,
            pos,
            kinds=out.kinds[:, block],
            starts=out.starts[:, block],
            lengths=out.lengths[:, block],
            has_value=out.has_value[:, block],
        )

    cols, ends = _walk(table, positions, ncols, row_starts, what="TupleData", walk=walk)
    if ncols and len(positions) and not KNOWN_KIND[cols.kinds].all():
        raise FramingMismatch("unknown TupleData kind")
    return cols, ends


def _walk(
    table: MessageTable,
    positions: I64,
    ncols: int,
    row_starts: I64,
    *,
    what: str,
    walk: Callable[[I64, slice, TupleColumns], I64],
) -> tuple[TupleColumns, I64]:
    """What reading tuples (``what``: TupleData or COPY) at ``positions`` takes beside reading
    their fields: the Int16 count checked against ``ncols``, the (column, row) outputs, the
    rows walked a block at a time (``walk(first field's position, rows, outputs)`` fills a
    block's outputs and returns where its tuples end), and the length check."""
    rows = len(positions)
    try:
        counts = table.i16[positions]
    except IndexError:
        raise FramingMismatch(f"{what} column count outside the buffer") from None
    if rows and not (counts == ncols).all():
        raise FramingMismatch(f"{what} column count differs from the relation")
    cols = TupleColumns(
        np.empty((ncols, rows), dtype=np.uint8),
        np.empty((ncols, rows), dtype=np.int64),
        np.empty((ncols, rows), dtype=np.uint32),
        np.empty((ncols, rows), dtype=np.bool_),
        row_starts,
    )
    ends = np.empty(rows, dtype=np.int64)
    try:
        # a block of rows at a time, so their messages stay in the CPU cache for all columns
        for first in range(0, rows, _BLOCK_ROWS):
            block = slice(first, first + _BLOCK_ROWS)
            ends[block] = walk(positions[block] + 2, block, cols)
    except IndexError:
        raise FramingMismatch(f"{what} value outside the buffer") from None
    if ncols and rows and table.longest >= 2**31 and (cols.lengths[cols.has_value] >= 2**31).any():
        raise FramingMismatch(f"negative {what} value length")
    return cols, ends


def _walk_block(
    table: MessageTable, pos: I64, *, kinds: U8, starts: I64, lengths: U32, has_value: Bools
) -> I64:
    """Fill the (column, row) outputs for rows whose first column's kind byte is at ``pos``.

    Lengths are read unsigned: a negative one jumps past the end of its message, which the
    caller's end check catches without a separate pass (messages are shorter than 2 GiB).
    """
    data = table.data
    len_view = table.len_after_kind
    for j in range(kinds.shape[0]):
        kind = np.take(data, pos, out=kinds[j])
        lengths[j] = len_view[pos]
        start = np.add(pos, 5, out=starts[j])
        valued = np.take(HAS_VALUE, kind, out=has_value[j])
        pos = start + np.where(valued, lengths[j], _BACK)
    return pos


def walk_copy_rows(
    table: MessageTable, positions: I64, kinds_by_column: Sequence[int], row_starts: I64
) -> tuple[TupleColumns, I64]:
    """Read the COPY binary tuples starting at ``positions`` (their Int16 field count).

    Every tuple must have ``len(kinds_by_column)`` fields; a field's value gets the kind given
    for its column (``KIND_BINARY``, or ``KIND_TEXT`` for a column the COPY casts to text), a
    NULL (length -1) ``KIND_NULL``. Returns the columns and, per row, the position right after the
    tuple. Raises ``FramingMismatch`` for anything malformed.
    """
    null = np.uint32(0xFFFFFFFF)

    def walk(pos: I64, block: slice, out: TupleColumns) -> I64:
        for j, kind in enumerate(kinds_by_column):
            length = table.u32[pos]
            out.lengths[j, block] = length
            valued = np.not_equal(length, null, out=out.has_value[j, block])
            out.kinds[j, block] = np.where(valued, np.uint8(kind), np.uint8(KIND_NULL))
            start = np.add(pos, 4, out=out.starts[j, block])
            pos = start + np.where(valued, length, 0)
        return pos

    return _walk(table, positions, len(kinds_by_column), row_starts, what="COPY", walk=walk)
