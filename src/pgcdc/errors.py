"""The root of pgcdc's exceptions: every error pgcdc raises on purpose is a ``PgcdcError``.

Each layer's errors keep the built-in base that says what kind of failure they are
(``ValueError`` for bad input, ``RuntimeError`` for a failed operation), so ``except
PgcdcError`` catches what pgcdc raised and ``except ValueError`` still catches bad input.
"""

from __future__ import annotations

__all__ = ["PgcdcError"]


class PgcdcError(Exception):
    """An error pgcdc raised: its message names the problem and, where there is one, the fix."""
