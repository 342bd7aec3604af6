"""Character types, "char" and bytea against the server's text and binary output."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgcdc.protocol.values import ConversionError, TypeRegistry, oids, python_value, to_arrow
from pgcdc.protocol.values.string import bytea_from_text
from tests.fix_pg import PgDatabase
from tests.protocol.values.checks import check_samples

TEXTS = [
    ("", ""),
    ("hello", "hello"),
    ("a b\tc\nd", "a b\tc\nd"),
    ("quote ' \" backslash \\", "quote ' \" backslash \\"),
    ("NULL", "NULL"),
    ("ünïcødé ✓ 日本語 🐘", "ünïcødé ✓ 日本語 🐘"),
    (None, None),
]


@pytest.mark.parametrize("type_sql", ["text", "varchar", "varchar(100)", "name", "xml"])
def test_character_types(pg: PgDatabase, type_sql: str) -> None:
    cases = TEXTS
    if type_sql == "xml":
        cases = [("<a>b &amp; c</a>", "<a>b &amp; c</a>"), ("", ""), ("text only", "text only")]
    with pg.connect() as conn:
        got = check_samples(conn, type_sql, cases, expected_arrow=pa.string())
    assert to_arrow(got.binary, got.oid, got.typmod).to_pylist() == [v for _, v in cases]


def test_bpchar_keeps_padding(pg: PgDatabase) -> None:
    cases = [("ab", "ab   "), ("abcde", "abcde"), ("", "     "), (None, None)]
    with pg.connect() as conn:
        check_samples(
            conn,
            "char(5)",
            cases,
            expected_arrow=pa.string(),
            arrow_values=[v for _, v in cases],
        )


def test_single_char(pg: PgDatabase) -> None:
    """ "char": one byte; bytes above 0x7f print as a backslash and three octal digits."""
    cases = [("a", "a"), ("", ""), ("\\377", "\\377"), ("\\200", "\\200"), (None, None)]
    with pg.connect() as conn:
        got = check_samples(conn, '"char"', cases, expected_arrow=pa.string())
    assert got.binary[2] == b"\xff"


def test_bytea(pg: PgDatabase) -> None:
    cases = [
        ("\\x", b""),
        ("\\x0102ff", b"\x01\x02\xff"),
        ("\\x" + bytes(range(256)).hex(), bytes(range(256))),
        ("abc \\\\ \\000", b"abc \\ \x00"),
        (None, None),
    ]
    with pg.connect() as conn:
        got = check_samples(
            conn,
            "bytea",
            cases,
            expected_arrow=pa.binary(),
            arrow_values=[v for _, v in cases],
        )
    assert got.text[1] == "\\x0102ff"


def test_bytea_escape_format() -> None:
    """bytea_output = escape is read too."""
    assert bytea_from_text("abc\\\\\\000\\377") == b"abc\\\x00\xff"
    assert bytea_from_text("plain") == b"plain"
    with pytest.raises(ConversionError, match="invalid escape"):
        bytea_from_text("bad\\9")
    with pytest.raises(ConversionError, match="invalid hex"):
        bytea_from_text("\\xzz")


def test_invalid_utf8_binary_text() -> None:
    with pytest.raises(ConversionError, match="client_encoding to UTF8"):
        python_value(b"\xff\xfe", oids.TEXT_OID)


def test_enum(pg: PgDatabase) -> None:
    """Enums load as their label (text in both formats), via a registry that knows them."""
    with pg.connect() as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy face', 'NULL')")
        registry = TypeRegistry()
        registry.load(conn)
        cases = [("sad", "sad"), ("happy face", "happy face"), ("NULL", "NULL"), (None, None)]
        check_samples(conn, "mood", cases, expected_arrow=pa.string(), registry=registry)
        check_samples(
            conn,
            "mood[]",
            [('{sad,"happy face",NULL,"NULL"}', ["sad", "happy face", None, "NULL"])],
            expected_arrow=pa.list_(pa.string()),
            registry=registry,
        )
