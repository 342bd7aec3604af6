"""Output plugins that print committed transactions: as contrib/test_decoding does, or as JSON.

``TestDecodingPrinter`` writes, byte for byte, what PostgreSQL's test_decoding plugin prints for
the same WAL with the options ``include-xids '0'`` and ``skip-empty-xacts '1'``
(contrib/test_decoding/test_decoding.c): ``BEGIN`` / ``table schema.name: INSERT: col[type]:value``
/ ``COMMIT`` lines, its quoting of identifiers and literals, ``null`` and
``unchanged-toast-datum``, ``old-key:`` / ``new-tuple:`` with NULLs skipped in old tuples,
``TRUNCATE:`` flags, ``message:`` lines, and with two-phase ``PREPARE TRANSACTION 'gid'`` /
``COMMIT PREPARED`` / ``ROLLBACK PREPARED``. Binary values ('b', the ``binary`` option) are
rendered as the type's text output would print them.

``JsonPrinter`` writes one JSON object per change, with the transaction's metadata.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

from pgcdc.decoding.plugin import DecodingContext, OutputPlugin
from pgcdc.decoding.relations import RelationInfo
from pgcdc.decoding.transaction import Change, LogicalMessage, Transaction, TruncateChange
from pgcdc.lsn import Lsn
from pgcdc.protocol.identifiers import quote_identifier, quote_literal, quote_qualified_identifier
from pgcdc.protocol.messages import UNCHANGED_TOAST, TupleData, TupleValue
from pgcdc.protocol.values import ServerText, pg_text
from pgcdc.protocol.values.oids import DISPLAY_NAMES
from pgcdc.protocol.values.registry import TypeRegistry

__all__ = ["JsonPrinter", "TestDecodingPrinter", "TypeNames"]

#: Type display name lookup for OIDs that are not built in (format_type(oid, NULL)).
TypeNames = Callable[[int], str]

_UNQUOTED = frozenset({21, 23, 20, 26, 700, 701, 1700})  # int2 int4 int8 oid float4 float8 numeric
_BITS = frozenset({1560, 1562})  # bit, varbit
_BOOL = 16


class _ValueText:
    """The text output of a column value, whether it arrived as text or binary."""

    def __init__(
        self, registry: TypeRegistry | None, timezone: str, server_text: ServerText | None
    ) -> None:
        self.registry = registry
        self.timezone = timezone
        self.server_text = server_text

    def __call__(self, value: str | bytes, type_id: int, type_modifier: int) -> str:
        if isinstance(value, str):
            return value
        return pg_text(
            value,
            type_id,
            type_modifier,
            self.registry,
            timezone=self.timezone,
            server_text=self.server_text,
        )


class TestDecodingPrinter(OutputPlugin):
    """Prints what contrib/test_decoding prints (include-xids 0, skip-empty-xacts 1).

    ``write`` receives each output line (test_decoding's OutputPluginWrite) without a newline;
    ``type_names`` names non-built-in types as ``format_type(oid, NULL)`` does; ``major`` is the
    server's major version (its keyword list decides identifier quoting); ``timezone`` the
    session TimeZone for rendering binary timestamptz values; ``server_text`` renders binary
    values of types the codec cannot read (see ``pg_text``). With ``two_phase`` it implements
    the two-phase callbacks and prints prepared transactions at PREPARE time, as test_decoding
    does on a slot with two-phase decoding enabled.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        write: Callable[[bytes], None],
        *,
        type_names: TypeNames | None = None,
        major: int = 18,
        registry: TypeRegistry | None = None,
        timezone: str = "UTC",
        server_text: ServerText | None = None,
        flush: Callable[[], None] | None = None,
    ) -> None:
        self._write = write
        self._flush = flush
        self._type_names = type_names
        self._major = major
        self._text = _ValueText(registry, timezone, server_text)
        self._wrote = False
        self._display: dict[int, str] = {}

    # -- helpers -------------------------------------------------------------------------
    def _line(self, text: str | bytes) -> None:
        self._write(text if isinstance(text, bytes) else text.encode("utf-8"))

    def _begin_once(self) -> None:
        if not self._wrote:
            self._line("BEGIN")
            self._wrote = True

    def _type_name(self, oid: int) -> str:
        name = DISPLAY_NAMES.get(oid) or self._display.get(oid)
        if name is None:
            name = self._type_names(oid) if self._type_names is not None else str(oid)
            self._display[oid] = name
        return name

    def _literal(self, type_id: int, text: str) -> str:
        if type_id in _UNQUOTED:
            return text
        if type_id in _BITS:
            return f"B'{text}'"
        if type_id == _BOOL:
            return "true" if text == "t" else "false"
        return "'" + text.replace("'", "''") + "'"

    def _tuple(self, relation: RelationInfo, values: TupleData, *, skip_nulls: bool) -> str:
        parts = []
        for column, value in zip(relation.columns, values, strict=True):
            if value is None and skip_nulls:
                continue
            head = (
                f" {quote_identifier(column.name, self._major)}[{self._type_name(column.type_id)}]:"
            )
            if value is None:
                parts.append(head + "null")
            elif value is UNCHANGED_TOAST:
                parts.append(head + "unchanged-toast-datum")
            else:
                text = self._text(value, column.type_id, column.type_modifier)
                parts.append(head + self._literal(column.type_id, text))
        return "".join(parts)

    def _table(self, relation: RelationInfo) -> str:
        return quote_qualified_identifier(
            relation.namespace or "pg_catalog", relation.name, self._major
        )

    # -- callbacks -----------------------------------------------------------------------
    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        self._wrote = False

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: RelationInfo, change: Change
    ) -> None:
        self._begin_once()
        line = f"table {self._table(relation)}: {change.action.value}:"
        if change.action == "INSERT":
            line += self._tuple(relation, change.new or (), skip_nulls=False)
        elif change.action == "UPDATE":
            if change.old is not None:
                line += " old-key:" + self._tuple(relation, change.old, skip_nulls=True)
                line += " new-tuple:"
            line += self._tuple(relation, change.new or (), skip_nulls=False)
        elif change.old is None:
            line += " (no-tuple-data)"
        else:
            line += self._tuple(relation, change.old, skip_nulls=True)
        self._line(line)

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: tuple[RelationInfo, ...],
        change: TruncateChange,
    ) -> None:
        self._begin_once()
        names = ", ".join(self._table(r) for r in relations)
        flags = ""
        if change.restart_identity:
            flags += " restart_seqs"
        if change.cascade:
            flags += " cascade"
        self._line(f"table {names}: TRUNCATE:{flags or ' (no-flags)'}")

    def message(
        self, ctx: DecodingContext, txn: Transaction | None, message: LogicalMessage
    ) -> None:
        # test_decoding of PostgreSQL 18 opens the transaction (BEGIN) for a transactional
        # message and counts it as a change; earlier versions print the message bare
        if message.transactional and self._major >= 18:
            self._begin_once()
        head = (
            f"message: transactional: {int(message.transactional)} prefix: {message.prefix}, "
            f"sz: {len(message.content)} content:"
        )
        self._line(head.encode("utf-8") + message.content)
        if not message.transactional and self._flush is not None:
            self._flush()

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        if self._wrote:
            self._line("COMMIT")
        self._wrote = False
        if self._flush is not None:
            self._flush()


class TwoPhaseTestDecodingPrinter(TestDecodingPrinter):
    """``TestDecodingPrinter`` with the two-phase callbacks (a slot with two-phase decoding)."""

    def begin_prepare(self, ctx: DecodingContext, txn: Transaction) -> None:
        self._wrote = False

    def prepare(self, ctx: DecodingContext, txn: Transaction, prepare_lsn: Lsn) -> None:
        if self._wrote:
            self._line(f"PREPARE TRANSACTION {quote_literal(txn.gid or '')}")
        self._wrote = False
        if self._flush is not None:
            self._flush()

    def commit_prepared(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        self._line(f"COMMIT PREPARED {quote_literal(txn.gid or '')}")
        if self._flush is not None:
            self._flush()

    def rollback_prepared(
        self, ctx: DecodingContext, txn: Transaction, prepare_end_lsn: Lsn, prepare_time: Any
    ) -> None:
        self._line(f"ROLLBACK PREPARED {quote_literal(txn.gid or '')}")
        if self._flush is not None:
            self._flush()


# -- JSON --------------------------------------------------------------------------------
_JSON_NUMBERS = frozenset({21, 23, 20, 26})  # exact integers
_JSON_FLOATS = frozenset({700, 701})


class JsonPrinter(OutputPlugin):
    """One JSON object per change (and per truncate and logical message), one per line.

    Each object carries the transaction's ``xid``, ``commit_lsn``, ``end_lsn``, ``commit_time``
    and ``origin``, the change's ``position`` in its transaction and ``lsn``, ``op`` (INSERT,
    UPDATE, DELETE, TRUNCATE, MESSAGE), ``schema`` and ``table``, and ``new`` / ``old`` rows
    keyed by column name. Values are JSON numbers for integer types, booleans for bool, numbers
    for finite floats, and otherwise the server's text output as a string (numeric stays exact;
    bytea is ``\\x...``). Columns whose value was not sent (unchanged TOAST) are left out of
    ``new`` and listed in ``unchanged_toast``, so they are never mistaken for NULL.
    """

    def __init__(
        self,
        write: Callable[[bytes], None],
        *,
        registry: TypeRegistry | None = None,
        timezone: str = "UTC",
        server_text: ServerText | None = None,
        flush: Callable[[], None] | None = None,
    ) -> None:
        self._write = write
        self._flush = flush
        self._text = _ValueText(registry, timezone, server_text)

    def _emit(self, obj: dict[str, Any]) -> None:
        self._write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))

    def _value(self, value: TupleValue, type_id: int, type_modifier: int) -> Any:
        if value is None:
            return None
        if value is UNCHANGED_TOAST:
            raise AssertionError("unchanged TOAST values are listed, not rendered")
        text = self._text(value, type_id, type_modifier)
        if type_id in _JSON_NUMBERS:
            return int(text)
        if type_id == _BOOL:
            return text == "t"
        if type_id in _JSON_FLOATS:
            number = float(text)
            return number if math.isfinite(number) else text
        return text

    def _row(self, relation: RelationInfo, values: TupleData | None) -> dict[str, Any] | None:
        if values is None:
            return None
        return {
            c.name: self._value(v, c.type_id, c.type_modifier)
            for c, v in zip(relation.columns, values, strict=True)
            if v is not UNCHANGED_TOAST
        }

    @staticmethod
    def _txn(txn: Transaction | None) -> dict[str, Any]:
        if txn is None:
            return {"xid": None}
        return {
            "xid": txn.xid,
            "commit_lsn": str(txn.commit_lsn) if txn.commit_lsn is not None else None,
            "end_lsn": str(txn.end_lsn) if txn.end_lsn is not None else None,
            "commit_time": txn.commit_time.isoformat() if txn.commit_time else None,
            "origin": txn.origin,
        }

    def begin(self, ctx: DecodingContext, txn: Transaction) -> None:
        pass

    def change(
        self, ctx: DecodingContext, txn: Transaction, relation: RelationInfo, change: Change
    ) -> None:
        new = change.new
        self._emit(
            {
                **self._txn(txn),
                "position": change.position,
                "lsn": str(change.lsn) if change.lsn is not None else None,
                "op": change.action.value,
                "schema": relation.namespace,
                "table": relation.name,
                "new": self._row(relation, new),
                "old": self._row(relation, change.old),
                "old_kind": change.old_kind,
                "unchanged_toast": [
                    c.name
                    for c, v in zip(relation.columns, new or (), strict=False)
                    if v is UNCHANGED_TOAST
                ],
            }
        )

    def truncate(
        self,
        ctx: DecodingContext,
        txn: Transaction,
        relations: tuple[RelationInfo, ...],
        change: TruncateChange,
    ) -> None:
        self._emit(
            {
                **self._txn(txn),
                "position": change.position,
                "op": "TRUNCATE",
                "tables": [{"schema": r.namespace, "table": r.name} for r in relations],
                "cascade": change.cascade,
                "restart_identity": change.restart_identity,
            }
        )

    def message(
        self, ctx: DecodingContext, txn: Transaction | None, message: LogicalMessage
    ) -> None:
        self._emit(
            {
                **self._txn(txn),
                "position": message.position,
                "lsn": str(message.lsn),
                "op": "MESSAGE",
                "transactional": message.transactional,
                "prefix": message.prefix,
                "content": base64.b64encode(message.content).decode("ascii"),
            }
        )
        if not message.transactional and self._flush is not None:
            self._flush()

    def commit(self, ctx: DecodingContext, txn: Transaction, commit_lsn: Lsn) -> None:
        if self._flush is not None:
            self._flush()
