"""Executor side: pgoutput messages of whole transactions -> record batches of the source schema.

``ChangeDecoder`` wraps a ``pgcdc.protocol.ColumnarDecoder`` (its relations start from the
definitions in effect before the partition's first transaction). ``decode_transactions`` reads
the messages of a partition's transactions in order, in groups of about ``chunk_bytes``; the
messages of a streamed transaction (which carry an Xid) are decoded in its stream context,
given to the decoder directly. Memory stays bounded by the group size: a large transaction is
decoded, and yielded, a chunk at a time.

Each group's changes become one record batch in stream order: the metadata columns (joined
from the transaction's labels), the row's position within its transaction (counted over every
row the transaction has, so it does not depend on which rows are kept), and the row's table
struct column; rows of tables the query does not have are left out (see ``pgcdc.spark.drift``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from pgcdc.lsn import Lsn
from pgcdc.protocol.arrow.columnar import ColumnarBatch, ColumnarDecoder, RelationBatch
from pgcdc.protocol.errors import ProtocolError
from pgcdc.protocol.messages import Relation, Truncate
from pgcdc.protocol.values.oids import TIME_OID
from pgcdc.spark.catalog import CatalogTable, SourceCatalog
from pgcdc.spark.conform import conform
from pgcdc.spark.drift import Verdict, find_table, mismatch, normalize
from pgcdc.spark.errors import SchemaChanged, SparkSourceError, unreadable_value
from pgcdc.spark.schema import TableLayout, arrow_output_schema, missing_array, registry_for

__all__ = ["ChangeDecoder", "Label", "decode_transactions"]

_OPS = pa.array(["I", "U", "D", "T"], pa.string())
_TRUNCATE = 3
_FIRST_COLUMN = 3  # RelationBatch columns: _seq, _op, _xid, <columns>, _old, _old_kind, _unchanged


@dataclass(frozen=True, slots=True)
class Label:
    """What every row of a transaction carries."""

    commit_lsn: int
    end_lsn: int
    commit_time: int | None  # microseconds since the Unix epoch
    xid: int | None


@dataclass(frozen=True, slots=True)
class _Segment:
    first: int  # index of its first message in the group
    label: Label
    base: int  # position of its first row within the transaction
    xid: int | None = None  # a streamed transaction's: its messages carry it


@dataclass(frozen=True, slots=True)
class _Rows:
    """The kept rows of a group, in output order: segment, source, row in source, op code and
    position within the transaction."""

    seg: np.ndarray
    src: np.ndarray
    src_row: np.ndarray
    ops: np.ndarray
    position: np.ndarray


class ChangeDecoder:
    """Decodes groups of messages into output record batches (see the module doc)."""

    def __init__(
        self,
        catalog: SourceCatalog,
        schema: StructType,
        proto_version: int,
        verdicts: Mapping[Relation, Verdict] | None = None,
        *,
        fixed_position: int | None = None,
    ) -> None:
        self.schema = schema
        #: the position every row gets instead of its place in the transaction (snapshots)
        self.fixed_position = fixed_position
        self.arrow_schema = arrow_output_schema(schema)
        self.tables: dict[int, CatalogTable] = {t.relid: t for t in catalog.tables}
        self.layouts = TableLayout.build(catalog.tables, self.arrow_schema)
        self._registry = registry_for(catalog)
        self.decoder = ColumnarDecoder(proto_version, self._registry, as_text=self._text_columns)
        self.verdicts = dict(verdicts or {})
        self._resolved: dict[Relation, TableLayout | None] = {}
        self._missing: dict[tuple[int, str], pa.Array | None] = {}
        self._names = [layout.table for layout in self.layouts.values()]
        self._layout_ids = {layout.table.relid: i for i, layout in enumerate(self.layouts.values())}

    def _text_columns(self, relation: Relation) -> frozenset[str]:
        """The relation's columns read as their type's text: those the query maps as text
        (``CatalogColumn.as_text``), and time columns the query holds as strings (a typed
        time64 cannot hold PostgreSQL's ``24:00:00``; the text is the string either way)."""
        table = find_table(normalize(relation), self.tables)
        if table is None:  # its rows are dropped: as text, no value of theirs fails the batch
            return frozenset(c.name for c in relation.columns)
        layout = self.layouts.get(table.relid)
        names = {c.name for c in table.columns if c.as_text}
        if layout is not None:
            for column in table.columns:
                index = layout.image_type.get_field_index(column.name)
                if (
                    index >= 0
                    and pa.types.is_string(layout.image_type.field(index).type)
                    and self._base_type(column.type_oid) == TIME_OID
                ):
                    names.add(column.name)
        # by the Relation's names: a former name reads as its column now; a column the query's
        # table lacks (added since) is never used: the batch fails with SchemaChanged first,
        # and the restarted query reads it as its text_columns say
        return frozenset(
            c.name
            for c in relation.columns
            if table.column(table.current_name(c.name)) is None
            or table.current_name(c.name) in names
        )

    def _base_type(self, type_oid: int) -> int:
        """A domain's base type OID (the type's own for anything else)."""
        info = self._registry.resolve(type_oid)
        return info.oid if info is not None and info.kind == "base" else type_oid

    def prelude(self, definitions: Sequence[bytes]) -> None:
        """Feed the Type and Relation messages in effect before the first transaction."""
        if definitions:
            self.decoder.decode(list(definitions))

    # -- relations -------------------------------------------------------------------------
    def resolve(self, relation: Relation) -> TableLayout | None:
        """The output layout of a relation's rows, None to drop them; raises SchemaChanged."""
        key = normalize(relation)
        if key in self._resolved:
            return self._resolved[key]
        table = find_table(key, self.tables)
        layout: TableLayout | None = None
        if not mismatch(key, table):
            assert table is not None
            layout = self.layouts.get(table.relid)
        else:
            verdict = self.verdicts.get(key)
            name = f"{key.namespace}.{key.name}"
            if verdict is None:
                raise SchemaChanged(
                    name, "the stream describes the table differently from the query's schema"
                )
            if verdict.changed is not None:
                raise SchemaChanged(verdict.table, verdict.changed)
            if table is not None:
                layout = self.layouts.get(table.relid)
        self._resolved[key] = layout
        return layout

    def missing_value(self, layout: TableLayout, field: pa.Field) -> pa.Array | None:
        """The value (one-element array of ``field``'s type) of ``field``'s column in a row
        written before the column was added: PostgreSQL reads such a row with the column's
        missing value (``ADD COLUMN ... DEFAULT <constant>``), else NULL (None)."""
        key = (layout.table.relid, field.name)
        if key not in self._missing:
            column = layout.table.column(field.name)
            value = None
            if column is not None:
                try:
                    value = missing_array(column, self._registry, field.type)
                except (TypeError, ValueError, ArithmeticError, pa.ArrowException):
                    raise SparkSourceError(
                        f"the value rows written before column {field.name!r} of "
                        f"{layout.table.qualified} was added read ({column.type_name}) does not "
                        f"convert to the query's type {field.type}",
                        "report this as a pgcdc bug, with the column's type and default",
                    ) from None
            self._missing[key] = value
        return self._missing[key]

    # -- decoding --------------------------------------------------------------------------
    def _part_struct(self, part: RelationBatch, layout: TableLayout) -> pa.Array:
        batch = part.batch
        relation = part.relation
        # a column renamed since the Relation was sent fills its column of the new name
        table = layout.table
        positions = {table.current_name(c.name): j for j, c in enumerate(relation.columns)}
        ncols = len(relation.columns)
        image_type = layout.image_type
        codes = batch.column(1).indices.to_numpy(zero_copy_only=False)
        old = batch.column(_FIRST_COLUMN + ncols)
        old_kind = conform(batch.column(_FIRST_COLUMN + ncols + 1), pa.string())
        new_children = []
        old_children = []
        # the query's columns are in attnum order: an absent column after the last present one
        # was added after the row was written (PostgreSQL reads the row with the column's
        # missing value); one before a present column was dropped (or is not published)
        last_present = max(
            (i for i, field in enumerate(image_type) if field.name in positions), default=-1
        )
        for i, field in enumerate(image_type):
            j = positions.get(field.name)
            if j is None:
                missing = self.missing_value(layout, field) if i > last_present else None
                if missing is None:
                    new_children.append(pa.nulls(batch.num_rows, field.type))
                    old_children.append(pa.nulls(batch.num_rows, field.type))
                    continue
                filled = missing.take(pa.array(np.zeros(batch.num_rows, dtype=np.int64)))
                new_children.append(filled)
                # an old image has every column only when it is the whole row ('O'); a key
                # image ('K') has the key columns, which the row was written with
                whole = pc.equal(old_kind, "O")
                old_children.append(pc.if_else(whole, filled, pa.nulls(batch.num_rows, field.type)))
                continue
            try:
                new_children.append(conform(batch.column(_FIRST_COLUMN + j), field.type))
                old_children.append(conform(old.field(j), field.type))
            except (TypeError, pa.ArrowException):
                raise SparkSourceError(
                    f"column {field.name!r} of {relation.namespace}.{relation.name} holds "
                    f"values the query's type {field.type} cannot take",
                    "restart the streaming query so that it reads the current schema",
                ) from None
        deleted = pa.array(codes == 2)
        new = pa.StructArray.from_arrays(new_children, fields=list(image_type), mask=deleted)
        old_image = pa.StructArray.from_arrays(
            old_children, fields=list(image_type), mask=old.is_null()
        )
        struct_type = layout.struct_type
        unchanged = conform(batch.column(_FIRST_COLUMN + ncols + 2), struct_type.field(3).type)
        return pa.StructArray.from_arrays(
            [new, old_image, old_kind, unchanged], fields=list(struct_type)
        )

    def _truncate_struct(self, layout: TableLayout, n: int) -> pa.Array:
        struct_type = layout.struct_type
        unchanged_type = struct_type.field(3).type
        empty = pa.ListArray.from_arrays(
            pa.array(np.zeros(n + 1, dtype=np.int32)),
            pa.array([], pa.string()),
            type=unchanged_type,
        )
        return pa.StructArray.from_arrays(
            [
                pa.nulls(n, layout.image_type),
                pa.nulls(n, layout.image_type),
                pa.nulls(n, pa.string()),
                empty,
            ],
            fields=list(struct_type),
        )

    def decode(
        self, messages: Sequence[bytes], segments: Sequence[_Segment]
    ) -> tuple[pa.RecordBatch | None, list[int]]:
        """One group: its record batch (None without rows) and the row count per segment."""
        streams = [(segment.first, segment.xid) for segment in segments]
        try:
            decoded = self.decoder.decode(messages, streams=streams)
        except ProtocolError as exc:
            if exc.column is None:
                raise
            raise unreadable_value(exc.column, exc.reason) from None
        return self._batch(decoded, segments)

    def decode_copy(
        self, relation_id: int, rows: Sequence[bytes], label: Label, text_columns: Collection[int]
    ) -> pa.RecordBatch | None:
        """Tuples of a ``COPY ... (FORMAT binary)`` of a table (``ColumnarDecoder.decode_copy``)
        as one record batch of inserts labelled ``label`` (None without rows)."""
        if not rows:
            return None
        part = self.decoder.decode_copy(relation_id, rows, text_columns=text_columns)
        result, _ = self._batch(ColumnarBatch((part,), (), len(rows)), [_Segment(0, label, 0)])
        return result

    def _batch(
        self, batch: ColumnarBatch, segments: Sequence[_Segment]
    ) -> tuple[pa.RecordBatch | None, list[int]]:
        # every row of the group: (seq, sub) order key, source and row within the source
        seqs: list[np.ndarray] = []
        subs: list[np.ndarray] = []
        source_ids: list[np.ndarray] = []
        source_rows: list[np.ndarray] = []
        op_codes: list[np.ndarray] = []
        sources: list[tuple[TableLayout | None, pa.Array | None]] = []
        for part in batch.changes:
            n = part.batch.num_rows
            if not n:
                continue
            layout = self.resolve(part.relation)
            struct = self._part_struct(part, layout) if layout is not None else None
            seqs.append(part.batch.column(0).to_numpy())
            subs.append(np.zeros(n, dtype=np.int64))
            source_ids.append(np.full(n, len(sources), dtype=np.int64))
            source_rows.append(np.arange(n, dtype=np.int64))
            op_codes.append(part.batch.column(1).indices.to_numpy(zero_copy_only=False))
            sources.append((layout, struct))
        truncated: dict[int | None, list[int]] = {}  # layout relid -> rows (order of appearance)
        t_seq: list[int] = []
        t_sub: list[int] = []
        t_layout: list[int | None] = []
        relations = self.decoder.relations
        for index, message in batch.others:
            if not isinstance(message, Truncate):
                continue
            for j, relid in enumerate(message.relation_ids):
                relation = relations.get(relid)
                layout = self.resolve(relation) if relation is not None else None
                key = layout.table.relid if layout is not None else None
                t_seq.append(index)
                t_sub.append(j)
                t_layout.append(key)
                truncated.setdefault(key, []).append(len(t_seq) - 1)
        if t_seq:
            t_source = np.empty(len(t_seq), dtype=np.int64)
            t_row = np.empty(len(t_seq), dtype=np.int64)
            for key, rows in truncated.items():
                layout = self.layouts.get(key) if key is not None else None
                struct = self._truncate_struct(layout, len(rows)) if layout is not None else None
                t_source[rows] = len(sources)
                t_row[rows] = np.arange(len(rows))
                sources.append((layout, struct))
            seqs.append(np.asarray(t_seq, dtype=np.int64))
            subs.append(np.asarray(t_sub, dtype=np.int64))
            source_ids.append(t_source)
            source_rows.append(t_row)
            op_codes.append(np.full(len(t_seq), _TRUNCATE, dtype=np.int8))
        counts = [0] * len(segments)
        if not seqs:
            return None, counts
        seq = np.concatenate(seqs)
        order = np.lexsort((np.concatenate(subs), seq))
        seq = seq[order]
        src = np.concatenate(source_ids)[order]
        src_row = np.concatenate(source_rows)[order]
        ops = np.concatenate(op_codes).astype(np.int8)[order]
        # positions within each transaction, over every row
        firsts = np.asarray([s.first for s in segments], dtype=np.int64)
        seg = np.searchsorted(firsts, seq, side="right") - 1
        n = len(seq)
        per_segment = np.bincount(seg, minlength=len(segments))
        counts = per_segment.tolist()
        first_rank = np.concatenate(([0], np.cumsum(per_segment)[:-1]))
        bases = np.asarray([s.base for s in segments], dtype=np.int64)
        position = bases[seg] + (np.arange(n) - first_rank[seg])
        if self.fixed_position is not None:
            position = np.full(n, self.fixed_position, dtype=np.int64)
        # keep the rows of the query's tables
        kept_source = np.asarray([layout is not None for layout, _ in sources], dtype=np.bool_)
        keep = kept_source[src]
        if not keep.all():
            seg, src, src_row, ops, position = (
                seg[keep],
                src[keep],
                src_row[keep],
                ops[keep],
                position[keep],
            )
        if not len(seg):
            return None, counts
        kept = _Rows(seg, src, src_row, ops, position)
        return self._assemble(segments, sources, kept), counts

    def _assemble(
        self,
        segments: Sequence[_Segment],
        sources: list[tuple[TableLayout | None, pa.Array | None]],
        rows: _Rows,
    ) -> pa.RecordBatch:
        seg, src, src_row, ops, position = rows.seg, rows.src, rows.src_row, rows.ops, rows.position
        m = len(seg)
        labels = [s.label for s in segments]
        seg_index = pa.array(seg)
        source_layout = [
            self._layout_ids[layout.table.relid] if layout is not None else -1
            for layout, _ in sources
        ]
        layout_of_row = np.asarray(source_layout, dtype=np.int64)[src]
        layout_index = pa.array(layout_of_row)
        schemas = pa.array([t.schema for t in self._names], pa.string())
        names = pa.array([t.name for t in self._names], pa.string())
        table_ids = pa.array([t.qualified for t in self._names], pa.string())
        commit_lsn = pa.array([lb.commit_lsn for lb in labels], pa.int64())
        commit_text = pa.array([str(Lsn(lb.commit_lsn)) for lb in labels], pa.string())
        end_lsn = pa.array([lb.end_lsn for lb in labels], pa.int64())
        xids = pa.array([lb.xid for lb in labels], pa.int64())
        times = pa.array([lb.commit_time for lb in labels], pa.timestamp("us", tz="UTC"))
        columns: dict[str, pa.Array] = {
            "_table_id": table_ids.take(layout_index),
            "_schema": schemas.take(layout_index),
            "_table": names.take(layout_index),
            "_op": _OPS.take(pa.array(ops)),
            "_commit_lsn": commit_lsn.take(seg_index),
            "_commit_lsn_text": commit_text.take(seg_index),
            "_end_lsn": end_lsn.take(seg_index),
            "_position": pa.array(position.astype(np.int32), pa.int32()),
            "_xid": xids.take(seg_index),
            "_commit_time": times.take(seg_index),
        }
        # the table struct columns: each row's struct from its source, null for other tables
        by_layout: dict[int, list[int]] = {}
        for i, (layout, _) in enumerate(sources):
            if layout is not None:
                by_layout.setdefault(layout.index, []).append(i)
        arrays: list[pa.Array] = []
        for index, field in enumerate(self.arrow_schema):
            if field.name in columns:
                arrays.append(columns[field.name])
                continue
            members = by_layout.get(index)
            if not members:
                arrays.append(pa.nulls(m, field.type))
                continue
            values: list[pa.Array] = []
            offsets = np.zeros(len(sources), dtype=np.int64)
            total = 0
            for i in members:
                array = sources[i][1]
                assert array is not None
                values.append(array)
                offsets[i] = total
                total += len(array)
            mine = np.isin(src, np.asarray(members))
            take = np.where(mine, offsets[src] + src_row, -1)
            joined = values[0] if len(values) == 1 else pa.concat_arrays(values)
            if len(joined) == m and mine.all() and (take == np.arange(m)).all():
                arrays.append(joined)  # every row, in order (a single table's rows)
            else:
                arrays.append(joined.take(pa.array(take, mask=~mine)))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


def decode_transactions(
    decoder: ChangeDecoder,
    transactions: Iterable[tuple[Label, bool, int, Iterator[bytes]]],
    *,
    chunk_bytes: int = 16 << 20,
) -> Iterator[pa.RecordBatch]:
    """Record batches for transactions given as ``(label, streamed, xid, messages)``, in order.

    A transaction's messages are consumed lazily; groups flush every ``chunk_bytes``.
    """
    group: list[bytes] = []
    segments: list[_Segment] = []
    size = 0

    def flush() -> Iterator[pa.RecordBatch]:
        nonlocal group, segments, size
        if not group:
            return
        result, counts = decoder.decode(group, segments)
        last = segments[-1]
        group, size = [], 0
        segments = [_Segment(0, last.label, last.base + counts[-1], last.xid)]
        if result is not None and result.num_rows:
            yield result

    for label, streamed, xid, messages in transactions:
        segments.append(_Segment(len(group), label, 0, xid if streamed else None))
        for message in messages:
            group.append(message)
            size += len(message)
            if size >= chunk_bytes:
                yield from flush()
        # the next transaction starts a new segment; a finished one needs no carry-over
    yield from flush()
