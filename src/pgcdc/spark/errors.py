"""The errors of the Spark source, each naming the problem and the fix.

Two of them are decisions for whoever runs the query: ``SchemaChanged`` (restart the query: a
new DataFrame has the new schema) and ``CopyAgain`` (take a new snapshot: a table changed its
columns while the initial copy ran). Raised in an executor's ``read()``, they reach the driver
as a Java exception whose message holds the Python traceback, so their messages start with a
tag naming their class, ``[pgcdc:<class>]``; ``raised_as`` recovers the class from any exception
chain, and callers decide by class, never by the wording of a message.

Errors from the JVM: ``java_causes`` reads the Java exception behind an error (a
``Py4JJavaError``, or a pyspark error that captured one) and its causes down to the root, class
by class, through py4j while the JVM runs (``JavaCause``: the class and its superclasses, the
message, and what Java gives beyond it: a file system error's file and reason, a Spark error's
``path`` parameter, an AWS service error's code and HTTP status); an error that reached Python
as text only (one that crossed a Python callback into the JVM and back) is read from its text.
``pgcdc.lake.run.failures`` turns them into a cause and a fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from pgcdc.errors import PgcdcError

__all__ = [
    "SCHEMA_CHANGED_MARKER",
    "CopyAgain",
    "EndpointError",
    "JavaCause",
    "OptionError",
    "ReplayError",
    "SchemaChanged",
    "SparkSourceError",
    "UnreadableValueError",
    "is_schema_changed",
    "java_causes",
    "raised_as",
    "tagged_message",
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


class UnreadableValueError(SparkSourceError):
    """A value the query's type for its column cannot take (NaN in a numeric(p,s), an array of
    more dimensions than declared, ``24:00:00`` as a TIME): the column must be read as text.
    The message starts with the table's ``schema.table`` (after the tag)."""

    tagged = True


_TAGGED: dict[str, type[SparkSourceError]] = {
    cls.__name__: cls for cls in (SchemaChanged, CopyAgain, UnreadableValueError)
}


def tagged_message(error: BaseException | None, cls: type[SparkSourceError]) -> str | None:
    """The message of the ``cls`` error in ``error``'s cause/context chain (tagged classes
    only; an executor's error as Spark wraps it too): its text after the tag, to the end of
    its line; None when there is none."""
    seen: set[int] = set()
    marker = f"[pgcdc:{cls.__name__}] "
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        at = text.find(marker)
        if at >= 0:
            return text[at + len(marker) :].split("\n", 1)[0].strip()
        error = error.__cause__ or error.__context__
    return None


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


@dataclass(frozen=True, slots=True)
class JavaCause:
    """One exception of the Java cause chain behind an error (see the module doc)."""

    java_class: str
    message: str = ""
    #: the class and its superclasses (and ``org.apache.spark.SparkThrowable`` if a Spark error)
    classes: frozenset[str] = frozenset()
    #: ``FileSystemException.getFile()``, or the ``path`` parameter of a Spark error
    path: str | None = None
    #: ``FileSystemException.getReason()``: ``No space left on device``, ``Permission denied``
    reason: str | None = None
    #: an AWS service error's code (``AccessDenied``, ``NoSuchBucket``) and HTTP status
    error_code: str | None = None
    status: int | None = None
    #: read from a stack trace's text: ``classes`` holds the class alone
    from_text: bool = False
    #: the classes of the root cause's stack frames, innermost first (where it was thrown)
    frames: tuple[str, ...] = ()

    def is_a(self, *names: str) -> bool:
        """Whether the exception is an instance of one of the Java classes ``names``."""
        return any(name in self.classes for name in names)


#: at most this many causes are read (a chain is a handful; a cycle must not hang)
_MAX_CAUSES = 32
_MAX_FRAMES = 200
_AWS_SERVICE_ERROR = "software.amazon.awssdk.awscore.exception.AwsServiceException"
_FILE_SYSTEM_ERROR = "java.nio.file.FileSystemException"
_SPARK_ERROR = "org.apache.spark.SparkThrowable"


def java_causes(error: BaseException | None) -> list[JavaCause]:
    """The Java cause chain behind ``error``, outermost first, root last: from the first Java
    exception in ``error``'s cause/context chain, read through py4j; else, when the JVM cannot
    be asked (gone) or the error holds Java's text only, parsed from that text. Empty when
    ``error`` did not come from the JVM."""
    texts = []
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for java in _java_objects(error):
            try:
                return _read_causes(java)
            except Exception:  # the JVM is gone: its text, if Python has it
                break
        texts.append(_text(error))
        error = error.__cause__ or error.__context__
    for text in texts:
        causes = _parse_causes(text)
        if causes:
            return causes
    return []


def _java_objects(error: BaseException) -> list[Any]:
    """The Java exceptions ``error`` holds: a ``Py4JJavaError``'s, or the one a pyspark error
    captured (or its cause's, for a streaming query's error made from the query's exception)."""
    found = []
    current: Any = error
    for _ in range(_MAX_CAUSES):
        if current is None:
            break
        java = getattr(current, "java_exception", None) or getattr(current, "_origin", None)
        if java is not None:
            found.append(java)
            break
        current = getattr(current, "_cause", None)
    return found


def _read_causes(java: Any) -> list[JavaCause]:
    from py4j.java_gateway import is_instance_of  # type: ignore[import-untyped]
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    causes: list[JavaCause] = []
    last = java
    while java is not None and len(causes) < _MAX_CAUSES:
        kind = java.getClass()
        name = str(kind.getName())
        classes = set()
        while kind is not None:
            classes.add(str(kind.getName()))
            kind = kind.getSuperclass()
        path = reason = code = None
        status = None
        if _FILE_SYSTEM_ERROR in classes:
            path, reason = _text_or_none(java.getFile()), _text_or_none(java.getReason())
        if gateway is not None and is_instance_of(gateway, java, _SPARK_ERROR):
            classes.add(_SPARK_ERROR)
            parameters = java.getMessageParameters()
            path = path or (_text_or_none(parameters.get("path")) if parameters else None)
        if _AWS_SERVICE_ERROR in classes:
            details = java.awsErrorDetails()
            code = _text_or_none(details.errorCode()) if details is not None else None
            status = int(java.statusCode())
        causes.append(
            JavaCause(
                java_class=name,
                message=(_text_or_none(java.getMessage()) or "")[:4000],
                classes=frozenset(classes),
                path=path,
                reason=reason,
                error_code=code,
                status=status,
            )
        )
        java, last = java.getCause(), java
    if causes:  # where the root cause was thrown says what was being done
        frames = tuple(str(frame.getClassName()) for frame in last.getStackTrace())
        causes[-1] = replace(causes[-1], frames=frames[:_MAX_FRAMES])
    return causes


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _text(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a Py4JJavaError asks the JVM for its text
        return ""


#: a Java exception's line in a stack trace's text: ``Caused by: <class>: <message>``, or
#: ``: <class>: <message>`` after a Py4J error's first line; a class is dotted and its simple
#: name ends as Java's exceptions do
_CAUSE_LINE = re.compile(
    r"^(?:Caused by: |: )?((?:[A-Za-z_$][\w$]*\.)+[A-Za-z_$][\w$]*(?:Exception|Error|Throwable))"
    r"(?:: (.*))?$"
)


def _parse_causes(text: str) -> list[JavaCause]:
    """The Java exceptions a stack trace's text names at the start of a line (not those of
    suppressed exceptions, which are indented), in their order: a chain's root is last."""
    causes = []
    for line in text.splitlines():
        match = _CAUSE_LINE.match(line.rstrip())
        if match is not None:
            name = match.group(1)
            causes.append(
                JavaCause(
                    java_class=name,
                    message=(match.group(2) or "")[:4000],
                    classes=frozenset([name]),
                )
            )
    return causes
