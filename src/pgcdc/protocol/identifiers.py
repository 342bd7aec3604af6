"""PostgreSQL's own quoting of identifiers and literals, for output that must match the server's.

``quote_identifier`` follows src/backend/utils/adt/ruleutils.c: an identifier stays bare only if
it starts with a lowercase ASCII letter or underscore, continues with lowercase ASCII letters,
digits or underscores, and is not a keyword other than an unreserved one (the keyword list of the
server's major version). ``quote_literal`` follows quote_literal_cstr (E'' when backslashes).
"""

from __future__ import annotations

import re

from pgcdc.protocol.keywords import QUOTED_KEYWORDS

__all__ = ["quote_identifier", "quote_literal", "quote_qualified_identifier"]

_SAFE = re.compile(r"[a-z_][a-z0-9_]*\Z")
_LATEST = max(QUOTED_KEYWORDS)


def _keywords(major: int) -> frozenset[str]:
    known = [v for v in QUOTED_KEYWORDS if v <= major]
    return QUOTED_KEYWORDS[max(known) if known else min(QUOTED_KEYWORDS)]


def quote_identifier(name: str, major: int = _LATEST) -> str:
    """``name`` as PostgreSQL ``major`` prints an identifier (bare or double-quoted)."""
    if _SAFE.match(name) and name not in _keywords(major):
        return name
    return '"' + name.replace('"', '""') + '"'


def quote_qualified_identifier(namespace: str | None, name: str, major: int = _LATEST) -> str:
    if namespace:
        return f"{quote_identifier(namespace, major)}.{quote_identifier(name, major)}"
    return quote_identifier(name, major)


def quote_literal(text: str) -> str:
    """A SQL string literal, as quote_literal_cstr writes it."""
    body = text.replace("'", "''")
    if "\\" in text:
        return "E'" + body.replace("\\", "\\\\") + "'"
    return "'" + body + "'"
