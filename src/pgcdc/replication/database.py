"""Ordinary SQL connections (psycopg 3) for slot and publication management and the SQL interface.

Functions of this package that run SQL take a ``Connectable``: either a connection string (a
short-lived autocommit connection is opened and closed around the call) or an open
``psycopg.Connection`` the caller owns. Driver errors become ``ReplicationError`` subclasses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeAlias

import psycopg

from pgcdc.replication.errors import describe_server, dsn_user
from pgcdc.replication.failures import Doing, classify
from pgcdc.replication.transport import TransportError, open_pgconn

__all__ = [
    "CODEC_OUTPUT_SETTINGS",
    "UNLIMITED_SETTINGS",
    "UNLIMITED_TRANSACTION",
    "Connectable",
    "connect_sql",
    "raise_sql_error",
    "server_name",
    "sql_connection",
    "with_codec_settings",
    "without_time_limits",
]

Connectable: TypeAlias = "str | psycopg.Connection[Any]"


def server_name(conn: psycopg.Connection[Any]) -> str:
    info = conn.info
    return f"{info.host}:{info.port}/{info.dbname} as user {info.user}"


def _user(target: str | psycopg.Connection[Any]) -> str | None:
    if isinstance(target, psycopg.Connection):
        return target.info.user
    return dsn_user(target)


def raise_sql_error(
    exc: psycopg.Error,
    target: str | psycopg.Connection[Any],
    *,
    slot: str | None = None,
    doing: Doing = Doing.SQL,
) -> NoReturn:
    """Raise the ``ReplicationError`` for a psycopg 3 error of a call ``doing`` that."""
    server = (
        server_name(target) if isinstance(target, psycopg.Connection) else (describe_server(target))
    )
    text = str(exc)
    diag = getattr(exc, "diag", None)
    detail = diag.message_detail if diag is not None else None
    if detail and detail not in text:
        text = f"{text} DETAIL: {detail}"
    failure = classify(
        text,
        exc.sqlstate,
        server=server,
        slot=slot,
        user=_user(target),
        lost=isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError),
        doing=doing,
    )
    raise failure.error from None


#: The output settings pgcdc reads values' text form under, whatever the server's, the
#: database's or the role's defaults: the three PostgreSQL's own subscriber sets on its
#: replication connections (libpqwalreceiver.c), and money in the C locale, as the binary form
#: is printed
CODEC_OUTPUT_SETTINGS: tuple[tuple[str, str], ...] = (
    ("datestyle", "ISO"),
    ("intervalstyle", "postgres"),
    ("extra_float_digits", "3"),
    ("lc_monetary", "C"),
    # as pg_text prints binary values: a timestamptz (in a text-format stream, a copy's
    # ::text cast, a text column) in UTC rather than the database's zone, bytea in hex
    ("timezone", "UTC"),
    ("bytea_output", "hex"),
)


#: A database's or role's limits that would end pgcdc's long work midway, every time: a
#: copy's COPY (``statement_timeout``), the lock it takes first, the idle transaction that
#: holds an exported snapshot while the copy runs. ``transaction_timeout`` (PostgreSQL 17+)
#: is set after connecting: see ``UNLIMITED_TRANSACTION``.
UNLIMITED_SETTINGS: tuple[tuple[str, str], ...] = (
    ("statement_timeout", "0"),
    ("lock_timeout", "0"),
    ("idle_in_transaction_session_timeout", "0"),
)

#: ``transaction_timeout = 0`` where the server has the setting (an unknown name in the
#: startup options would refuse the connection); a query, as simple SQL for a walsender too
UNLIMITED_TRANSACTION = (
    "SELECT pg_catalog.set_config('transaction_timeout', '0', false) "
    "WHERE pg_catalog.current_setting('server_version_num')::int >= 170000"
)


def with_codec_settings(dsn: str) -> str:
    """``dsn`` with ``CODEC_OUTPUT_SETTINGS`` added to its ``options`` (after the user's own,
    so they win): for the connections whose values pgcdc decodes as text (the Spark source's
    replication connection, the initial copy's)."""
    return _with_options(dsn, CODEC_OUTPUT_SETTINGS)


def without_time_limits(dsn: str) -> str:
    """``dsn`` with ``UNLIMITED_SETTINGS`` added to its ``options`` (after the user's own): for
    the initial copy's connections and the one holding its exported snapshot."""
    return _with_options(dsn, UNLIMITED_SETTINGS)


def _with_options(dsn: str, settings: tuple[tuple[str, str], ...]) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    ours = " ".join(f"-c {name}={value}" for name, value in settings)
    try:
        theirs = str(conninfo_to_dict(dsn).get("options") or "")
        return make_conninfo(dsn, options=f"{theirs} {ours}".strip())
    except psycopg.Error as exc:  # the ReplicationError of a string libpq cannot read
        raise_sql_error(exc, dsn)


def connect_sql(dsn: str, *, connect_timeout: float = 10.0) -> psycopg.Connection[Any]:
    """An autocommit psycopg 3 connection, or the ``ReplicationError`` saying why not.

    The connection is made as the replication connections are (``open_pgconn``), so that a
    server's refusal carries its SQLSTATE whatever language the server writes (psycopg's
    ``connect`` gives only the message), and then handed to psycopg.
    """
    try:
        pgconn = open_pgconn(dsn, connect_timeout=connect_timeout)
    except TransportError as exc:
        failure = classify(
            exc.message, exc.sqlstate, server=describe_server(dsn), user=dsn_user(dsn), lost=True
        )
        raise failure.error from None
    conn = psycopg.Connection(pgconn)
    conn.autocommit = True
    return conn


@contextmanager
def sql_connection(target: Connectable) -> Iterator[psycopg.Connection[Any]]:
    """The caller's connection, or a new autocommit one closed afterwards."""
    if isinstance(target, psycopg.Connection):
        yield target
        return
    if not isinstance(target, str):
        raise TypeError(
            f"expected a connection string or a psycopg.Connection, not {type(target).__name__}"
        )
    conn = connect_sql(target)
    try:
        yield conn
    finally:
        conn.close()
