"""``pgcdc tail``: print a slot's committed transactions, as test_decoding or as JSON lines.

Reads a logical slot with pgoutput over a replication connection (or, with ``--sql-interface``,
through the slot SQL functions), assembles committed transactions and prints them. Each
transaction is acknowledged to the server once it was written and flushed to stdout, unless
``--no-ack`` leaves the slot where it was.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from pgcdc.decoding import run as run_plugin
from pgcdc.decoding.printers import JsonPrinter, TestDecodingPrinter, TwoPhaseTestDecodingPrinter
from pgcdc.filters import FilterEvaluationError, FilterSet, RowFilter, RowFilterError, StreamFilter
from pgcdc.filters.source import FilteredSource, check_filters
from pgcdc.filters.validate import C_COLLATIONS, unicode_simple_case
from pgcdc.lsn import Lsn
from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.registry import TypeRegistry
from pgcdc.replication import (
    ReplicationError,
    ReplicationSession,
    SlotExistsError,
    SqlSlotReader,
    StreamOptions,
    create_slot,
    scrub_secrets,
)
from pgcdc.sizes import parse_size

log = logging.getLogger("pgcdc.tail")

NAME = "tail"


def register(sub: Any) -> tuple[str, Callable[[argparse.Namespace], int]]:
    p = sub.add_parser(
        NAME,
        help="print committed transactions from a logical replication slot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dsn", required=True, help="libpq connection string of the source database")
    p.add_argument("--slot", required=True, help="logical replication slot (pgoutput)")
    p.add_argument(
        "--publication",
        action="append",
        required=True,
        dest="publications",
        metavar="PUB",
        help="publication to read (repeatable)",
    )
    p.add_argument(
        "--create-slot",
        action="store_true",
        help="create the slot (with --two-phase: a two-phase slot) if it does not exist",
    )
    p.add_argument(
        "--proto-version",
        type=int,
        choices=[1, 2, 3, 4],
        default=None,
        help="pgoutput protocol version (default: the highest the server supports)",
    )
    p.add_argument("--streaming", choices=["off", "on", "parallel"], default="off")
    p.add_argument("--binary", action="store_true", help="ask for binary column values")
    p.add_argument("--two-phase", action="store_true", help="decode prepared transactions")
    p.add_argument("--messages", action="store_true", help="include logical decoding messages")
    p.add_argument("--origin", choices=["any", "none"], default=None)
    p.add_argument("--format", choices=["test_decoding", "json"], default="test_decoding")
    p.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop once everything up to the server's WAL position at start was printed",
    )
    p.add_argument("--no-ack", action="store_true", help="leave the slot where it was")
    p.add_argument(
        "--sql-interface",
        action="store_true",
        help="read through pg_logical_slot_peek_binary_changes instead of a replication connection",
    )
    p.add_argument(
        "--row-filter",
        action="append",
        default=[],
        dest="row_filters",
        metavar="SCHEMA.TABLE=EXPR",
        help="a client-side row filter with PostgreSQL's publication WHERE semantics "
        "(repeatable; several for one table are OR-ed); quote identifiers as in SQL",
    )
    p.add_argument(
        "--memory-limit",
        type=_size,
        default=64 << 20,
        metavar="SIZE",
        help="buffered changes beyond this spill to disk: bytes or a size such as 256MB "
        "(default 64MB)",
    )
    return NAME, run


def _size(text: str) -> int:
    """``--memory-limit``: a size as ``pipeline.toml`` and the Spark options read one."""
    try:
        return parse_size(text)
    except ValueError as exc:  # negative numbers too: the form has no sign
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer

    def write(line: bytes) -> None:
        out.write(line + b"\n")

    try:
        options = StreamOptions(
            publication_names=tuple(args.publications),
            proto_version=args.proto_version,
            binary=args.binary,
            messages=args.messages,
            streaming=args.streaming,
            two_phase=args.two_phase,
            origin=args.origin,
        )
        filters = _row_filters(args.row_filters)  # bad filters fail before anything starts
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            major = conn.info.server_version // 10000
            collation, actions = _database_facts(conn, args.publications)
            _warn_unsent_columns(conn, args.publications)
            registry = TypeRegistry()
            registry.load(conn)
            check_filters(
                conn,
                filters,
                collation=collation,
                registry=registry,
            )
            rules = FilterSet.from_config(filters, actions=actions).with_column_collations(conn)
            timezone = str(conn.execute("SHOW TimeZone").fetchone()[0])  # type: ignore[index]
            # a slot created with two_phase decodes prepared transactions at PREPARE time in
            # every protocol version, with or without the option (as test_decoding prints them)
            slot_row = conn.execute(
                "SELECT two_phase FROM pg_replication_slots WHERE slot_name = %s", (args.slot,)
            ).fetchone()
            two_phase = args.two_phase or bool(slot_row and slot_row[0])
            if two_phase and not args.two_phase:
                log.info(
                    "slot %s was created with two_phase: prepared transactions print at PREPARE",
                    args.slot,
                )
            until = (
                Lsn.parse(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))  # type: ignore[index]
                if args.until_caught_up
                else None
            )
        if args.create_slot:
            try:
                create_slot(args.dsn, args.slot, two_phase=args.two_phase)
                log.info("created slot %s", args.slot)
            except SlotExistsError:
                log.info("slot %s exists; reading it", args.slot)

        names = _FormatType(args.dsn)
        server_text = _ServerText(args.dsn)
        printer: Any
        if args.format == "json":
            printer = JsonPrinter(
                write,
                registry=registry,
                timezone=timezone,
                server_text=server_text,
                flush=out.flush,
            )
        else:
            cls = TwoPhaseTestDecodingPrinter if two_phase else TestDecodingPrinter
            printer = cls(
                write,
                type_names=names,
                major=major,
                registry=registry,
                timezone=timezone,
                server_text=server_text,
                flush=out.flush,
            )
        source: Any
        if args.sql_interface:
            source = SqlSlotReader(args.dsn, args.slot, options, acknowledge=not args.no_ack)
        else:
            source = ReplicationSession(args.dsn, args.slot, options, acknowledge=not args.no_ack)
        if filters:
            source = FilteredSource(
                source, StreamFilter(rules, registry=registry, collation=collation)
            )
        try:
            with source:
                result = run_plugin(
                    printer,
                    source,
                    until_lsn=until,
                    memory_limit=args.memory_limit,
                    registry=registry,
                )
        finally:
            names.close()
            server_text.close()
        out.flush()
        log.info(
            "stopped (%s): confirmed %s, %d transactions",
            result.reason,
            result.confirmed_lsn,
            result.stats.transactions,
        )
        return 0
    except ReplicationError as exc:
        print(f"pgcdc tail: {exc}", file=sys.stderr)
        return 1
    except RowFilterError as exc:
        print(f"pgcdc tail: row filter: {exc}", file=sys.stderr)
        return 2 if not isinstance(exc, FilterEvaluationError) else 1
    except LookupError as exc:
        print(f"pgcdc tail: row filter: {exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        print(f"pgcdc tail: {scrub_secrets(str(exc).strip())}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"pgcdc tail: {exc}", file=sys.stderr)
        return 2


_QUALIFIED = re.compile(
    r'\s*(?P<schema>"(?:[^"]|"")+"|[^."=\s]+)\s*\.\s*(?P<table>"(?:[^"]|"")+"|[^."=\s]+)\s*='
)


def _identifier(text: str) -> str:
    if text.startswith('"'):
        return text[1:-1].replace('""', '"')
    return text.lower()


def _row_filters(specs: list[str]) -> dict[str, list[str]]:
    """``schema.table=EXPR`` options -> {"schema.table": [EXPR, ...]} (names unquoted)."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        match = _QUALIFIED.match(spec)
        if match is None or not spec[match.end() :].strip():
            raise ValueError(
                f"--row-filter {spec!r}: expected SCHEMA.TABLE=EXPR, for example "
                "--row-filter 'public.orders=amount > 100' (double-quote identifiers that need it)"
            )
        table = f"{_identifier(match['schema'])}.{_identifier(match['table'])}"
        expr = spec[match.end() :].strip()
        RowFilter.parse(expr)  # syntax errors surface now, with their position
        out.setdefault(table, []).append(expr)
    return out


#: Columns of the published tables that pgoutput does not send: outside a column list, or
#: generated (before PostgreSQL 18, whose pg_publication_tables lists them all the same;
#: from 18 on, attnames holds them only with publish_generated_columns = stored)
_UNSENT_COLUMNS = """
SELECT p.schemaname::text, p.tablename::text,
       array_agg(a.attname::text ORDER BY a.attnum), bool_or(a.attgenerated <> '')
FROM (SELECT DISTINCT ON (schemaname, tablename) schemaname, tablename, attnames
      FROM pg_catalog.pg_publication_tables WHERE pubname = ANY(%s)) p
JOIN pg_catalog.pg_namespace n ON n.nspname = p.schemaname
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE NOT a.attname = ANY(p.attnames)
   OR (a.attgenerated <> '' AND pg_catalog.current_setting('server_version_num')::int < 180000)
GROUP BY 1, 2 ORDER BY 1, 2
"""


def _warn_unsent_columns(conn: psycopg.Connection[Any], publications: list[str]) -> None:
    """test_decoding prints every column; pgoutput sends no generated column before PostgreSQL
    18 (nor after without ``publish_generated_columns = stored``), nor one outside a column
    list. Say which, once, rather than print rows that silently lack them."""
    for schema, table, columns, generated in conn.execute(_UNSENT_COLUMNS, (publications,)):
        log.warning(
            "%s.%s: column(s) %s are not sent by the publication, so tail prints its rows "
            "without them%s",
            schema,
            table,
            ", ".join(columns),
            " (generated columns are sent from PostgreSQL 18 on with the publication's "
            "publish_generated_columns = stored)"
            if generated
            else "",
        )


def _database_facts(
    conn: psycopg.Connection[Any], publications: list[str]
) -> tuple[str, list[str]]:
    """The database's collation and the actions the publications publish."""
    # to_jsonb: datlocale is daticulocale before PostgreSQL 17
    row = conn.execute(
        "SELECT datlocprovider::text, datcollate, datctype,"
        " coalesce(to_jsonb(d) ->> 'datlocale', to_jsonb(d) ->> 'daticulocale')"
        " FROM pg_database d WHERE datname = current_database()"
    ).fetchone()
    collation = database_collation(*row) if row else "C"
    flags = conn.execute(
        "SELECT coalesce(bool_or(pubinsert), true), coalesce(bool_or(pubupdate), true),"
        " coalesce(bool_or(pubdelete), true) FROM pg_publication WHERE pubname = ANY(%s)",
        (publications,),
    ).fetchone()
    names = ("insert", "update", "delete")
    actions = [n for n, on in zip(names, flags or (True, True, True), strict=True) if on]
    return collation, actions


def database_collation(provider: str, collate: str, ctype: str, locale: str | None) -> str:
    """The name of the collation the database's default behaves as, for row filters.

    The builtin provider (PostgreSQL 17+) names its locale; ICU's is refused by name. Under
    libc, ordering follows LC_COLLATE and case mapping LC_CTYPE: C ordering with a C.UTF-8
    ctype behaves as C.UTF-8 (code point order either way), a C.UTF-8 ordering with a C ctype
    as C; any other locale in either is named, so that the filters refuse what depends on it.
    """
    if provider == "b":
        return {"C": "C", "C.UTF-8": "pg_c_utf8"}.get(locale or "", locale or "builtin")
    if provider == "i":
        return f"{locale} (ICU)"
    for name in (collate, ctype):
        if name not in C_COLLATIONS and not unicode_simple_case(name):
            return name
    return ctype if unicode_simple_case(ctype) else "C"


class _ServerText:
    """Binary values of types the codec cannot read (an extension's, say), rendered by the
    source with the type's own receive and output functions: what test_decoding prints."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None
        self._told: set[int] = set()

    def __call__(self, oid: int, data: bytes) -> str:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=True)
        if oid not in self._told:
            self._told.add(oid)
            log.info("binary values of type OID %d are rendered by the server", oid)
        # the parameter goes in binary with the column's type: the server runs its receive
        # function, and the cast to text its output function (automatic I/O conversion)
        result = self._conn.pgconn.exec_params(b"SELECT $1::text", [data], [oid], [1], 0)
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = (result.error_message or b"").decode("utf-8", "replace").strip()
            raise ConversionError(
                f"the server could not render a binary value of type OID {oid}: {message}"
            )
        text = result.get_value(0, 0)
        assert text is not None  # a non-NULL value has a text form
        return text.decode("utf-8")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class _FormatType:
    """format_type(oid, NULL) for types that are not built in, from the source's catalog."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def __call__(self, oid: int) -> str:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=True)
        row = self._conn.execute("SELECT format_type(%s, NULL)", (oid,)).fetchone()
        return str(row[0]) if row and row[0] is not None else str(oid)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
