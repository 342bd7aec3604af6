"""Applying row filters to a decoded pgoutput message stream, exactly as pgoutput does on the
server (pgoutput_change / pgoutput_row_filter), so the output equals what a publication with
the same WHERE clauses would have sent:

- INSERT: the new row must match; DELETE: the old row (key or full) must match;
- UPDATE without an old row: the new row must match, and the UPDATE passes unchanged;
- UPDATE with an old row ('K' key, 'O' full): first, for each column where both rows have a
  value and the new one is an unchanged TOAST value, the old value is copied into the new row;
  then neither matching drops the change, only the new one turns it into an INSERT of the
  patched new row, only the old one into a DELETE of the old row, both keep the UPDATE;
- TRUNCATE, transaction boundaries, Relation, Type, Origin and logical messages pass.

``apply`` transforms one message. ``process`` (and ``filter_messages``) also reproduce how
pgoutput frames its output when filters drop changes: BEGIN is sent with the first change of a
transaction that passes and a transaction with none is not sent at all (nor its COMMIT);
Relation and Type messages are sent just before the first change that passes after them
(grouped with the change they preceded, so a partition's root and leaf Relation messages stay
together), and before a TRUNCATE of their relation. Streamed transactions (protocol 2+) and
two-phase ones pass their framing messages through unchanged.

Filters are bound per relation from the Relation messages seen (and rebound when a new
Relation message for the same id arrives). An error while evaluating a filter
(``FilterEvaluationError``: division by zero, ...) propagates: the server's walsender errors
out on such a row and the subscriber's replication stops until the row or the filter changes;
a consumer that wants to skip such rows has to catch it deliberately.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from pgcdc.errors import PgcdcError
from pgcdc.filters.errors import ReplicaIdentityError
from pgcdc.filters.rowfilter import BoundFilter
from pgcdc.filters.rules import Action, FilterSet, TableRule
from pgcdc.protocol.messages import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    Relation,
    ReplicationMessage,
    Truncate,
    TupleData,
    Type,
    Update,
)
from pgcdc.protocol.values import TypeRegistry

__all__ = ["StreamFilter"]

log = logging.getLogger(__name__)


class UnknownRelationError(PgcdcError, LookupError):
    """A change arrived for a relation id without a Relation message before it."""


class StreamFilter:
    """Row filters applied to pgoutput messages (``apply``), per FilterSet rules."""

    __slots__ = (
        "_begin",
        "_bound",
        "_group",
        "_pending",
        "_relations",
        "_rules",
        "_sent_begin",
        "collation",
        "filters",
        "registry",
    )

    def __init__(
        self,
        filters: FilterSet,
        *,
        registry: TypeRegistry | None = None,
        collation: str = "C",
    ) -> None:
        self.filters = filters
        self.registry = registry
        self.collation = collation
        self._relations: dict[int, Relation] = {}
        self._rules: dict[int, TableRule | None] = {}
        self._bound: dict[int, dict[Action, BoundFilter | None]] = {}
        self._begin: list[ReplicationMessage] = []
        self._sent_begin = True
        self._group: list[Type | Relation] = []
        self._pending: dict[int, list[Type | Relation]] = {}

    def relation(self, relation_id: int) -> Relation | None:
        """The last Relation message seen for an id."""
        return self._relations.get(relation_id)

    def apply(
        self, message: ReplicationMessage, relation: Relation | None = None
    ) -> ReplicationMessage | None:
        """The message as the server would have sent it with the filters, or None if dropped.

        ``relation`` is the message's Relation when the caller tracks relations itself;
        otherwise the Relation messages passed through ``apply`` are used.
        """
        if isinstance(message, Relation):
            self._relations[message.relation_id] = message
            self._bound.pop(message.relation_id, None)
            self._rules.pop(message.relation_id, None)
            return message
        if not isinstance(message, Insert | Update | Delete):
            return message
        if relation is not None and self._relations.get(relation.relation_id) != relation:
            self._relations[relation.relation_id] = relation
            self._bound.pop(relation.relation_id, None)
            self._rules.pop(relation.relation_id, None)
        if isinstance(message, Insert):
            return self._action("insert", message, message.relation_id, message.new)
        if isinstance(message, Delete):
            return self._action("delete", message, message.relation_id, message.old)
        return self._update(message)

    def process(self, message: ReplicationMessage) -> list[ReplicationMessage]:
        """The messages pgoutput would have sent in place of ``message`` (often none, or the
        held BEGIN and schema messages followed by the change)."""
        if isinstance(message, Begin):
            self._begin = [message]
            self._sent_begin = False
            return []
        if isinstance(message, Origin) and not self._sent_begin:
            self._begin.append(message)
            return []
        if isinstance(message, Commit):
            sent = self._sent_begin
            self._begin, self._sent_begin = [], True
            return [message] if sent else []
        if isinstance(message, Type):
            self._group.append(message)
            return []
        if isinstance(message, Relation):
            self.apply(message)
            self._group.append(message)
            return []
        if isinstance(message, Insert | Update | Delete):
            self._hold_group(message.relation_id)
            out = self.apply(message)
            if out is None:
                return []
            assert isinstance(out, Insert | Update | Delete)
            return [*self._start(), *self._pending.pop(out.relation_id, []), out]
        if isinstance(message, Truncate):
            group, self._group = self._group, []
            for item in group:
                rid = item.relation_id if isinstance(item, Relation) else None
                if rid is not None:
                    self._pending[rid] = _merge(self._pending.get(rid, []), [item])
            schema: list[ReplicationMessage] = []
            for rid in message.relation_ids:
                schema += self._pending.pop(rid, [])
            return [*self._start(), *schema, message]
        if isinstance(message, Message) and message.transactional:
            return [*self._start(), message]
        return [message]

    def filter_messages(
        self, messages: Iterable[ReplicationMessage]
    ) -> Iterator[ReplicationMessage]:
        """``process`` over a whole stream."""
        for message in messages:
            yield from self.process(message)

    def _hold_group(self, relation_id: int) -> None:
        if self._group:
            self._pending[relation_id] = _merge(self._pending.get(relation_id, []), self._group)
            self._group = []

    def _start(self) -> list[ReplicationMessage]:
        if self._sent_begin:
            return []
        self._sent_begin = True
        begin, self._begin = self._begin, []
        return begin

    def _rule(self, relation_id: int) -> tuple[Relation, TableRule | None]:
        relation = self._relations.get(relation_id)
        if relation is None:
            raise UnknownRelationError(
                f"change for relation id {relation_id} before any Relation message for it; "
                "pass the relation to apply(), or feed the Relation messages through apply()"
            )
        if relation_id not in self._rules:
            self._rules[relation_id] = self.filters.rule(relation.namespace, relation.name)
        return relation, self._rules[relation_id]

    def _filter(self, relation_id: int, action: Action) -> tuple[bool, BoundFilter | None]:
        """(published, filter) for a relation's action; the filter is None when unfiltered.

        Bound on first use, per action: INSERT filters without the replica identity rule
        (the server lets INSERTs through whatever the filter uses), UPDATE and DELETE
        filters with it, so a filter outside the replica identity raises
        ReplicaIdentityError at the first UPDATE or DELETE, the statement the server would
        have refused.
        """
        relation, rule = self._rule(relation_id)
        if rule is None:
            return True, None
        if action not in rule.actions:
            return False, None
        cached = self._bound.setdefault(relation_id, {})
        if action in cached:
            return True, cached[action]
        published = rule.filters.get(action)
        bound: BoundFilter | None = None
        if published:
            try:
                parts = [
                    item.filter.bind(
                        relation,
                        self.registry,
                        publishes_update_or_delete=action != "insert"
                        and item.publishes_update_or_delete,
                        collation=self.collation,
                        column_collations=rule.collations,
                    )
                    for item in published
                ]
            except ReplicaIdentityError as exc:
                # what PostgreSQL says to the statement (CheckCmdReplicaIdentity)
                verb = "update" if action == "update" else "delete from"
                raise ReplicaIdentityError(
                    f'cannot {verb} table "{relation.name}"',
                    sqlstate=exc.sqlstate,
                    detail=exc.detail,
                    hint=exc.hint,
                ) from exc
            bound = BoundFilter.any_of(parts)
        cached[action] = bound
        log.debug(
            "row filter for %s of %s.%s: %s",
            action,
            relation.namespace,
            relation.name,
            "bound" if bound is not None else "none",
        )
        return True, bound

    def _action(
        self, action: Action, message: ReplicationMessage, relation_id: int, values: TupleData
    ) -> ReplicationMessage | None:
        published, flt = self._filter(relation_id, action)
        if not published:
            return None
        if flt is None or flt.matches(values):
            return message
        return None

    def _update(self, message: Update) -> ReplicationMessage | None:
        published, flt = self._filter(message.relation_id, "update")
        if not published:
            return None
        if flt is None:
            return message
        if message.old is None:
            return message if flt.matches(message.new) else None
        old = message.old
        new = message.new
        patched = tuple(
            o if n is UNCHANGED_TOAST and o is not None and o is not UNCHANGED_TOAST else n
            for o, n in zip(old, new, strict=True)
        )
        old_matched = flt.matches(old)
        new_matched = flt.matches(patched)
        if not old_matched and not new_matched:
            return None
        if new_matched and not old_matched:
            return Insert(message.xid, message.relation_id, patched)
        if old_matched and not new_matched:
            assert message.old_kind is not None
            return Delete(message.xid, message.relation_id, message.old_kind, old)
        return message


def _merge(held: list[Type | Relation], new: list[Type | Relation]) -> list[Type | Relation]:
    """Held schema messages updated by newer ones (a newer Relation or Type replaces the older
    message for the same id; order of first appearance is kept)."""
    out = list(held)
    for item in new:
        key = ("R", item.relation_id) if isinstance(item, Relation) else ("Y", item.type_id)
        for i, old in enumerate(out):
            old_key = ("R", old.relation_id) if isinstance(old, Relation) else ("Y", old.type_id)
            if old_key == key:
                del out[i]
                break
        out.append(item)
    return out
