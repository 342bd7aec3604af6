"""``COPY ... TO STDOUT`` read at C speed, for the initial copy's tasks.

PostgreSQL sends every tuple of a COPY in a CopyData message of its own. psycopg 3 hands each
message to Python through a generator and its wait loop (about 1 µs a message on a small
machine, as much as decoding the tuple); psycopg2's copy loop is C and only calls the caller's
``write`` with each message's bytes. ``CopyConnection`` is a psycopg2 connection for one
transaction: a few ordinary statements (``execute``), then ``copy_out``. It is the only module
that imports psycopg2.

Errors: a connection that cannot be made raises the ``ReplicationError`` that ``connect_sql``
raises for the same failure (a refused login, an unreachable server, ...); a statement that
fails raises ``StatementError`` with the server's SQLSTATE and message; an exception raised by
``write`` ends the COPY and propagates as it is. After any error, close the connection (the
server then rolls the transaction back).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import psycopg2
from psycopg import sql

from pgcdc.replication.errors import ReplicationError, describe_server, dsn_user
from pgcdc.replication.failures import classify

__all__ = ["CopyConnection", "StatementError"]


def driver_message(exc: BaseException) -> str:
    """A psycopg2 error's message on one line, with the server's DETAIL and HINT."""
    text = str(exc) or type(exc).__name__
    diag = getattr(exc, "diag", None)
    detail = getattr(diag, "message_detail", None) if diag is not None else None
    hint = getattr(diag, "message_hint", None) if diag is not None else None
    if detail and detail not in text:
        text = f"{text.rstrip()} DETAIL: {detail}"
    if hint and hint not in text:
        text = f"{text.rstrip()} HINT: {hint}"
    return " ".join(text.split())


class StatementError(ReplicationError):
    """A statement (or the COPY) failed on the server, or the connection was lost."""

    def __init__(self, text: str, sqlstate: str | None = None, lost: bool = False) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate
        self.lost = lost

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.cause, self.sqlstate, self.lost))


def _text(statement: sql.Composable | str) -> str:
    return statement if isinstance(statement, str) else statement.as_string()


class CopyConnection:
    """A psycopg2 connection (autocommit: the caller's statements open and end transactions)
    that reads COPYs through a ``write`` callback. A context manager that closes it."""

    __slots__ = ("_conn", "_cursor")

    def __init__(self, dsn: str, *, connect_timeout: float = 10.0) -> None:
        try:
            self._conn: Any = psycopg2.connect(dsn, connect_timeout=max(1, round(connect_timeout)))
        except psycopg2.Error as exc:
            failure = classify(
                driver_message(exc),
                getattr(exc, "pgcode", None),
                server=describe_server(dsn),
                user=dsn_user(dsn),
                lost=True,
            )
            raise failure.error from None
        self._conn.autocommit = True
        self._cursor: Any = self._conn.cursor()

    def _failed(self, exc: psycopg2.Error) -> StatementError:
        lost = isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError) or bool(
            self._conn.closed
        )
        return StatementError(driver_message(exc), getattr(exc, "pgcode", None), lost)

    def execute(self, statement: sql.Composable | str) -> list[tuple[Any, ...]]:
        """Run one statement; its rows (none for a statement without a result)."""
        try:
            self._cursor.execute(_text(statement))
            return list(self._cursor.fetchall()) if self._cursor.description else []
        except psycopg2.Error as exc:
            raise self._failed(exc) from None

    def result_columns(self, statement: sql.Composable | str) -> list[tuple[int, int | None]]:
        """Run a query; per result column, the table OID and attnum it reads (None, None for
        an expression), as the server resolved the query's names just now."""
        try:
            self._cursor.execute(_text(statement))
            description = self._cursor.description or ()
            self._cursor.fetchall()
        except psycopg2.Error as exc:
            raise self._failed(exc) from None
        return [(column.table_oid, column.table_column) for column in description]

    def copy_out(self, statement: sql.Composable | str, write: Callable[[bytes], object]) -> int:
        """Run ``COPY ... TO STDOUT``: ``write`` gets each CopyData message's bytes, in order;
        the number of rows the server says it sent (-1 if it does not say)."""
        try:
            self._cursor.copy_expert(_text(statement), _Sink(write))
        except psycopg2.Error as exc:
            raise self._failed(exc) from None
        rows: int = self._cursor.rowcount
        return rows

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> CopyConnection:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class _Sink:
    """The file object ``copy_expert`` writes to: its ``write`` is the caller's function
    itself (looked up once by psycopg2, then called from C for every message)."""

    __slots__ = ("write",)

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self.write = write
