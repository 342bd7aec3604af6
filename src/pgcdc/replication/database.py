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
from pgcdc.replication.failures import classify

__all__ = [
    "CODEC_OUTPUT_SETTINGS",
    "Connectable",
    "connect_sql",
    "raise_sql_error",
    "server_name",
    "sql_connection",
    "with_codec_settings",
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
) -> NoReturn:
    """Raise the ``ReplicationError`` for a psycopg 3 error."""
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
)


def with_codec_settings(dsn: str) -> str:
    """``dsn`` with ``CODEC_OUTPUT_SETTINGS`` added to its ``options`` (after the user's own,
    so they win): for the connections whose values pgcdc decodes as text (the Spark source's
    replication connection, the initial copy's)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    ours = " ".join(f"-c {name}={value}" for name, value in CODEC_OUTPUT_SETTINGS)
    try:
        theirs = str(conninfo_to_dict(dsn).get("options") or "")
        return make_conninfo(dsn, options=f"{theirs} {ours}".strip())
    except psycopg.Error as exc:  # the ReplicationError of a string libpq cannot read
        raise_sql_error(exc, dsn)


def connect_sql(dsn: str, *, connect_timeout: float = 10.0) -> psycopg.Connection[Any]:
    """An autocommit psycopg 3 connection, or the ``ReplicationError`` saying why not."""
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, round(connect_timeout)))
    except psycopg.Error as exc:
        raise_sql_error(exc, dsn)


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
