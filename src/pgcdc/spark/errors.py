"""The errors of the Spark source, each naming the problem and the fix.

``SchemaChanged`` is the one a pipeline reacts to: the stream carried a table definition that the
query's schema (computed from the catalog when the DataFrame was defined) does not have, and the
current catalog confirms the change. Spark reports an error raised in an executor's ``read()``
as a Java exception whose message holds the Python traceback text, so the message carries the
stable marker ``SCHEMA_CHANGED_MARKER``; ``is_schema_changed`` finds it in any exception chain.
"""

from __future__ import annotations

from pgcdc.errors import PgcdcError

__all__ = [
    "COLUMNS_CHANGED_MARKER",
    "COPY_AGAIN_MARKERS",
    "REWRITTEN_MARKER",
    "SCHEMA_CHANGED_MARKER",
    "EndpointError",
    "OptionError",
    "ReplayError",
    "SchemaChanged",
    "SparkSourceError",
    "is_schema_changed",
]

#: Text every SchemaChanged message starts with; survives Spark's exception wrapping.
SCHEMA_CHANGED_MARKER = "[PGCDC_SCHEMA_CHANGED]"

#: In the error of a snapshot copy that met a table rewritten since its snapshot (``pgcdc run``
#: copies again with a new snapshot when it sees it)
REWRITTEN_MARKER = "was rewritten by a column change"
#: In the error of a snapshot copy whose table lost or changed a column after it was planned
COLUMNS_CHANGED_MARKER = "changed its columns during the initial copy"
#: Errors of a copy that a new snapshot (and a new plan of the tables) repairs
COPY_AGAIN_MARKERS = (REWRITTEN_MARKER, COLUMNS_CHANGED_MARKER)


class SparkSourceError(PgcdcError):
    """Base class: the pgcdc Spark source failed. ``cause`` and ``fix`` make up the message."""

    def __init__(self, cause: str, fix: str | None = None) -> None:
        # here, not at the top: the executors' Python workers import this module, and the
        # replication layer brings psycopg and psycopg2, which they do not use otherwise
        from pgcdc.replication.errors import scrub_secrets

        self.cause = scrub_secrets(cause.strip())
        self.fix = scrub_secrets(fix.strip()) if fix else None
        message = self.cause if not self.fix else f"{self.cause}. Fix: {self.fix}"
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.cause, self.fix))


class OptionError(SparkSourceError, ValueError):
    """A data source option is missing, malformed or contradicts another one."""


class EndpointError(SparkSourceError):
    """An executor could not fetch its partition's data from the driver's data endpoint."""


class ReplayError(SparkSourceError):
    """A planned batch cannot be read again exactly as planned."""


class SchemaChanged(SparkSourceError):
    """A table's definition in the stream differs from the query's schema, and the catalog agrees.

    ``table`` is ``schema.table``; ``change`` says what changed (a column added or retyped, a
    table newly published). Restart the query: a new DataFrame picks up the new schema and the
    failed batch is read again (nothing was acknowledged).
    """

    def __init__(self, table: str, change: str, fix: str | None = None) -> None:
        self.table = table
        self.change = change
        super().__init__(
            f"{SCHEMA_CHANGED_MARKER} table {table}: {change}",
            fix
            or "restart the streaming query (define the DataFrame again): its schema is read "
            "from the catalog when it is defined, and the failed batch is read again",
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.table, self.change, self.fix))


def is_schema_changed(error: BaseException | None) -> bool:
    """Whether ``error`` (or anything in its cause/context chain, or its message, as Spark wraps
    executor errors) is a ``SchemaChanged``."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, SchemaChanged) or SCHEMA_CHANGED_MARKER in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False
