"""The errors of the Spark source, each naming the problem and the fix.

Two of them are decisions for whoever runs the query: ``SchemaChanged`` (restart the query: a
new DataFrame has the new schema) and ``CopyAgain`` (take a new snapshot: a table changed its
columns while the initial copy ran). Raised in an executor's ``read()``, they reach the driver
as a Java exception whose message holds the Python traceback, so their messages start with a
tag naming their class, ``[pgcdc:<class>]``; ``raised_as`` recovers the class from any exception
chain, and callers decide by class, never by the wording of a message.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pgcdc.errors import PgcdcError

__all__ = [
    "SCHEMA_CHANGED_MARKER",
    "CopyAgain",
    "EndpointError",
    "OptionError",
    "ReplayError",
    "SchemaChanged",
    "SparkSourceError",
    "UnreadableValueError",
    "is_schema_changed",
    "raised_as",
    "unreadable_value",
]

_TAG = re.compile(r"\[pgcdc:([A-Za-z]+)\]")


class SparkSourceError(PgcdcError):
    """Base class: the pgcdc Spark source failed. ``cause`` and ``fix`` make up the message."""

    #: Whether the message starts with the class's tag, for ``raised_as`` to find across the JVM
    tagged: ClassVar[bool] = False

    def __init__(self, cause: str, fix: str | None = None) -> None:
        # here, not at the top: the executors' Python workers import this module, and the
        # replication layer brings psycopg and psycopg2, which they do not use otherwise
        from pgcdc.replication.errors import scrub_secrets

        self.cause = scrub_secrets(cause.strip())
        self.fix = scrub_secrets(fix.strip()) if fix else None
        message = self.cause if not self.fix else f"{self.cause}. Fix: {self.fix}"
        if self.tagged:
            message = f"[pgcdc:{type(self).__name__}] {message}"
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

    tagged = True

    def __init__(self, table: str, change: str, fix: str | None = None) -> None:
        self.table = table
        self.change = change
        super().__init__(
            f"table {table}: {change}",
            fix
            or "restart the streaming query (define the DataFrame again): its schema is read "
            "from the catalog when it is defined, and the failed batch is read again",
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.table, self.change, self.fix))


class CopyAgain(SparkSourceError):
    """A table changed its columns after the initial copy's snapshot was taken (a rewriting
    ``ALTER TABLE``, or a column dropped or retyped while the copy ran): a copy in that snapshot
    would be wrong or fails, and a new snapshot with a new plan of the tables repairs it.
    ``pgcdc run`` copies again by itself."""

    tagged = True


_TAGGED: dict[str, type[SparkSourceError]] = {
    cls.__name__: cls for cls in (SchemaChanged, CopyAgain)
}

#: The tag that starts every ``SchemaChanged`` message
SCHEMA_CHANGED_MARKER = "[pgcdc:SchemaChanged]"


def raised_as(error: BaseException | None) -> type[SparkSourceError] | None:
    """The tagged pgcdc error class in ``error``'s cause/context chain: an instance of it, or a
    message carrying its tag (an executor's error as Spark wraps it); None when there is none."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, SparkSourceError) and error.tagged:
            return type(error)
        match = _TAG.search(str(error))
        if match is not None and match.group(1) in _TAGGED:
            return _TAGGED[match.group(1)]
        error = error.__cause__ or error.__context__
    return None


def is_schema_changed(error: BaseException | None) -> bool:
    """Whether ``error`` (or anything in its cause/context chain, as Spark wraps executor
    errors) is a ``SchemaChanged``."""
    raised = raised_as(error)
    return raised is not None and issubclass(raised, SchemaChanged)


class UnreadableValueError(SparkSourceError):
    """A value the query's type for its column cannot take (NaN in a numeric(p,s), an array of
    more dimensions than declared, ``24:00:00`` as a TIME): the column must be read as text."""


def unreadable_value(column: tuple[str, str, str], reason: str) -> UnreadableValueError:
    """The error for a value of ``column`` (schema, table, column) that ``reason`` refuses,
    with the fix: read that column as its type's text."""
    import json

    schema, table, name = column
    qualified = f"{schema}.{table}"
    return UnreadableValueError(
        f"{qualified}: {reason}",
        f"mirror column {name!r} as the text PostgreSQL prints: text_columns = "
        f"[{json.dumps(name)}] in the [[tables]] entry of {qualified} (pgcdc run; a lake that "
        "holds the table already then needs it copied again), or the source option "
        f"textColumns={json.dumps({qualified: [name]})}",
    )
