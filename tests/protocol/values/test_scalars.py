"""bool, uuid, json/jsonb/jsonpath, bit/varbit, inet/cidr, macaddr/macaddr8 against the server."""

from __future__ import annotations

import ipaddress
import uuid

import pyarrow as pa
import pytest

from pgcdc.protocol.values import ConversionError, oids, python_value, to_arrow
from tests.fix_pg import PgDatabase
from tests.protocol.values.checks import check_samples


def test_bool(pg: PgDatabase) -> None:
    cases = [("true", True), ("f", False), ("yes", True), (None, None)]
    with pg.connect() as conn:
        check_samples(
            conn, "bool", cases, expected_arrow=pa.bool_(), arrow_values=[True, False, True, None]
        )
    with pytest.raises(ConversionError, match="'t' or 'f'"):
        python_value("true", oids.BOOL_OID)
    with pytest.raises(ConversionError, match="other than 't' and 'f'"):
        to_arrow(["t", "x"], oids.BOOL_OID)


def test_uuid(pg: PgDatabase) -> None:
    values = [uuid.UUID(int=0), uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), uuid.uuid4()]
    cases: list[tuple[str | None, object]] = [(str(u).upper(), u) for u in values]
    cases.append((None, None))
    with pg.connect() as conn:
        got = check_samples(conn, "uuid", cases, expected_arrow=pa.string())
    assert got.text[1] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"


JSON_INPUTS = [
    '{"b": [1, 2.50, {"c": null}], "a": "x\\u00e9y"}',
    "[]",
    '"just a string with \\"quotes\\""',
    "1e400",
    '{"a":1,   "a":2}',
    "null",
]


@pytest.mark.parametrize("type_sql", ["json", "jsonb"])
def test_json(pg: PgDatabase, type_sql: str) -> None:
    """JSON text as the server prints it (jsonb normalised), never parsed into Python objects."""
    with pg.connect() as conn:
        if type_sql == "json":
            cases: list[tuple[str | None, object]] = [(j, j) for j in JSON_INPUTS]
        else:
            printed = [
                '{"a": "xéy", "b": [1, 2.50, {"c": null}]}',
                "[]",
                '"just a string with \\"quotes\\""',
                "1" + "0" * 400,
                '{"a": 2}',
                "null",
            ]
            cases = list(zip(JSON_INPUTS, printed, strict=True))
        cases.append((None, None))
        got = check_samples(conn, type_sql, cases, expected_arrow=pa.string())
    if type_sql == "jsonb":
        assert got.binary[0] is not None and got.binary[0][:1] == b"\x01"


def test_jsonpath(pg: PgDatabase) -> None:
    cases = [("$.a[*] ? (@ > 2)", '$."a"[*]?(@ > 2)'), (None, None)]
    with pg.connect() as conn:
        check_samples(conn, "jsonpath", cases, expected_arrow=pa.string())


def test_jsonb_unknown_version() -> None:
    with pytest.raises(ConversionError, match="format version 2"):
        python_value(b"\x02{}", oids.JSONB_OID)


@pytest.mark.parametrize("type_sql", ["bit(10)", "varbit", "bit varying(20)"])
def test_bits(pg: PgDatabase, type_sql: str) -> None:
    if type_sql == "bit(10)":
        cases: list[tuple[str | None, object]] = [
            ("1011000001", "1011000001"),
            ("0000000000", "0000000000"),
            (None, None),
        ]
    else:
        cases = [("", ""), ("1", "1"), ("10110000", "10110000"), ("101100001", "101100001")]
    with pg.connect() as conn:
        check_samples(
            conn,
            type_sql,
            cases,
            expected_arrow=pa.string(),
            arrow_values=[v for _, v in cases],
        )


def test_inet(pg: PgDatabase) -> None:
    ip = ipaddress
    cases = [
        ("192.168.1.5", ip.ip_address("192.168.1.5")),
        ("192.168.1.5/24", ip.ip_interface("192.168.1.5/24")),
        ("10.0.0.0/8", ip.ip_interface("10.0.0.0/8")),
        ("0.0.0.0/0", ip.ip_interface("0.0.0.0/0")),
        ("::1", ip.ip_address("::1")),
        ("::", ip.ip_address("::")),
        ("::2", ip.ip_address("::2")),
        ("::ffff:1.2.3.4", ip.ip_address("::ffff:1.2.3.4")),
        ("::1.2.3.4", ip.ip_address("::1.2.3.4")),
        ("2001:db8::1/64", ip.ip_interface("2001:db8::1/64")),
        ("2001:db8:0:0:1:0:0:1", ip.ip_address("2001:db8::1:0:0:1")),
        ("1:0:0:2:0:0:0:3", ip.ip_address("1:0:0:2::3")),
        ("fe80::1:2:3:4:5", ip.ip_address("fe80::1:2:3:4:5")),
        ("1:2:3:4:5:6:7:8", ip.ip_address("1:2:3:4:5:6:7:8")),
        (None, None),
    ]
    with pg.connect() as conn:
        got = check_samples(conn, "inet", cases, expected_arrow=pa.string())
    assert got.text[7] == "::ffff:1.2.3.4"  # not Python's ::ffff:102:304
    assert got.text[2] == "10.0.0.0/8"


def test_cidr(pg: PgDatabase) -> None:
    ip = ipaddress
    cases = [
        ("10.0.0.0/8", ip.ip_network("10.0.0.0/8")),
        ("192.168.1.5/32", ip.ip_network("192.168.1.5/32")),
        ("0.0.0.0/0", ip.ip_network("0.0.0.0/0")),
        ("2001:db8::/32", ip.ip_network("2001:db8::/32")),
        ("::/0", ip.ip_network("::/0")),
        ("::1/128", ip.ip_network("::1/128")),
        (None, None),
    ]
    with pg.connect() as conn:
        check_samples(conn, "cidr", cases, expected_arrow=pa.string())


def test_macaddr(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        check_samples(
            conn,
            "macaddr",
            [("08:00:2B:01:02:03", "08:00:2b:01:02:03"), ("0800.2b01.0204", "08:00:2b:01:02:04")],
            expected_arrow=pa.string(),
        )
        check_samples(
            conn,
            "macaddr8",
            [("08:00:2b:01:02:03:04:05", "08:00:2b:01:02:03:04:05"), (None, None)],
            expected_arrow=pa.string(),
        )
