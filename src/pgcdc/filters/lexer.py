"""Tokenizer for SQL expressions, following PostgreSQL's scanner (src/backend/parser/scan.l).

Identifiers: unquoted ones fold ASCII letters to lower case, ``"Quoted"`` ones are kept as
written (``""`` is a double quote); both are truncated to 63 bytes like NAMEDATALEN. Strings:
``'...'`` (``''`` is a quote, backslashes are literal: standard_conforming_strings), ``E'...'``
with backslash escapes, ``$tag$...$tag$``, and adjacent literals separated by a newline are
one literal. Numbers: integers, decimals and reals as PostgreSQL 15 lexes them (no hexadecimal
or underscore forms, which only PostgreSQL 16+ accepts). Operators follow scan.l's rules for
where a multi-character operator ends.

Positions are 0-based character offsets into the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pgcdc.filters.errors import FilterSyntaxError, UnsupportedFilterError

__all__ = ["NAMEDATALEN", "Token", "TokenKind", "tokenize"]

NAMEDATALEN = 64

TokenKind = Literal["ident", "qident", "integer", "number", "string", "op", "punct", "param", "eof"]


@dataclass(frozen=True, slots=True)
class Token:
    """One token: ``value`` is the folded identifier, the string's contents, the number's text
    or the operator; ``pos``/``end`` are 0-based offsets of its text."""

    kind: TokenKind
    value: str
    pos: int
    end: int

    def is_keyword(self, *words: str) -> bool:
        """An unquoted identifier spelling one of ``words`` (lower case)."""
        return self.kind == "ident" and self.value in words


_SPACE = re.compile(r"[ \t\n\r\f\v]+")
_IDENT = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z_0-9$\u0080-\U0010ffff]*")
_NUMBER = re.compile(
    r"(?:(?P<decimal>\d*\.\d+|\d+\.(?!\.)\d*)|(?P<integer>\d+))(?P<exp>[Ee][-+]?\d+)?"
)
_JUNK = re.compile(r"[A-Za-z_\u0080-\U0010ffff]")
_OP_CHARS = frozenset("~!@#^&|`?+-*/%<>=")
_SELF = frozenset(",()[].;:+-*/%^<>=")
_QUALIFYING = frozenset("~!@#^&|`?%")
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\u0080-\U0010ffff][A-Za-z_0-9\u0080-\U0010ffff]*)?\$")
_PARAM = re.compile(r"\$\d+")
_NEWLINE_GAP = re.compile(r"(?:[ \t\f\v\r]|--[^\n\r]*)*[\n\r](?:[ \t\n\r\f\v]|--[^\n\r]*)*")


def _syntax(message: str, pos: int) -> FilterSyntaxError:
    return FilterSyntaxError(message, sqlstate="42601", position=pos + 1)


def _truncate_identifier(name: str) -> str:
    raw = name.encode()
    if len(raw) < NAMEDATALEN:
        return name
    cut = raw[: NAMEDATALEN - 1]
    return cut.decode(errors="ignore")


def _downcase(name: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in name)


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``, ending with an ``eof`` token."""
    tokens: list[Token] = []
    zero = text.find("\x00")
    if zero >= 0:  # the server reads SQL as a C string: a NUL would end it there
        raise _syntax("invalid byte sequence: a row filter cannot contain a zero byte", zero)
    i = 0
    n = len(text)
    while True:
        i = _skip_space(text, i)
        if i >= n:
            tokens.append(Token("eof", "", n, n))
            return tokens
        c = text[i]
        start = i
        if c == "'" or (c in "eE" and text.startswith("'", i + 1)):
            value, i = _string(text, i)
            tokens.append(Token("string", value, start, i))
            continue
        if c in "bBxX" and text.startswith("'", i + 1):
            raise UnsupportedFilterError(
                "bit-string constants (B'...', X'...') are not supported in row filters",
                sqlstate="0A000",
                position=start + 1,
            )
        if c in "nN" and text.startswith("'", i + 1):
            raise UnsupportedFilterError(
                "national character constants (N'...') are not supported in row filters; "
                "write 'text'::character(n)",
                sqlstate="0A000",
                position=start + 1,
            )
        if c in "uU" and text.startswith("&", i + 1) and text[i + 2 : i + 3] in ("'", '"'):
            raise UnsupportedFilterError(
                "Unicode escape literals (U&'...') are not supported in row filters; "
                "write the characters themselves",
                sqlstate="0A000",
                position=start + 1,
            )
        if c == '"':
            value, i = _quoted_identifier(text, i)
            tokens.append(Token("qident", value, start, i))
            continue
        if c == "$":
            tag = _DOLLAR_TAG.match(text, i)
            if tag:
                close = text.find(tag.group(), tag.end())
                if close < 0:
                    raise _syntax("unterminated dollar-quoted string", start)
                value = text[tag.end() : close]
                i = close + len(tag.group())
                tokens.append(Token("string", value, start, i))
                continue
            param = _PARAM.match(text, i)
            if param:
                i = param.end()
                tokens.append(Token("param", param.group(), start, i))
                continue
            raise _syntax('syntax error at or near "$"', start)
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            m = _NUMBER.match(text, i)
            assert m is not None
            i = m.end()
            if i < n and (_JUNK.match(text, i) or (text[i] == "." and m.group("integer"))):
                if text.startswith("..", i) and m.group("integer") and not m.group("exp"):
                    pass  # "1..": the integer, then ".." (not valid in an expression anyway)
                else:
                    end = i
                    while end < n and (text[end].isalnum() or text[end] in "_."):
                        end += 1
                    raise _syntax(
                        f'trailing junk after numeric literal at or near "{text[start:end]}"',
                        start,
                    )
            kind: TokenKind = "number" if m.group("decimal") or m.group("exp") else "integer"
            tokens.append(Token(kind, m.group(), start, i))
            continue
        ident = _IDENT.match(text, i)
        if ident:
            i = ident.end()
            tokens.append(Token("ident", _truncate_identifier(_downcase(ident.group())), start, i))
            continue
        if text.startswith("::", i):
            tokens.append(Token("punct", "::", start, i + 2))
            i += 2
            continue
        if text.startswith(":=", i):
            raise _syntax('syntax error at or near ":="', start)
        if c in _OP_CHARS:
            op, i = _operator(text, i)
            kind = "punct" if len(op) == 1 and op in _SELF else "op"
            tokens.append(Token(kind, "<>" if op == "!=" else op, start, i))
            continue
        if c in _SELF:
            tokens.append(Token("punct", c, start, i + 1))
            i += 1
            continue
        raise _syntax(f'syntax error at or near "{c}"', start)


def _skip_space(text: str, i: int) -> int:
    n = len(text)
    while i < n:
        m = _SPACE.match(text, i)
        if m:
            i = m.end()
            continue
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if text.startswith("/*", i):
            depth = 0
            j = i
            while j < n:
                if text.startswith("/*", j):
                    depth += 1
                    j += 2
                elif text.startswith("*/", j):
                    depth -= 1
                    j += 2
                    if depth == 0:
                        break
                else:
                    j += 1
            if depth:
                raise _syntax("unterminated /* comment", i)
            i = j
            continue
        break
    return i


def _string(text: str, i: int) -> tuple[str, int]:
    """A string literal (and the ones continuing it across newlines) from ``i``."""
    parts: list[str] = []
    escapes = text[i] in "eE"
    if escapes:
        i += 1
    while True:
        value, i = _string_body(text, i, escapes)
        parts.append(value)
        gap = _NEWLINE_GAP.match(text, i)
        if gap and text.startswith("'", gap.end()):
            i = gap.end()
            continue
        return "".join(parts), i


def _string_body(text: str, i: int, escapes: bool) -> tuple[str, int]:
    start = i
    assert text[i] == "'"
    i += 1
    out: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == "'":
            if text.startswith("''", i):
                out.append("'")
                i += 2
                continue
            return "".join(out), i + 1
        if c == "\\" and escapes:
            decoded, i = _escape(text, i)
            out.append(decoded)
            continue
        out.append(c)
        i += 1
    raise _syntax("unterminated quoted string", start)


_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _escape(text: str, i: int) -> tuple[str, int]:
    """One backslash escape of an E'' string at ``i``."""
    if i + 1 >= len(text):
        raise _syntax("unterminated quoted string", i)
    c = text[i + 1]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 2
    if c in "01234567":
        m = re.compile(r"[0-7]{1,3}").match(text, i + 1)
        assert m is not None
        return _char(int(m.group(), 8) & 0xFF, i), m.end()
    if c == "x":
        m = re.compile(r"[0-9A-Fa-f]{1,2}").match(text, i + 2)
        if m:
            return _char(int(m.group(), 16), i), m.end()
        return "x", i + 2
    if c in "uU":
        width = 4 if c == "u" else 8
        digits = text[i + 2 : i + 2 + width]
        if len(digits) != width or not re.fullmatch(r"[0-9A-Fa-f]+", digits):
            raise _syntax("invalid Unicode escape", i)
        code = int(digits, 16)
        if 0xD800 <= code <= 0xDFFF or code == 0 or code > 0x10FFFF:
            raise UnsupportedFilterError(
                "Unicode escapes of surrogates, NUL or beyond U+10FFFF are not supported",
                sqlstate="0A000",
                position=i + 1,
            )
        return chr(code), i + 2 + width
    return c, i + 2


def _char(code: int, pos: int) -> str:
    if code == 0:
        raise _syntax("invalid byte sequence: a string cannot contain a zero byte", pos)
    if code >= 0x80:
        raise UnsupportedFilterError(
            "octal and hexadecimal escapes of non-ASCII bytes are not supported in row "
            "filters; write the character itself or use \\u escapes",
            sqlstate="0A000",
            position=pos + 1,
        )
    return chr(code)


def _quoted_identifier(text: str, i: int) -> tuple[str, int]:
    start = i
    i += 1
    out: list[str] = []
    n = len(text)
    while i < n:
        if text[i] == '"':
            if text.startswith('""', i):
                out.append('"')
                i += 2
                continue
            if not out:
                raise _syntax("zero-length delimited identifier", start)
            return _truncate_identifier("".join(out)), i + 1
        out.append(text[i])
        i += 1
    raise _syntax("unterminated quoted identifier", start)


def _operator(text: str, i: int) -> tuple[str, int]:
    """The operator starting at ``i``, cut where scan.l cuts it."""
    j = i
    n = len(text)
    while j < n and text[j] in _OP_CHARS:
        j += 1
    raw = text[i:j]
    cut = len(raw)
    for marker in ("/*", "--"):
        k = raw.find(marker)
        if k >= 0:
            cut = min(cut, k)
    if cut == 0:  # cannot happen: comments are skipped before operators
        raise _syntax("syntax error", i)
    op = raw[:cut]
    if len(op) > 1 and op[-1] in "+-" and not any(ch in _QUALIFYING for ch in op[:-1]):
        while len(op) > 1 and op[-1] in "+-":
            op = op[:-1]
    if len(op.encode()) >= NAMEDATALEN:
        raise _syntax("operator too long", i)
    return op, i + len(op)
