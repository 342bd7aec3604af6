"""The exceptions the codec raises for bad input: ``ProtocolError`` for pgoutput messages,
``CopyFormatError`` for the tuples of ``COPY ... (FORMAT binary)``."""

from __future__ import annotations

from pgcdc.errors import PgcdcError

__all__ = ["CopyFormatError", "ProtocolError"]


class ProtocolError(PgcdcError, ValueError):
    """A replication message that does not follow the pgoutput format.

    ``message_type`` is the message's type byte as a character (``'I'`` for Insert) or None when
    not even that could be read; ``offset`` is the byte offset within the message where the
    problem was found; ``reason`` says what was wrong.
    """

    def __init__(
        self,
        message_type: str | None,
        offset: int,
        reason: str,
        column: tuple[str, str, str] | None = None,
    ) -> None:
        self.message_type = message_type
        self.offset = offset
        self.reason = reason
        #: (schema, table, column) of a value its column's type cannot take, else None
        self.column = column
        name = MESSAGE_NAMES.get(message_type or "")
        what = (
            f"{name} message ({message_type!r})"
            if name
            else ("message" if message_type is None else f"message type {message_type!r}")
        )
        super().__init__(f"bad pgoutput {what} at byte {offset}: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (ProtocolError, (self.message_type, self.offset, self.reason, self.column))


class CopyFormatError(PgcdcError, ValueError):
    """A ``COPY ... (FORMAT binary)`` tuple that does not follow the format, or a value its
    column's type cannot take. ``row`` is the tuple's index in the list decoded, ``offset`` the
    byte offset within it where the problem was found."""

    def __init__(
        self, row: int, offset: int, reason: str, column: tuple[str, str, str] | None = None
    ) -> None:
        self.row = row
        self.offset = offset
        self.reason = reason
        #: (schema, table, column) of a value its column's type cannot take, else None
        self.column = column
        super().__init__(f"bad COPY binary tuple {row} at byte {offset}: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (CopyFormatError, (self.row, self.offset, self.reason, self.column))


MESSAGE_NAMES: dict[str, str] = {
    "B": "Begin",
    "M": "Message",
    "C": "Commit",
    "O": "Origin",
    "R": "Relation",
    "Y": "Type",
    "I": "Insert",
    "U": "Update",
    "D": "Delete",
    "T": "Truncate",
    "S": "Stream Start",
    "E": "Stream Stop",
    "c": "Stream Commit",
    "A": "Stream Abort",
    "b": "Begin Prepare",
    "P": "Prepare",
    "K": "Commit Prepared",
    "r": "Rollback Prepared",
    "p": "Stream Prepare",
}
