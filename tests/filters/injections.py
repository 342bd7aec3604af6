"""Row filter texts that try to run SQL of their own (issue 24, item 2), for the parser's tests
and for ``pgcdc run`` / ``pgcdc run --check`` against a real server.

The tests create ``public.items`` and ``rel.items`` (``id int PRIMARY KEY``), the tables these
texts try to drop or write beside; ``public.pwned`` must never appear.
"""

from __future__ import annotations

#: The three texts of the issue: they ran, and the first two exited 0.
ISSUE = [
    "id = 1); CREATE TABLE public.pwned (x int); --",
    "id = 1); DROP TABLE rel.items; --",
    "id = 1); COMMIT; CREATE TABLE public.pwned (x int); --",
]

#: Not exactly one expression (or a form pgcdc does not print back): refused by pgcdc's parser
#: or printer, before any connection.
REFUSED_BY_PARSER = [
    *ISSUE,
    # semicolons: a trailing one, a second statement, one after a complete expression
    "id = 1;",
    "id = 1; DROP TABLE rel.items",
    "id = 1; COMMIT; CREATE TABLE public.pwned (x int)",
    # COMMIT / ROLLBACK after the expression, without a semicolon
    "id = 1 COMMIT",
    "id = 1)\nCOMMIT;\nCREATE TABLE public.pwned (x int);\n--",
    # breaking out of WHERE ( ... ) and back in
    "id = 1) OR (1 = 1",
    "id = 1)) ; DROP TABLE rel.items; ((",
    # unbalanced and nested parentheses
    "((id = 1)",
    "(((id = 1))) ) ; (",
    "((((id = 1)))); DROP TABLE rel.items",
    "id IN (1, (2); DROP TABLE rel.items",
    # comments: one that hides the closing parenthesis, an unterminated one, nested ones
    "id = 1) --",
    "id = 1 /* ); DROP TABLE rel.items; --",
    "id = 1 /* nested /* */ ); DROP TABLE rel.items; --",
    "id = 1 */ ; DROP TABLE rel.items; /*",
    "id = 1 --\n); DROP TABLE rel.items; --",
    # quotes: dollar quotes around the breakout, unterminated ones, a standard string
    "id = $$1$$); DROP TABLE rel.items; --",
    "id = $x$ $x$); CREATE TABLE public.pwned (x int); --",
    "id = $$); DROP TABLE rel.items; --",
    "id = '1'); DROP TABLE rel.items; --",
    "id = 'unterminated",
    '"id" = 1); DROP TABLE "rel"."items"; --',
    # Unicode escapes (not supported: refused, not guessed)
    "id = U&'\\0031'",
    'U&"i\\0064" = 1',
    "id::text = U&'1'); DROP TABLE rel.items; --",
    # sub-SELECTs and statements as operands
    "id IN (SELECT 1); DROP TABLE rel.items",
    "id IN (SELECT id FROM rel.items)",
    "EXISTS (DELETE FROM rel.items RETURNING 1)",
    "(DROP TABLE rel.items) IS NULL",
    # a zero byte (the server would read the text as a C string ending there)
    "id = 1\x00); DROP TABLE rel.items; --",
    # psql meta-commands and parameters
    "id = 1 \\g",
    "id = $1",
]

#: One expression each, so pgcdc sends its own rendering, which the server refuses (exit 2
#: all the same, and nothing is created): what looks like SQL is a string constant or a name.
REFUSED_BY_SERVER = [
    "id = E'\\'); DROP TABLE rel.items; --'",
    "commit",
    "id = 1 OR pg_catalog.pg_sleep(0) IS NULL",
]

#: One expression and a comment: accepted, and the comment is gone from what is sent.
HARMLESS = "id = 1 -- ); DROP TABLE rel.items; --"
