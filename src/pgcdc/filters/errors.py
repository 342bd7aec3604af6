"""Errors of row filters: parsing, binding to a relation, and evaluating against a row.

Every error carries PostgreSQL's SQLSTATE and message wording where PostgreSQL has an
equivalent error (``sqlstate``, ``message``, ``detail``, ``hint``), and the 1-based character
``position`` in the filter text it points at, when there is one. ``str(error)`` shows the
message, the detail and hint lines and the filter text with a caret under the position, like
psql does.

- ``FilterSyntaxError``: the text is not an SQL expression (42601).
- ``InvalidFilterError``: PostgreSQL would reject the expression in CREATE PUBLICATION ... WHERE:
  its "invalid publication WHERE expression" rules (user-defined or mutable functions, system
  columns, ...) or a parse-analysis error (unknown column, operator does not exist, ...).
- ``ReplicaIdentityError``: a publication that publishes UPDATE or DELETE filters on a column
  outside the replica identity (PostgreSQL refuses the UPDATE or DELETE itself).
- ``UnsupportedFilterError``: PostgreSQL accepts the expression, but this client-side
  implementation cannot evaluate it exactly (a function, type or collation it does not
  implement); ``CollationError`` is the case of text ordering under a non-C collation.
- ``FilterEvaluationError``: evaluating the filter against a row failed the way the server's
  evaluation fails (division by zero, integer out of range, ...). PostgreSQL's walsender errors
  out on such a row and replication stops; ``StreamFilter`` raises it the same way.
"""

from __future__ import annotations

from pgcdc.errors import PgcdcError

__all__ = [
    "CollationError",
    "FilterEvaluationError",
    "FilterSyntaxError",
    "InvalidFilterError",
    "ReplicaIdentityError",
    "RowFilterError",
    "UnsupportedFilterError",
]


class RowFilterError(PgcdcError, ValueError):
    """Base class of all row filter errors."""

    sqlstate: str
    message: str
    detail: str | None
    hint: str | None
    position: int | None
    expression: str | None

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str = "XX000",
        detail: str | None = None,
        hint: str | None = None,
        position: int | None = None,
        expression: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.detail = detail
        self.hint = hint
        self.position = position
        self.expression = expression

    def with_expression(self, expression: str) -> RowFilterError:
        """This error, pointing into ``expression`` (set once, by the outermost caller)."""
        if self.expression is None:
            self.expression = expression
        return self

    def __str__(self) -> str:
        lines = [self.message]
        if self.detail:
            lines.append(f"DETAIL:  {self.detail}")
        if self.hint:
            lines.append(f"HINT:  {self.hint}")
        if self.position is not None and self.expression is not None:
            lines.extend(_caret(self.expression, self.position))
        return "\n".join(lines)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.message, self._state()))

    def _state(self) -> dict[str, str | int | None]:
        return {
            "sqlstate": self.sqlstate,
            "detail": self.detail,
            "hint": self.hint,
            "position": self.position,
            "expression": self.expression,
        }

    def copy(self) -> RowFilterError:
        """A new exception with the same fields (to raise the same error again)."""
        return _rebuild(type(self), self.message, self._state())


def _rebuild(
    cls: type[RowFilterError], message: str, state: dict[str, str | int | None]
) -> RowFilterError:
    return cls(message, **state)  # type: ignore[arg-type]


def _caret(text: str, position: int) -> list[str]:
    """The line of ``text`` holding 1-based ``position``, and a caret under it."""
    index = max(0, min(position - 1, len(text)))
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    line = text[start : end if end >= 0 else len(text)]
    return [f"  {line}", "  " + " " * (index - start) + "^"]


class FilterSyntaxError(RowFilterError):
    """The filter text is not a valid SQL expression."""


class InvalidFilterError(RowFilterError):
    """PostgreSQL would reject this expression as a publication WHERE clause."""


class ReplicaIdentityError(InvalidFilterError):
    """The filter of an UPDATE/DELETE publication uses a column outside the replica identity."""


class UnsupportedFilterError(RowFilterError):
    """PostgreSQL accepts the expression but client-side evaluation cannot match it exactly."""


class CollationError(UnsupportedFilterError):
    """Text ordering or case mapping under a collation other than C/POSIX."""


class FilterEvaluationError(RowFilterError):
    """Evaluating the filter raised an error, as the server's evaluation would."""
