"""Column-wise decoding of pgoutput streams into typed Arrow record batches, one per relation.

``ColumnarDecoder.decode`` takes a list of raw messages (exactly what ``Decoder.decode`` takes,
in stream order) and returns a ``ColumnarBatch``: the Insert, Update and Delete messages as Arrow
``RecordBatch`` es per relation, and every other message decoded by the row ``Decoder`` with its
index. It never builds a Python object per change: the messages are joined into one buffer, and
numpy reads every message's type, relation and TupleData layout column by column for all rows
at once (``pgcdc.protocol.arrow.framing``); Arrow kernels then parse the values in place
(``pgcdc.protocol.arrow.typed_arrays``). Long inputs are read in blocks of ``_BLOCK_MESSAGES`` (so a
block's bytes stay in the CPU cache while its columns are read) and the blocks' batches joined.

Each ``RelationBatch`` holds the changes of one relation while its schema stays the same (a
Relation message that changes it starts a new one). Its columns:

* ``_seq`` int64: index of the message in the list given to ``decode``; merging the batches on it
  gives back stream order;
* ``_op`` dictionary<int8, string>: 'I', 'U' or 'D';
* ``_xid`` uint32: the Xid of the streamed transaction inside Stream Start/Stop, else null;
* one column per relation column: the new row image, typed (null for a Delete);
* ``_old`` struct of the relation's columns: the old key ('K') or old row ('O'), null if not sent;
* ``_old_kind`` dictionary<int8, string>: 'K', 'O' or null;
* ``_unchanged`` list<string>: names of columns whose new value was not sent because it is an
  unchanged TOASTed value ('u'); those columns read null in the new image. PostgreSQL never sends
  'u' in an old tuple (it flattens TOASTed old values), and one would read null in ``_old``.

``decode_copy`` reads the tuples of ``COPY ... TO STDOUT (FORMAT binary)`` of a described relation
the same way (the COPY binary tuple is TupleData without kind bytes, with the same send-function
values), into a ``RelationBatch`` of Inserts: a table's initial copy gets exactly the types and
values of its stream.

Malformed input raises ``ProtocolError`` under the rules and offsets of ``Decoder`` (the first bad
message in stream order; a note says which), plus: a change to a relation no Relation message
described, a TupleData whose column count differs from its relation's, and a value its column's
type cannot take. After an error the decoder's state is what it was before the call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pgcdc.protocol.arrow.framing import (
    KIND_BINARY,
    KIND_TEXT,
    KIND_UNCHANGED,
    FramingMismatch,
    MessageTable,
    TupleColumns,
    walk_copy_rows,
    walk_tuples,
)
from pgcdc.protocol.arrow.typed_arrays import (
    BadValue,
    ColumnReader,
    ColumnSlices,
    column_reader,
    text_reader,
)
from pgcdc.protocol.decoder import Decoder
from pgcdc.protocol.encoder import encode_tuple
from pgcdc.protocol.errors import CopyFormatError, ProtocolError
from pgcdc.protocol.messages import Delete, Insert, Relation, ReplicationMessage, Update

if TYPE_CHECKING:
    from pgcdc.protocol.values.registry import TypeRegistry

__all__ = ["ColumnarBatch", "ColumnarDecoder", "RelationBatch"]

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

_INSERT, _UPDATE, _DELETE = 0x49, 0x55, 0x44  # 'I' 'U' 'D'
_NEW, _KEY, _OLD = 0x4E, 0x4B, 0x4F  # 'N' 'K' 'O'

#: Change message types; _OP_INDEX maps a type byte to its index in _OPS.
_IS_CHANGE = np.zeros(256, dtype=np.bool_)
_IS_CHANGE[[_INSERT, _UPDATE, _DELETE]] = True
_OP_INDEX = np.zeros(256, dtype=np.int8)
_OP_INDEX[[_INSERT, _UPDATE, _DELETE]] = [0, 1, 2]
_OPS = pa.array(["I", "U", "D"], pa.string())
_OLD_KINDS = pa.array(["K", "O"], pa.string())
_DICTIONARY = pa.dictionary(pa.int8(), pa.string())

#: Messages decoded together; a block's buffer (about 200 bytes a message) stays in the CPU
#: cache while its columns are read one after another. Larger inputs go block by block.
_BLOCK_MESSAGES = 32_768
#: Past this many distinct relations in one call, rows are grouped by sorting instead.
_PEEL_LIMIT = 8


@dataclass(frozen=True, slots=True)
class RelationBatch:
    """The changes of one relation, under one schema, as an Arrow record batch."""

    relation: Relation
    batch: pa.RecordBatch

    @property
    def relation_id(self) -> int:
        return self.relation.relation_id


@dataclass(frozen=True, slots=True)
class ColumnarBatch:
    """What one ``ColumnarDecoder.decode`` call read.

    ``changes``: one RelationBatch per relation and schema, ordered by their first ``_seq``;
    ``others``: every non-change message with its index in the input, in order.
    """

    changes: tuple[RelationBatch, ...]
    others: tuple[tuple[int, ReplicationMessage], ...]
    message_count: int

    @property
    def change_count(self) -> int:
        return sum(part.batch.num_rows for part in self.changes)


@dataclass(frozen=True, slots=True, eq=False)
class _Layout:
    """What decoding a relation's changes needs: its readers and Arrow schema."""

    relation: Relation
    readers: tuple[ColumnReader, ...]
    schema: pa.Schema
    old_type: pa.StructType
    names: pa.Array


class _ValueFailure(Exception):
    """A value its column's type cannot take, located in the input."""

    def __init__(self, index: int, error: ProtocolError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


def _same_shape(a: Relation, b: Relation) -> bool:
    return (
        a.columns == b.columns
        and a.namespace == b.namespace
        and a.name == b.name
        and a.replica_identity == b.replica_identity
    )


class ColumnarDecoder:
    """Decodes lists of pgoutput messages column-wise into Arrow record batches.

    Stateful across calls like ``Decoder``: it remembers the relations described so far and
    whether a streamed block is open. ``registry`` (a ``pgcdc.protocol.values.TypeRegistry``)
    describes user types (enums, domains, ...); load it from the catalog before the Relation
    messages that use them, since a relation's Arrow schema is fixed when its Relation message is
    read (Type messages carry too little to fill it). Text values must be UTF-8.
    """

    __slots__ = ("_decoder", "_layouts", "as_text", "proto_version", "registry")

    def __init__(
        self,
        proto_version: int = 1,
        registry: TypeRegistry | None = None,
        *,
        encoding: str = "utf-8",
        as_text: Callable[[Relation], Collection[str]] | None = None,
    ) -> None:
        if encoding.lower().replace("-", "").replace("_", "") not in ("utf8", "unicode"):
            raise ValueError(
                f"ColumnarDecoder reads UTF-8 text only, not {encoding!r}; use Decoder for "
                "other encodings (or a UTF-8 database / client_encoding)"
            )
        self._decoder = Decoder(proto_version)
        self.proto_version = proto_version
        self.registry = registry
        #: the columns (by name) of a relation to read as their type's text (``text_reader``)
        self.as_text = as_text
        self._layouts: dict[int, _Layout] = {}

    # -- state -------------------------------------------------------------------------------
    @property
    def relations(self) -> Mapping[int, Relation]:
        """The latest Relation message seen for each relation OID."""
        return {relid: layout.relation for relid, layout in self._layouts.items()}

    @property
    def stream_xid(self) -> int | None:
        """Xid of the streamed transaction whose block is open, None outside Stream Start/Stop."""
        return self._decoder.stream_xid

    def reset(self) -> None:
        """Forget any open streamed block (a new connection starts outside one)."""
        self._decoder.reset()

    def arrow_schema(self, relation: Relation) -> pa.Schema:
        """The schema of the record batches this decoder makes for ``relation``."""
        return self._layout(relation).schema

    # -- decoding ----------------------------------------------------------------------------
    def decode(
        self,
        messages: Sequence[bytes],
        *,
        streams: Sequence[tuple[int, int | None]] | None = None,
    ) -> ColumnarBatch:
        """Decode ``messages`` (in stream order). Raises ProtocolError for malformed input.

        ``streams`` gives the stream context directly, for messages read out of their stream
        (a spool, an index) without their blocks' Stream Start and Stop: ``(index, xid)``
        pairs in index order, each saying that the messages from ``index`` on belong to the
        streamed block of ``xid`` (None: to no block), so that they are read with their Xid.
        Messages before the first pair belong to no block, and the decoder is outside any
        block afterwards. Without it, the Stream Start and Stop messages decoded set the
        context.
        """
        if not len(messages):
            return ColumnarBatch((), (), 0)
        runs = _stream_runs(len(messages), streams)
        saved_xid = self._decoder.stream_xid
        layouts = dict(self._layouts)
        try:
            parts: list[tuple[_Layout, pa.RecordBatch]] = []
            others: list[tuple[int, ReplicationMessage]] = []
            for start, end, xid in runs:
                if streams is not None:
                    self._decoder.stream_xid = xid
                # a block at a time, so its messages stay in the CPU cache while every column
                # is read
                for offset in range(start, end, _BLOCK_MESSAGES):
                    block = messages[offset : min(offset + _BLOCK_MESSAGES, end)]
                    self._decode_block(block, offset, layouts, parts, others)
            result = ColumnarBatch(_merge(parts), tuple(others), len(messages))
        except (FramingMismatch, ProtocolError) as exc:
            self._decoder.stream_xid = saved_xid
            self._raise_first_error(messages, saved_xid, streams)
            raise RuntimeError(
                "the columnar decoder found malformed input that the row decoder accepts; "
                "please report this as a bug in pgcdc.protocol.arrow.columnar"
            ) from exc
        except _ValueFailure as failure:
            self._decoder.stream_xid = saved_xid
            self._raise_first_error(messages, saved_xid, streams)
            failure.error.add_note(f"message {failure.index} of the {len(messages)} decoded")
            raise failure.error from None
        except BaseException:
            self._decoder.stream_xid = saved_xid
            raise
        if streams is not None:
            self._decoder.stream_xid = None
        self._layouts = layouts
        return result

    def decode_copy(
        self,
        relation_id: int,
        rows: Sequence[bytes],
        *,
        text_columns: Collection[int] = (),
    ) -> RelationBatch:
        """Tuples of ``COPY ... TO STDOUT (FORMAT binary)`` of a described relation, as Inserts.

        Each element of ``rows`` is exactly one tuple, without the file's header or trailer
        (PostgreSQL sends every tuple in a CopyData message of its own; the first message also
        carries the header, the last one is the trailer). The tuple's fields are the relation's
        columns, in order, in their types' binary form, except the (0-based) ``text_columns``,
        which the COPY cast to ``text``: their values are read as text. ``_seq`` is the row's
        index in ``rows``; ``_xid``, ``_old`` and ``_old_kind`` are null. Raises
        ``CopyFormatError`` (with the row and offset) for an element that is not exactly one
        tuple of the relation's columns, or a value its column's type cannot take.
        """
        layout = self._layouts.get(relation_id)
        if layout is None:
            raise ValueError(
                f"relation OID {relation_id} was not described: decode its Relation message first"
            )
        n = len(rows)
        if not n:
            return RelationBatch(layout.relation, pa.RecordBatch.from_pylist([], layout.schema))
        kinds = [
            KIND_TEXT if j in text_columns else KIND_BINARY for j in range(len(layout.readers))
        ]
        table = MessageTable.from_messages(rows)
        try:
            cols, ends = walk_copy_rows(table, table.starts, kinds, table.starts)
            if not (ends == table.ends).all():
                raise FramingMismatch("a COPY tuple does not end where its row ends")
        except FramingMismatch:
            _raise_first_copy_error(rows, len(kinds))
            raise RuntimeError(
                "the columnar decoder found a malformed COPY tuple that the row check accepts; "
                "please report this as a bug in pgcdc.protocol.arrow.columnar"
            ) from None
        index = np.arange(n, dtype=np.int64)
        try:
            columns = _read_columns(table, layout, cols, table.starts, index=index, offset=0)
        except _ValueFailure as failure:
            row = failure.index
            error = failure.error
            raise CopyFormatError(row, error.offset, error.reason, error.column) from None
        arrays = [
            pa.array(index, pa.int64()),
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int8)), _OPS),
            pa.nulls(n, pa.uint32()),
            *columns,
            pa.nulls(n, layout.old_type),
            pa.nulls(n, _DICTIONARY),
            _unchanged(cols, layout.names, n),
        ]
        return RelationBatch(
            layout.relation, pa.RecordBatch.from_arrays(arrays, schema=layout.schema)
        )

    def _layout(self, relation: Relation) -> _Layout:
        texts = self.as_text(relation) if self.as_text is not None else ()
        readers = tuple(
            (text_reader if c.name in texts else column_reader)(
                c.type_id, c.type_modifier, self.registry
            )
            for c in relation.columns
        )
        fields = [
            pa.field(c.name, r.arrow_type) for c, r in zip(relation.columns, readers, strict=True)
        ]
        old_type = pa.struct(fields)
        schema = pa.schema(
            [
                pa.field("_seq", pa.int64(), nullable=False),
                pa.field("_op", _DICTIONARY, nullable=False),
                pa.field("_xid", pa.uint32()),
                *fields,
                pa.field("_old", old_type),
                pa.field("_old_kind", _DICTIONARY),
                pa.field("_unchanged", pa.list_(pa.string()), nullable=False),
            ],
            metadata={
                "pgcdc.relation_id": str(relation.relation_id),
                "pgcdc.namespace": relation.namespace,
                "pgcdc.name": relation.name,
                "pgcdc.replica_identity": relation.replica_identity,
            },
        )
        names = pa.array([c.name for c in relation.columns], pa.string())
        return _Layout(relation, readers, schema, old_type, names)

    def _decode_block(
        self,
        messages: Sequence[bytes],
        offset: int,
        layouts: dict[int, _Layout],
        parts: list[tuple[_Layout, pa.RecordBatch]],
        others: list[tuple[int, ReplicationMessage]],
    ) -> None:
        """Decode messages ``offset`` onwards, appending to ``parts`` and ``others``.

        ``layouts`` (the relations described so far) is updated by the block's Relations.
        """
        table = MessageTable.from_messages(messages)
        if not (table.ends > table.starts).all():
            raise FramingMismatch("empty message")
        is_change = _IS_CHANGE[table.types]
        change_idx = np.flatnonzero(is_change)
        other_idx = np.flatnonzero(~is_change)
        before = dict(layouts)

        # the rare messages, in order, through the row decoder; they set the stream state and
        # the relation schemas the changes after them are read with
        decoder = self._decoder
        streamed_runs = [decoder.stream_xid is not None]
        events: dict[int, list[tuple[int, _Layout]]] = {}
        for index in other_idx.tolist():
            message = decoder.decode(messages[index])
            others.append((index + offset, message))
            if isinstance(message, Relation):
                current = layouts.get(message.relation_id)
                if current is None or not _same_shape(current.relation, message):
                    layout = self._layout(message)
                    layouts[message.relation_id] = layout
                    events.setdefault(message.relation_id, []).append((index, layout))
            streamed_runs.append(decoder.stream_xid is not None)
        if not change_idx.size:
            return

        run = np.searchsorted(other_idx, change_idx)
        streamed = np.asarray(streamed_runs, dtype=np.bool_)[run]
        starts = table.starts[change_idx]
        try:
            relids = table.u32[starts + np.where(streamed, 5, 1)]
        except IndexError:
            raise FramingMismatch("relation OID outside the buffer") from None

        segments: list[tuple[_Layout, npt.NDArray[np.intp]]] = []
        for relid, rows in _group_rows(relids):
            base = before.get(relid)
            changes = events.get(relid)
            if not changes:
                if base is None:
                    raise FramingMismatch("change to an undescribed relation")
                segments.append((base, rows))
                continue
            bounds = np.array([index for index, _ in changes], dtype=np.int64)
            version = np.searchsorted(bounds, change_idx[rows])
            for v in np.unique(version).tolist():
                found = base if v == 0 else changes[v - 1][1]
                if found is None:
                    raise FramingMismatch("change to an undescribed relation")
                segments.append((found, rows[version == v]))
        segments.sort(key=lambda seg: int(seg[1][0]))
        for layout, rows in segments:
            batch = _segment(table, layout, change_idx[rows], offset, streamed[rows])
            parts.append((layout, batch))

    def _raise_first_error(
        self,
        messages: Sequence[bytes],
        stream_xid: int | None,
        streams: Sequence[tuple[int, int | None]] | None,
    ) -> None:
        """Re-read ``messages`` one by one and raise the first error, if any."""
        decoder = Decoder(self.proto_version)
        decoder.stream_xid = stream_xid
        relations = {relid: layout.relation for relid, layout in self._layouts.items()}
        for start, end, xid in _stream_runs(len(messages), streams):
            if streams is not None:
                decoder.stream_xid = xid
            for index in range(start, end):
                try:
                    message = decoder.decode(messages[index])
                    if isinstance(message, Relation):
                        relations[message.relation_id] = message
                    elif isinstance(message, Insert | Update | Delete):
                        _check_change(message, relations)
                except ProtocolError as exc:
                    exc.add_note(f"message {index} of the {len(messages)} decoded")
                    raise


def _stream_runs(
    count: int, streams: Sequence[tuple[int, int | None]] | None
) -> list[tuple[int, int, int | None]]:
    """``(start, end, xid)`` runs of ``count`` messages under the stream context ``streams``
    (see ``ColumnarDecoder.decode``); one run, its xid unused, without a context."""
    if streams is None:
        return [(0, count, None)]
    points = list(streams)
    if not points or points[0][0] != 0:
        points.insert(0, (0, None))
    runs: list[tuple[int, int, int | None]] = []
    for i, (start, xid) in enumerate(points):
        end = points[i + 1][0] if i + 1 < len(points) else count
        if not 0 <= start <= end <= count:
            raise ValueError(
                f"stream context {streams!r} does not fit {count} messages: give (index, xid) "
                "pairs in index order"
            )
        if end <= start:
            continue
        if runs and runs[-1][2] == xid:  # one block for a spool's run of transactions
            runs[-1] = (runs[-1][0], end, xid)
        else:
            runs.append((start, end, xid))
    return runs


def _check_change(message: Insert | Update | Delete, relations: Mapping[int, Relation]) -> None:
    code = {Insert: "I", Update: "U", Delete: "D"}[type(message)]
    at = 1 if message.xid is None else 5
    relation = relations.get(message.relation_id)
    if relation is None:
        raise ProtocolError(
            code,
            at,
            f"change to relation OID {message.relation_id}, which no Relation message described; "
            "PostgreSQL sends one before the first change to each relation in a session, so "
            "decode from the start of the session (or feed its Relation messages first)",
        )
    tuples: list[tuple[int, tuple[object, ...]]] = []
    pos = at + 5  # past the relation OID and the first marker
    if isinstance(message, Delete):
        tuples.append((pos, message.old))
    else:
        if isinstance(message, Update) and message.old is not None:
            tuples.append((pos, message.old))
            pos += len(encode_tuple(message.old)) + 1
        tuples.append((pos, message.new))
    for offset, values in tuples:
        if len(values) != len(relation.columns):
            raise ProtocolError(
                code,
                offset,
                f"TupleData has {len(values)} columns but relation "
                f"{relation.namespace}.{relation.name} (OID {relation.relation_id}) has "
                f"{len(relation.columns)}; the stream and its Relation messages disagree",
            )


def _raise_first_copy_error(rows: Sequence[bytes], ncols: int) -> None:
    """Walk COPY tuples one by one and raise the first framing error, if any."""
    for row, data in enumerate(rows):
        size = len(data)
        if size < 2:
            raise CopyFormatError(row, 0, f"{size} bytes, too short for a tuple's field count")
        count = int.from_bytes(data[:2], "big", signed=True)
        if count != ncols:
            raise CopyFormatError(
                row,
                0,
                f"{count} fields, but the relation has {ncols} columns"
                + (" (-1 is the trailer, which must not be passed)" if count == -1 else ""),
            )
        at = 2
        for column in range(ncols):
            if at + 4 > size:
                raise CopyFormatError(row, at, f"ends before the length of field {column}")
            length = int.from_bytes(data[at : at + 4], "big", signed=True)
            if length < -1:
                raise CopyFormatError(row, at, f"field {column} has length {length}")
            at += 4 + max(length, 0)
            if at > size:
                raise CopyFormatError(row, size, f"ends inside the value of field {column}")
        if at != size:
            raise CopyFormatError(
                row, at, f"{size - at} bytes after the last field (more than one tuple?)"
            )


def _merge(parts: list[tuple[_Layout, pa.RecordBatch]]) -> tuple[RelationBatch, ...]:
    """One RelationBatch per layout (relation and schema), in order of first appearance."""
    grouped: dict[int, tuple[_Layout, list[pa.RecordBatch]]] = {}
    for layout, batch in parts:
        grouped.setdefault(id(layout), (layout, []))[1].append(batch)
    return tuple(
        RelationBatch(
            layout.relation, batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        )
        for layout, batches in grouped.values()
    )


def _group_rows(relids: npt.NDArray[np.uint32]) -> list[tuple[int, npt.NDArray[np.intp]]]:
    """Row positions per relation OID, each in stream order."""
    first = relids[0]
    if (relids == first).all():
        return [(int(first), np.arange(len(relids)))]
    groups: list[tuple[int, npt.NDArray[np.intp]]] = []
    remaining = np.arange(len(relids))
    while remaining.size and len(groups) < _PEEL_LIMIT:
        relid = relids[remaining[0]]
        same = relids[remaining] == relid
        groups.append((int(relid), remaining[same]))
        remaining = remaining[~same]
    if remaining.size:
        order = remaining[np.argsort(relids[remaining], kind="stable")]
        keys, cuts = np.unique(relids[order], return_index=True)
        for relid, rows in zip(keys.tolist(), np.split(order, cuts[1:]), strict=True):
            groups.append((int(relid), rows))
    return groups


def _segment(
    table: MessageTable, layout: _Layout, index: I64, offset: int, streamed: Bools
) -> pa.RecordBatch:
    """The record batch of one relation's changes at message ``index`` of the table (sorted),
    ``offset`` + ``index`` in the caller's list."""
    n = len(index)
    ncols = len(layout.readers)
    starts = table.starts[index]
    ends = table.ends[index]
    ops = table.types[index]
    any_streamed = bool(streamed.any())
    header: I64 | int = np.where(streamed, 5, 1) if any_streamed else 1
    marker_at = starts + header + 4
    try:
        markers = table.data[marker_at]
        is_insert = ops == _INSERT
        is_delete = ops == _DELETE
        old_marked = (markers == _KEY) | (markers == _OLD)
        new_marked = markers == _NEW
        ok = np.where(
            is_insert, new_marked, np.where(is_delete, old_marked, old_marked | new_marked)
        )
        if not ok.all():
            raise FramingMismatch("unexpected tuple marker")
        new_at = marker_at + 1
        old_rows = np.flatnonzero(old_marked)
        old_cols: TupleColumns | None = None
        if old_rows.size:
            old_cols, old_end = walk_tuples(table, marker_at[old_rows] + 1, ncols, starts[old_rows])
            deleting = is_delete[old_rows]
            if not (old_end[deleting] == ends[old_rows[deleting]]).all():
                raise FramingMismatch("Delete does not end after its old tuple")
            updating = ~deleting
            if updating.any():
                after = old_end[updating]
                if not (table.data[after] == _NEW).all():
                    raise FramingMismatch("no 'N' after an Update's old tuple")
                new_at[old_rows[updating]] = after + 1
        if is_delete.any():
            new_rows = np.flatnonzero(~is_delete)
            new_cols, new_end = walk_tuples(table, new_at[new_rows], ncols, starts[new_rows])
            if not (new_end == ends[new_rows]).all():
                raise FramingMismatch("change does not end after its new tuple")
            new_cols = new_cols.take(new_rows, n, starts)
        else:
            new_cols, new_end = walk_tuples(table, new_at, ncols, starts)
            if not (new_end == ends).all():
                raise FramingMismatch("change does not end after its new tuple")
    except IndexError:
        raise FramingMismatch("position outside the buffer") from None

    columns = _read_columns(table, layout, new_cols, starts, index=index, offset=offset)
    if old_cols is None:
        old = pa.nulls(n, layout.old_type)
        old_kind = pa.nulls(n, _DICTIONARY)
    else:
        children = _read_columns(
            table, layout, old_cols, starts[old_rows], index=index[old_rows], offset=offset
        )
        old = pa.Array.from_buffers(layout.old_type, old_rows.size, [None], children=children)
        kind_index = (markers == _OLD).astype(np.int8)
        validity = None if old_rows.size == n else np.packbits(old_marked, bitorder="little")
        if validity is not None:
            positions = np.zeros(n, dtype=np.int64)
            positions[old_rows] = np.arange(old_rows.size)
            old = old.take(pa.array(positions, mask=~old_marked))
        old_kind = pa.DictionaryArray.from_arrays(
            pa.Array.from_buffers(
                pa.int8(),
                n,
                [None if validity is None else pa.py_buffer(validity), pa.py_buffer(kind_index)],
            ),
            _OLD_KINDS,
        )
    if any_streamed:
        xid_validity = (
            None if streamed.all() else pa.py_buffer(np.packbits(streamed, bitorder="little"))
        )
        xids = table.u32[np.where(streamed, starts + 1, 0)].astype(np.uint32)
        xid = pa.Array.from_buffers(pa.uint32(), n, [xid_validity, pa.py_buffer(xids)])
    else:
        xid = pa.nulls(n, pa.uint32())
    op = pa.DictionaryArray.from_arrays(pa.array(_OP_INDEX[ops]), _OPS)
    arrays = [
        pa.array(index + offset, pa.int64()),
        op,
        xid,
        *columns,
        old,
        old_kind,
        _unchanged(new_cols, layout.names, n),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=layout.schema)


def _read_columns(
    table: MessageTable,
    layout: _Layout,
    cols: TupleColumns,
    row_starts: I64,
    *,
    index: I64,
    offset: int,
) -> list[pa.Array]:
    """The typed arrays of ``cols``; rows are messages ``index`` of the table (``offset`` +
    ``index`` in the caller's list, for errors)."""
    arrays = []
    for j, reader in enumerate(layout.readers):
        column = ColumnSlices(
            table, cols.kinds[j], cols.starts[j], cols.lengths[j], cols.has_value[j], row_starts
        )
        try:
            arrays.append(reader.read(column))
        except BadValue as bad:
            row = bad.row
            code = chr(int(table.types[index[row]]))
            relation = layout.relation
            name = relation.columns[j].name
            error = ProtocolError(
                code,
                int(column.starts[row] - row_starts[row]),
                f"value of column {name!r} ({reader.type_name}) {bad.reason}",
                (relation.namespace, relation.name, name),
            )
            raise _ValueFailure(int(index[row]) + offset, error) from None
    return arrays


def _unchanged(cols: TupleColumns, names: pa.Array, n: int) -> pa.Array:
    unchanged = cols.kinds == KIND_UNCHANGED
    if not unchanged.any():
        offsets = pa.py_buffer(np.zeros(n + 1, dtype=np.int32))
        return pa.ListArray.from_buffers(
            pa.list_(pa.string()), n, [None, offsets], children=[pa.array([], pa.string())]
        )
    rows, cols_u = np.nonzero(unchanged.T)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), names.take(pa.array(cols_u)))
