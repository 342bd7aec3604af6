"""Test helpers that ask a real PostgreSQL server: how it evaluates filter expressions over a
table of rows (the oracle of the differential tests), the rows as pgoutput would send them
(text output and binary send functions), and decoding changes from a logical slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.adapt import Loader
from psycopg.pq import Format

from pgcdc.filters import (
    FilterEvaluationError,
    FilterSyntaxError,
    InvalidFilterError,
    RowFilter,
    RowFilterError,
)
from pgcdc.protocol import Decoder, ReplicationMessage
from pgcdc.protocol.messages import (
    UNCHANGED_TOAST,
    Column,
    Delete,
    Insert,
    Relation,
    Truncate,
    TupleValue,
    Update,
)

#: The differential tests' table: (column, SQL type, type OID).
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("i", "integer", 23),
    ("b", "bigint", 20),
    ("n", "numeric", 1700),
    ("t", "text", 25),
    ("v", "character varying(10)", 1043),
    ("f", "boolean", 16),
    ("d", "double precision", 701),
    ("dt", "date", 1082),
    ("ts", "timestamp without time zone", 1114),
    ("s", "smallint", 21),
    ("r", "real", 700),
    ("c", "character(4)", 1042),
)

#: Evaluates each expression over rf_rows: first whether CREATE PUBLICATION accepts it
#: (row_id NULL, 'reject:<sqlstate>:<detail>'), then per row 't', 'f', 'n' or 'e:<sqlstate>'.
#: All rows in one query when that succeeds, else row by row (each in its own subtransaction).
PROBE_FUNCTION = r"""
CREATE FUNCTION rf_probe(exprs text[]) RETURNS TABLE(expr_no int, row_id int, outcome text)
LANGUAGE plpgsql AS $fn$
DECLARE
  k int;
  rid int;
  ids int[];
  res text[];
  is_t boolean;
  is_f boolean;
  st text;
  det text;
BEGIN
  SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO ids FROM rf_rows;
  FOR k IN 1 .. coalesce(array_length(exprs, 1), 0) LOOP
    BEGIN
      EXECUTE format('CREATE PUBLICATION rf_probe_pub FOR TABLE rf_rows WHERE (%s)', exprs[k]);
      RAISE EXCEPTION USING ERRCODE = 'P0999', MESSAGE = 'accepted';
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, det = PG_EXCEPTION_DETAIL;
      IF st <> 'P0999' THEN
        expr_no := k; row_id := NULL; outcome := 'reject:' || st || ':' || coalesce(det, '');
        RETURN NEXT;
        CONTINUE;
      END IF;
    END;
    BEGIN
      EXECUTE format('SELECT array_agg(CASE WHEN (%1$s) IS TRUE THEN ''t'' '
                     'WHEN (%1$s) IS FALSE THEN ''f'' ELSE ''n'' END ORDER BY id) FROM rf_rows',
                     exprs[k]) INTO res;
      FOR rid IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
        expr_no := k; row_id := ids[rid]; outcome := res[rid];
        RETURN NEXT;
      END LOOP;
      CONTINUE;
    EXCEPTION WHEN OTHERS THEN
      NULL;
    END;
    FOREACH rid IN ARRAY ids LOOP
      BEGIN
        EXECUTE format('SELECT (%1$s) IS TRUE, (%1$s) IS FALSE FROM rf_rows WHERE id = %2$s',
                       exprs[k], rid) INTO is_t, is_f;
        outcome := CASE WHEN is_t THEN 't' WHEN is_f THEN 'f' ELSE 'n' END;
      EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
        outcome := 'e:' || st;
      END;
      expr_no := k; row_id := rid;
      RETURN NEXT;
    END LOOP;
  END LOOP;
END
$fn$"""


class _RawText(Loader):
    def load(self, data: Any) -> str:
        return bytes(data).decode()


class _RawBinary(Loader):
    format = Format.BINARY

    def load(self, data: Any) -> bytes:
        return bytes(data)


def create_rows_table(conn: psycopg.Connection[Any]) -> None:
    """rf_rows with COLUMNS (and an id key), plus the rf_probe function."""
    columns = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(typ)) for name, typ, _ in COLUMNS
    )
    conn.execute(sql.SQL("CREATE TABLE rf_rows (id int PRIMARY KEY, {})").format(columns))
    conn.execute("ALTER TABLE rf_rows REPLICA IDENTITY FULL")
    conn.execute(PROBE_FUNCTION)


def load_rows(conn: psycopg.Connection[Any], rows: Sequence[Sequence[str | None]]) -> None:
    """Replace rf_rows' contents: each row is the text of each column (None: NULL)."""
    casts = sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(typ)) for _, typ, _ in COLUMNS)
    insert = sql.SQL("INSERT INTO rf_rows VALUES (%s, {})").format(casts)
    with conn.transaction():
        conn.execute("DELETE FROM rf_rows")
        with conn.cursor() as cur:
            cur.executemany(insert, [(i + 1, *row) for i, row in enumerate(rows)])


def tuples(conn: psycopg.Connection[Any], *, binary: bool) -> list[tuple[TupleValue, ...]]:
    """rf_rows' values as pgoutput sends them: output function text, or send function bytes."""
    cur = conn.cursor(binary=binary)
    loader = _RawBinary if binary else _RawText
    for _, _, oid in COLUMNS:
        cur.adapters.register_loader(oid, loader)
    query = sql.SQL("SELECT {} FROM rf_rows ORDER BY id").format(
        sql.SQL(", ").join(sql.Identifier(name) for name, _, _ in COLUMNS)
    )
    return [tuple(row) for row in cur.execute(query).fetchall()]


def relation() -> Relation:
    """rf_rows as a pgoutput Relation message describes it (REPLICA IDENTITY FULL)."""
    return Relation(
        None,
        1,
        "public",
        "rf_rows",
        "f",
        tuple(Column(1, name, oid, -1) for name, _, oid in COLUMNS),
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one expression fared: rejected (``reject`` = 'sqlstate:detail') or per-row
    results ('t', 'f', 'n', 'e:<sqlstate>')."""

    reject: str | None
    rows: tuple[str, ...] = ()


def server_outcomes(conn: psycopg.Connection[Any], exprs: Sequence[str]) -> list[Outcome]:
    rows = conn.execute("SELECT * FROM rf_probe(%s)", (list(exprs),)).fetchall()
    rejects: dict[int, str] = {}
    results: dict[int, list[tuple[int, str]]] = {}
    for expr_no, row_id, outcome in rows:
        if row_id is None:
            rejects[expr_no] = outcome.removeprefix("reject:")
        else:
            results.setdefault(expr_no, []).append((row_id, outcome))
    out = []
    for k in range(1, len(exprs) + 1):
        if k in rejects:
            out.append(Outcome(rejects[k]))
        else:
            out.append(Outcome(None, tuple(o for _, o in sorted(results.get(k, [])))))
    return out


def client_outcome(
    expr: str, rows: Sequence[Sequence[TupleValue]], rel: Relation | None = None
) -> Outcome:
    """The same evaluation with pgcdc.filters (unsupported expressions raise)."""
    try:
        bound = RowFilter.parse(expr).bind(rel or relation(), publishes_update_or_delete=False)
    except (InvalidFilterError, FilterSyntaxError) as exc:
        return Outcome(f"{exc.sqlstate}:{exc.detail or ''}")
    results = []
    for row in rows:
        try:
            value = bound.evaluate(row)
        except FilterEvaluationError as exc:
            results.append(f"e:{exc.sqlstate}")
            continue
        results.append("t" if value is True else "f" if value is False else "n")
    return Outcome(None, tuple(results))


def describe_error(exc: RowFilterError) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- logical decoding ----------------------------------------------------------------------------


def create_slot(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))


def slot_messages(
    conn: psycopg.Connection[Any],
    slot: str,
    publications: Sequence[str],
    *,
    binary: bool,
    peek: bool = True,
) -> list[ReplicationMessage]:
    """The decoded pgoutput messages (proto_version 1) of the slot's pending changes."""
    function = (
        "pg_logical_slot_peek_binary_changes" if peek else "pg_logical_slot_get_binary_changes"
    )
    options = [
        "proto_version",
        "1",
        "publication_names",
        ",".join(publications),
        "binary",
        "true" if binary else "false",
    ]
    query = sql.SQL("SELECT data FROM {}(%s, NULL, NULL, VARIADIC %s)").format(
        sql.Identifier(function)
    )
    rows = conn.execute(query, (slot, options)).fetchall()
    decoder = Decoder(1)
    return [decoder.decode(bytes(data)) for (data,) in rows]


# -- a subscriber ---------------------------------------------------------------------------

Row = tuple[object, ...]


class Subscriber:
    """Tables kept from a change stream as a subscriber applies it: rows keyed by the replica
    identity (the whole row without one), unchanged TOASTed values kept from the stored row."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self.tables: dict[str, dict[Row, Row]] = {}

    def _key(self, rel: Relation, row: Row) -> Row:
        key = tuple(v for v, c in zip(row, rel.columns, strict=True) if c.is_key)
        return key or row

    def apply(self, messages: Iterable[ReplicationMessage]) -> None:
        for m in messages:
            if isinstance(m, Relation):
                self.relations[m.relation_id] = m
                self.tables.setdefault(m.name, {})
            elif isinstance(m, Truncate):
                for rid in m.relation_ids:
                    self.tables[self.relations[rid].name].clear()
            elif isinstance(m, Insert | Update | Delete):
                rel = self.relations[m.relation_id]
                rows = self.tables[rel.name]
                if isinstance(m, Insert):
                    rows[self._key(rel, m.new)] = m.new
                elif isinstance(m, Update):
                    old = rows.pop(self._key(rel, m.old if m.old is not None else m.new), None)
                    new = tuple(
                        stored if value is UNCHANGED_TOAST and old is not None else value
                        for value, stored in zip(m.new, old or m.new, strict=True)
                    )
                    rows[self._key(rel, new)] = new
                else:
                    rows.pop(self._key(rel, m.old), None)

    def rows(self, table: str) -> set[Row]:
        return set(self.tables.get(table, {}).values())

    def contents(self) -> dict[str, set[Row]]:
        return {name: set(rows.values()) for name, rows in self.tables.items()}
