"""Generate src/pgcdc/filters/pg_builtins_data.py from real PostgreSQL 15 and 18 servers.

The row filter binder resolves operators, functions and casts exactly as PostgreSQL's parser
does, which needs the built-in catalog rows those rules look at: pg_type (category, preferred),
pg_cast, pg_operator for the operators row filters may use, pg_proc for the functions they may
call plus the names of every mutable function, aggregate and window function.

Usage: ``.venv/bin/python -m tests.filters.gen_pg_builtins`` starts throwaway servers itself (or
pass two DSNs, for 15 and 18). ``tests/filters/test_pg_builtins.py`` checks the module is current.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

TARGET = Path(__file__).resolve().parents[2] / "src/pgcdc/filters/pg_builtins_data.py"
MAJORS = (15, 18)

#: Operators the binder resolves (others are refused as unsupported client-side).
OPERATOR_NAMES = (
    "=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "^", "||",
    "~~", "!~~", "~~*", "!~~*", "@", "|/", "||/",
)  # fmt: skip

#: Functions the binder knows by name: the supported ones and those with mixed volatility.
FUNCTION_NAMES = (
    "abs", "lower", "upper", "length", "char_length", "character_length", "octet_length",
    "bit_length", "substr", "substring", "btrim", "ltrim", "rtrim", "left", "right", "replace",
    "reverse", "repeat", "lpad", "rpad", "strpos", "position", "starts_with", "split_part",
    "translate", "ascii", "chr", "md5", "initcap", "round", "trunc", "floor", "ceil", "ceiling",
    "mod", "sign", "div", "gcd", "lcm", "scale", "min_scale", "trim_scale", "sqrt", "power",
    "date_part", "extract", "date_trunc", "make_date", "isfinite", "like_escape",
    "num_nulls", "num_nonnulls", "bool", "text", "int2", "int4", "int8", "float4", "float8",
    "numeric", "date", "timestamp", "timestamptz", "varchar", "bpchar", "name", "time",
    "timetz", "age", "timezone", "to_timestamp", "overlaps", "quote_literal",
    "quote_nullable", "generate_series", "in_range", "date_add", "date_subtract", "casttoany",
)  # fmt: skip

_IMPL = sql.SQL("""CASE WHEN p.prolang IN (12, 13) THEN p.prosrc
ELSE 'sql:' || p.proname || '(' || pg_catalog.array_to_string(
  ARRAY(SELECT t.typname FROM pg_catalog.unnest(p.proargtypes) WITH ORDINALITY AS a(oid, n)
        JOIN pg_catalog.pg_type t ON t.oid = a.oid ORDER BY a.n), ',') || ')' END""")

TYPES_SQL = """
SELECT t.oid::int, t.typname::text, pg_catalog.format_type(t.oid, NULL), t.typcategory::text,
       t.typispreferred, t.typtype::text, t.typelem::int, t.typarray::int, t.typcollation <> 0
FROM pg_catalog.pg_type t WHERE t.oid < 10000 ORDER BY 1"""

CASTS_SQL = sql.SQL("""
SELECT c.castsource::int, c.casttarget::int, coalesce(({impl}), ''),
       coalesce(p.provolatile::text, ''), coalesce(p.pronargs::int, 0), c.castcontext::text,
       c.castmethod::text
FROM pg_catalog.pg_cast c LEFT JOIN pg_catalog.pg_proc p ON p.oid = c.castfunc
WHERE c.oid < 16384 ORDER BY 1, 2""").format(impl=_IMPL)

OPERATORS_SQL = sql.SQL("""
SELECT o.oprname::text, o.oprkind::text, o.oprleft::int, o.oprright::int, o.oprresult::int,
       ({impl}), p.provolatile::text, p.proisstrict, o.oprcom <> 0
FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode
WHERE o.oprname = ANY(%s) AND o.oid < 16384 ORDER BY 1, 2, 3, 4""").format(impl=_IMPL)

FUNCTIONS_SQL = sql.SQL("""
SELECT p.proname::text, p.proargtypes::int[], p.prorettype::int, p.provolatile::text,
       p.proisstrict, p.provariadic::int, p.pronargdefaults::int, p.prokind::text,
       p.proretset, ({impl})
FROM pg_catalog.pg_proc p
WHERE p.proname = ANY(%s) AND p.oid < 16384 ORDER BY 1, 2, 3""").format(impl=_IMPL)

OPERATOR_NAMES_SQL = """
SELECT DISTINCT o.oprname::text FROM pg_catalog.pg_operator o WHERE o.oid < 16384 ORDER BY 1"""

NAMES_SQL = """
SELECT p.proname::text, bool_and(p.provolatile <> 'i'), bool_or(p.prokind = 'a'),
       bool_or(p.prokind = 'w'), bool_and(p.proretset)
FROM pg_catalog.pg_proc p WHERE p.oid < 16384 GROUP BY 1 ORDER BY 1"""


def fetch(conn: psycopg.Connection[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """The catalog rows of one server."""
    return {
        "types": [tuple(r) for r in conn.execute(TYPES_SQL).fetchall()],
        "casts": [tuple(r) for r in conn.execute(CASTS_SQL).fetchall()],
        "operators": [
            tuple(r) for r in conn.execute(OPERATORS_SQL, (list(OPERATOR_NAMES),)).fetchall()
        ],
        "functions": [
            (*r[:1], tuple(r[1]), *r[2:])
            for r in conn.execute(FUNCTIONS_SQL, (list(FUNCTION_NAMES),)).fetchall()
        ],
        "names": [tuple(r) for r in conn.execute(NAMES_SQL).fetchall()],
        "operator_names": [tuple(r) for r in conn.execute(OPERATOR_NAMES_SQL).fetchall()],
    }


def _merge(per_major: dict[int, list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """Rows tagged with the majors they exist in (an empty tuple: in all of them)."""
    seen: dict[tuple[Any, ...], list[int]] = {}
    for major, rows in sorted(per_major.items()):
        for row in rows:
            seen.setdefault(row, []).append(major)
    everywhere = sorted(per_major)
    return [
        (*row, () if majors == everywhere else tuple(majors))
        for row, majors in sorted(seen.items(), key=lambda kv: repr(kv[0]))
    ]


def _lines(name: str, annotation: str, rows: Iterable[tuple[Any, ...]]) -> list[str]:
    out = [f"{name}: {annotation} = ("]
    out += [f"    {row!r}," for row in rows]
    out.append(")")
    return out


def render(catalogs: dict[int, dict[str, list[tuple[Any, ...]]]]) -> str:
    """The pg_builtins_data.py text for the rows of each major version."""
    merged = {
        key: _merge({m: c[key] for m, c in catalogs.items()})
        for key in ("types", "casts", "operators", "functions")
    }
    operator_names = sorted({r[0] for c in catalogs.values() for r in c["operator_names"]})
    names: dict[str, tuple[bool, bool, bool, bool]] = {}
    for catalog in catalogs.values():
        for proname, mutable, agg, win, srf in catalog["names"]:
            old = names.get(proname, (True, False, False, True))
            names[proname] = (old[0] and mutable, old[1] or agg, old[2] or win, old[3] and srf)
    mutable = sorted(n for n, f in names.items() if f[0] and not (f[1] or f[2] or f[3]))
    aggregates = sorted(n for n, f in names.items() if f[1])
    windows = sorted(n for n, f in names.items() if f[2] and not f[1])
    srfs = sorted(n for n, f in names.items() if f[3] and not (f[1] or f[2]))
    builtin = sorted(names)
    lines = [
        '"""Built-in PostgreSQL catalog rows the row filter binder needs (pg_type, pg_cast,',
        "pg_operator, pg_proc), from PostgreSQL " + " and ".join(map(str, MAJORS)) + ".",
        "",
        "GENERATED by tests/filters/gen_pg_builtins.py. Do not edit; regenerate. The last field of",
        "each row lists the major versions that have it (empty: all of them). Implementation",
        "keys are pg_proc.prosrc for internal and C functions, 'sql:name(argtypes)' otherwise.",
        '"""',
        "",
        "# fmt: off",
        "# ruff: noqa: E501",
        "",
        "Majors = tuple[int, ...]",
        "",
        "#: (oid, typname, format_type, category, preferred, typtype, elem, array, collatable,"
        " majors)",
        *_lines(
            "TYPES",
            "tuple[tuple[int, str, str, str, bool, str, int, int, bool, Majors], ...]",
            merged["types"],
        ),
        "",
        "#: (source, target, implementation, volatility, nargs, context, method, majors)",
        *_lines(
            "CASTS", "tuple[tuple[int, int, str, str, int, str, str, Majors], ...]", merged["casts"]
        ),
        "",
        "#: (name, kind, left, right, result, implementation, volatility, strict, has commutator,"
        " majors)",
        *_lines(
            "OPERATORS",
            "tuple[tuple[str, str, int, int, int, str, str, bool, bool, Majors], ...]",
            merged["operators"],
        ),
        "",
        "#: (name, argtypes, rettype, volatility, strict, variadic, ndefaults, kind, retset,"
        " implementation, majors)",
        *_lines(
            "FUNCTIONS",
            "tuple[tuple[str, tuple[int, ...], int, str, bool, int, int, str, bool, str, Majors],"
            " ...]",
            merged["functions"],
        ),
        "",
        "#: Functions whose every overload is stable or volatile.",
        f"MUTABLE_FUNCTIONS: frozenset[str] = frozenset({mutable!r})",
        "",
        "#: Aggregate functions.",
        f"AGGREGATE_FUNCTIONS: frozenset[str] = frozenset({aggregates!r})",
        "",
        "#: Window functions.",
        f"WINDOW_FUNCTIONS: frozenset[str] = frozenset({windows!r})",
        "",
        "#: Set-returning functions (every overload returns a set).",
        f"SET_RETURNING_FUNCTIONS: frozenset[str] = frozenset({srfs!r})",
        "",
        "#: The name of every built-in operator.",
        f"BUILTIN_OPERATORS: frozenset[str] = frozenset({operator_names!r})",
        "",
        "#: The name of every built-in function.",
        f"BUILTIN_FUNCTIONS: frozenset[str] = frozenset({builtin!r})",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
    catalogs: dict[int, dict[str, list[tuple[Any, ...]]]] = {}
    if argv:
        for major, dsn in zip(MAJORS, argv, strict=True):
            with psycopg.connect(dsn) as conn:
                catalogs[major] = fetch(conn)
    else:
        from pgcdc.cli.throwaway_server import Cluster

        for major in MAJORS:
            with Cluster(major) as cluster, psycopg.connect(cluster.dsn()) as conn:
                catalogs[major] = fetch(conn)
    TARGET.write_text(render(catalogs))
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main(sys.argv[1:])
