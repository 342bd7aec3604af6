"""Hypothesis strategies: random row filter expressions over the differential table's columns
(tests/filters/server.py COLUMNS) and random rows for it, with NULLs and edge values.

Expressions are SQL text built from typed productions, so most are well-typed and reach
evaluation; the productions cover the operators, functions and special forms the client
implements, with literals chosen near overflow and rounding boundaries.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal

from hypothesis import strategies as st

Draw = Callable[[st.SearchStrategy[object]], object]

_ALPHABET = "abAB%_\\é ' x"
_INT_EDGES = [0, 1, -1, 2, 7, 10, 46341, 65536, 2147483647, -2147483648, 2147483646, -2147483647]
_BIGINT_EDGES = [
    0,
    1,
    -1,
    3037000500,
    2147483648,
    9223372036854775807,
    -9223372036854775808,
    9223372036854775806,
]
_NUMERIC_TYPES = ("int", "bigint", "numeric", "float")
_COMPARABLE = {
    "int": _NUMERIC_TYPES,
    "bigint": _NUMERIC_TYPES,
    "numeric": _NUMERIC_TYPES,
    "float": _NUMERIC_TYPES,
    "text": ("text",),
    "bool": ("bool",),
    "date": ("date", "timestamp"),
    "timestamp": ("date", "timestamp"),
}
_COLUMN = {
    "int": ["i", "i", "s"],
    "bigint": ["b"],
    "numeric": ["n"],
    "float": ["d", "d", "r"],
    "text": ["t", "v", "c"],
    "bool": ["f"],
    "date": ["dt"],
    "timestamp": ["ts"],
}
_SQL_TYPE = {
    "int": "integer",
    "bigint": "bigint",
    "numeric": "numeric",
    "float": "double precision",
    "text": "text",
    "bool": "boolean",
    "date": "date",
    "timestamp": "timestamp",
}
_DATE_FIELDS = ["year", "month", "day", "dow", "doy", "quarter", "week", "isoyear", "decade",
                "century", "millennium", "epoch", "julian", "isodow"]  # fmt: skip
_TIME_FIELDS = ["hour", "minute", "second", "milliseconds", "microseconds"]
_TRUNC_UNITS = ["microseconds", "milliseconds", "second", "minute", "hour", "day", "week",
                "month", "quarter", "year", "decade", "century", "millennium"]  # fmt: skip


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _draw_text(draw: st.DrawFn, max_size: int = 5) -> str:
    return draw(st.text(alphabet=_ALPHABET, max_size=max_size))


def _int_literal(draw: st.DrawFn, edges: list[int], bits: int) -> str:
    value = draw(
        st.one_of(
            st.integers(-12, 12),
            st.sampled_from(edges),
            st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1),
        )
    )
    return f"({value})" if value < 0 else str(value)


def _numeric_literal(draw: st.DrawFn) -> str:
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.sampled_from(["'NaN'::numeric", "'Infinity'::numeric",
                                     "'-Infinity'::numeric"]))  # fmt: skip
    if choice == 1:
        return draw(st.sampled_from(["1e3", "1.5e-3", "2.50E+2", "99999999999999999999.5"]))
    places = draw(st.integers(0, 6))
    value = draw(st.decimals(min_value=-10000, max_value=10000, places=places, allow_nan=False))
    text = f"{value:f}"
    return f"({text})" if text.startswith("-") else text


def _float_literal(draw: st.DrawFn) -> str:
    value = draw(
        st.one_of(
            st.sampled_from(["'NaN'", "'Infinity'", "'-Infinity'", "'1e308'", "'-0'", "'1e-300'"]),
            st.floats(-1e6, 1e6, allow_nan=False).map(repr),
        )
    )
    return f"{value}::float8" if value.startswith("'") else f"'{value}'::float8"


def _date_text(draw: st.DrawFn) -> str:
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.sampled_from(["infinity", "-infinity", "0044-03-15 BC", "5874897-12-31"]))
    day = draw(st.dates(min_value=date(1, 1, 1), max_value=date(9999, 12, 31)))
    if choice < 4:
        day = draw(st.dates(min_value=date(1999, 12, 1), max_value=date(2024, 3, 31)))
    return day.isoformat()


def _timestamp_text(draw: st.DrawFn) -> str:
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.sampled_from(["infinity", "-infinity", "0044-03-15 12:00:00 BC"]))
    lo = datetime(1999, 12, 1) if choice < 5 else datetime(1, 1, 1)
    hi = datetime(2024, 3, 31) if choice < 5 else datetime(9999, 12, 31)
    value = draw(st.datetimes(min_value=lo, max_value=hi))
    if draw(st.booleans()):
        value -= timedelta(microseconds=value.microsecond)
    return value.isoformat(sep=" ")


class _Expressions:
    """Typed expression productions; ``expr(type, depth)`` draws SQL text of that type."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def pick(self, options: list[str]) -> str:
        return self.draw(st.sampled_from(options))

    def chance(self, p: float) -> bool:
        return self.draw(st.floats(0, 1)) < p

    def expr(self, typ: str, depth: int) -> str:
        if depth <= 0 or self.chance(0.3):
            return self.leaf(typ)
        producer: Callable[[int], str] = getattr(self, "_" + typ)
        return producer(depth - 1)

    def leaf(self, typ: str) -> str:
        if self.chance(0.55):
            return self.pick(_COLUMN[typ])
        if self.chance(0.05):
            return f"CAST(NULL AS {_SQL_TYPE[typ]})"
        d = self.draw
        if typ == "int":
            return _int_literal(d, _INT_EDGES, 32)
        if typ == "bigint":
            return _int_literal(d, _BIGINT_EDGES, 64) + "::bigint"
        if typ == "numeric":
            return _numeric_literal(d)
        if typ == "float":
            return _float_literal(d)
        if typ == "text":
            return _quote(_draw_text(d))
        if typ == "bool":
            return self.pick(["TRUE", "FALSE"])
        if typ == "date":
            text = _date_text(d)
            return self.pick([f"DATE {_quote(text)}", f"{_quote(text)}::date"])
        text = _timestamp_text(d)
        return self.pick([f"TIMESTAMP {_quote(text)}", f"{_quote(text)}::timestamp"])

    # -- per type -------------------------------------------------------------------------------
    def _generic(self, typ: str, depth: int) -> str | None:
        """CASE, COALESCE, NULLIF, GREATEST, LEAST of one type (None: not chosen)."""
        if not self.chance(0.15):
            return None
        kind = self.pick(["case", "coalesce", "nullif", "greatest", "least", "case_simple"])
        a, b = self.expr(typ, depth), self.expr(typ, depth)
        if kind == "case":
            return f"CASE WHEN {self.expr('bool', depth)} THEN {a} ELSE {b} END"
        if kind == "case_simple":
            return f"CASE {self.expr('int', depth)} WHEN 1 THEN {a} WHEN 2 THEN {b} END"
        if kind == "nullif":
            return f"NULLIF({a}, {b})"
        return f"{kind.upper()}({a}, {b})"

    def _int(self, depth: int) -> str:
        generic = self._generic("int", depth)
        if generic is not None:
            return generic
        e = self.expr
        kind = self.draw(st.integers(0, 9))
        if kind <= 3:
            return f"({e('int', depth)} {self.pick(['+', '-', '*', '/', '%'])} {e('int', depth)})"
        if kind == 4:
            return self.pick([f"(- {e('int', depth)})", f"abs({e('int', depth)})",
                              f"mod({e('int', depth)}, {e('int', depth)})"])  # fmt: skip
        if kind == 5:
            return self.pick([f"length({e('text', depth)})", f"strpos({e('text', depth)}, "
                              f"{e('text', depth)})", f"ascii({e('text', depth)})",
                              f"octet_length({e('text', depth)})"])  # fmt: skip
        if kind == 6:
            source = self.pick(["numeric", "float", "bigint"])
            return f"CAST({e(source, depth)} AS integer)"
        if kind == 7:
            return f"({e('date', depth)} - {e('date', depth)})"
        if kind == 8:
            return f"scale({e('numeric', depth)})"
        return f"{e('bool', depth)}::int"

    def _bigint(self, depth: int) -> str:
        generic = self._generic("bigint", depth)
        if generic is not None:
            return generic
        e = self.expr
        kind = self.draw(st.integers(0, 3))
        if kind <= 1:
            left, right = self.pick(["int", "bigint"]), "bigint"
            if self.draw(st.booleans()):
                left, right = right, left
            op = self.pick(["+", "-", "*", "/", "%"])
            return f"({e(left, depth)} {op} {e(right, depth)})"
        if kind == 2:
            return f"({e(self.pick(['int', 'numeric', 'float']), depth)})::bigint"
        return self.pick([f"abs({e('bigint', depth)})", f"(- {e('bigint', depth)})"])

    def _numeric(self, depth: int) -> str:
        generic = self._generic("numeric", depth)
        if generic is not None:
            return generic
        e = self.expr
        kind = self.draw(st.integers(0, 7))
        if kind <= 2:
            left = self.pick(["numeric", "numeric", "int", "bigint"])
            right = self.pick(["numeric", "int"])
            op = self.pick(["+", "-", "*", "/", "%"])
            return f"({e(left, depth)} {op} {e(right, depth)})"
        if kind == 3:
            fn = self.pick(["round", "trunc"])
            if self.draw(st.booleans()):
                return f"{fn}({e('numeric', depth)}, {self.draw(st.integers(-3, 8))})"
            return f"{fn}({e('numeric', depth)})"
        if kind == 4:
            fn = self.pick(["floor", "ceil", "abs", "sign", "trim_scale"])
            return f"{fn}({e('numeric', depth)})"
        if kind == 5:
            return self.pick([f"div({e('numeric', depth)}, {e('numeric', depth)})",
                              f"mod({e('numeric', depth)}, {e('int', depth)})"])  # fmt: skip
        if kind == 6:
            source = self.pick(["int", "bigint", "float"])
            if self.draw(st.booleans()):
                p = self.draw(st.integers(1, 12))
                s = self.draw(st.integers(0, p))
                return f"CAST({e(source, depth)} AS numeric({p}, {s}))"
            return f"({e(source, depth)})::numeric"
        if self.draw(st.booleans()):
            return f"EXTRACT({self.pick(_DATE_FIELDS)} FROM {e('date', depth)})"
        field = self.pick(_DATE_FIELDS + _TIME_FIELDS)
        return f"EXTRACT({field} FROM {e('timestamp', depth)})"

    def _float(self, depth: int) -> str:
        generic = self._generic("float", depth)
        if generic is not None:
            return generic
        e = self.expr
        kind = self.draw(st.integers(0, 5))
        if kind <= 1:
            left = self.pick(["float", "float", "int", "numeric"])
            # one side float8, or the result is not: numeric + int is numeric, whose ^ (below)
            # is numeric_power, which client-side filters refuse
            right = self.pick(["float", "int"]) if left == "float" else "float"
            op = self.pick(["+", "-", "*", "/"])
            return f"({e(left, depth)} {op} {e(right, depth)})"
        if kind == 2:
            fn = self.pick(["round", "trunc", "floor", "ceil", "abs", "sign"])
            return f"{fn}({e('float', depth)})"
        if kind == 3:
            return f"({e(self.pick(['int', 'bigint', 'numeric']), depth)})::float8"
        if kind == 4:
            return f"({e('float', depth)} ^ {self.draw(st.integers(-3, 3))})"
        source = self.pick(["date", "timestamp"])
        fields = _DATE_FIELDS + (_TIME_FIELDS if source == "timestamp" else [])
        return f"date_part({_quote(self.pick(fields))}, {e(source, depth)})"

    def _text(self, depth: int) -> str:
        generic = self._generic("text", depth)
        if generic is not None:
            return generic
        e = self.expr
        t = lambda: e("text", depth)  # noqa: E731
        small = lambda: str(self.draw(st.integers(-3, 6)))  # noqa: E731
        return self.pick(
            [
                f"({t()} || {t()})",
                f"lower({t()})",
                f"upper({t()})",
                f"substr({t()}, {small()})",
                f"substr({t()}, {small()}, {small()})",
                f"SUBSTRING({t()} FROM {small()} FOR {small()})",
                f"left({t()}, {small()})",
                f"right({t()}, {small()})",
                f"btrim({t()})",
                f"TRIM(BOTH {t()} FROM {t()})",
                f"ltrim({t()}, {t()})",
                f"rtrim({t()})",
                f"replace({t()}, {t()}, {t()})",
                f"reverse({t()})",
                f"repeat({t()}, {self.draw(st.integers(-1, 3))})",
                f"lpad({t()}, {small()}, {t()})",
                f"rpad({t()}, {small()})",
                f"split_part({t()}, {t()}, {self.pick(['1', '2', '-1', '0'])})",
                f"translate({t()}, {t()}, {t()})",
                f"md5({t()})",
                f"({e('bool', depth)})::text",
                "v::text",
            ]
        )

    def _date(self, depth: int) -> str:
        generic = self._generic("date", depth)
        if generic is not None:
            return generic
        e = self.expr
        return self.pick(
            [
                f"({e('date', depth)} + {e('int', depth)})",
                f"({e('date', depth)} - {e('int', depth)})",
                f"({e('timestamp', depth)})::date",
                f"make_date({self.draw(st.integers(-3, 2100))}, "
                f"{self.draw(st.integers(0, 13))}, {self.draw(st.integers(0, 32))})",
            ]
        )

    def _timestamp(self, depth: int) -> str:
        generic = self._generic("timestamp", depth)
        if generic is not None:
            return generic
        e = self.expr
        return self.pick(
            [
                f"({e('date', depth)})::timestamp",
                f"date_trunc({_quote(self.pick(_TRUNC_UNITS))}, {e('timestamp', depth)})",
                f"CAST({e('timestamp', depth)} AS timestamp({self.draw(st.integers(0, 6))}))",
            ]
        )

    def _bool(self, depth: int) -> str:
        generic = self._generic("bool", depth)
        if generic is not None:
            return generic
        e = self.expr
        kind = self.draw(st.integers(0, 13))
        if kind <= 3:
            left = self.pick(list(_COMPARABLE))
            right = self.pick(list(_COMPARABLE[left]))
            op = self.pick(["=", "<>", "<", "<=", ">", ">=", "!="])
            rhs = e(right, depth)
            if self.chance(0.15):
                rhs = _quote(self._literal_text(right))
            elif self.chance(0.05):
                rhs = "NULL"
            return f"({e(left, depth)} {op} {rhs})"
        if kind == 4:
            joiner = self.pick([" AND ", " OR "])
            return (
                "("
                + joiner.join(e("bool", depth) for _ in range(self.draw(st.integers(2, 3))))
                + ")"
            )
        if kind == 5:
            return f"(NOT {e('bool', depth)})"
        if kind == 6:
            typ = self.pick(list(_COMPARABLE))
            return f"({e(typ, depth)} IS {self.pick(['', 'NOT '])}NULL)"
        if kind == 7:
            test = self.pick(["TRUE", "FALSE", "UNKNOWN"])
            return f"({e('bool', depth)} IS {self.pick(['', 'NOT '])}{test})"
        if kind == 8:
            left = self.pick(list(_COMPARABLE))
            right = self.pick(list(_COMPARABLE[left]))
            neg = self.pick(["", "NOT "])
            return f"({e(left, depth)} IS {neg}DISTINCT FROM {e(right, depth)})"
        if kind == 9:
            typ = self.pick(list(_COMPARABLE))
            neg = self.pick(["", "NOT "])
            sym = self.pick(["", "SYMMETRIC "])
            lo, hi = e(self.pick(list(_COMPARABLE[typ])), depth), e(typ, depth)
            return f"({e(typ, depth)} {neg}BETWEEN {sym}{lo} AND {hi})"
        if kind == 10:
            typ = self.pick(list(_COMPARABLE))
            items = ", ".join(
                e(self.pick(list(_COMPARABLE[typ])), depth)
                for _ in range(self.draw(st.integers(1, 4)))
            )
            return f"({e(typ, depth)} {self.pick(['', 'NOT '])}IN ({items}))"
        if kind == 11:
            op = self.pick(["LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE"])
            pattern = _quote(self.draw(st.text(alphabet="ab%_\\#Aé", max_size=5)))
            escape = self.pick(["", " ESCAPE '#'", " ESCAPE ''"])
            return f"({e('text', depth)} {op} {pattern}{escape})"
        if kind == 12:
            return self.pick([f"starts_with({e('text', depth)}, {e('text', depth)})",
                              f"isfinite({e('date', depth)})",
                              f"isfinite({e('timestamp', depth)})"])  # fmt: skip
        typ = self.pick(["int", "numeric", "text"])
        items = ", ".join(e(typ, depth) for _ in range(self.draw(st.integers(1, 3))))
        op, quantifier = self.pick(["=", "<>", "<"]), self.pick(["ANY", "ALL"])
        return f"({e(typ, depth)} {op} {quantifier} (ARRAY[{items}]))"

    def _literal_text(self, typ: str) -> str:
        d = self.draw
        if typ in ("int", "bigint"):
            return str(d(st.integers(-100, 100)))
        if typ == "numeric":
            return str(d(st.decimals(-100, 100, places=2, allow_nan=False)))
        if typ == "float":
            return repr(d(st.floats(-100, 100, allow_nan=False)))
        if typ == "text":
            return _draw_text(d)
        if typ == "bool":
            return self.pick(["t", "false", "yes", "0"])
        if typ == "date":
            return _date_text(d)
        return _timestamp_text(d)


_DATES: st.SearchStrategy[str] = st.composite(_date_text)()
_TIMESTAMPS: st.SearchStrategy[str] = st.composite(_timestamp_text)()


@st.composite
def expressions(draw: st.DrawFn, max_depth: int = 3) -> str:
    """A random boolean filter expression over COLUMNS."""
    return _Expressions(draw).expr("bool", draw(st.integers(1, max_depth)))


def _maybe(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), strategy, strategy, strategy)


def _numeric_text(value: Decimal) -> str:
    return f"{value:f}"


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


@st.composite
def rows(draw: st.DrawFn) -> tuple[str | None, ...]:
    """One row of rf_rows, each column as the text the INSERT casts (None: NULL)."""
    i = st.one_of(st.integers(-12, 12), st.sampled_from(_INT_EDGES),
                  st.integers(-(2**31), 2**31 - 1)).map(str)  # fmt: skip
    b = st.one_of(st.integers(-12, 12), st.sampled_from(_BIGINT_EDGES),
                  st.integers(-(2**63), 2**63 - 1)).map(str)  # fmt: skip
    n = st.one_of(
        st.integers(0, 6).flatmap(
            lambda p: st.decimals(-10**6, 10**6, places=p, allow_nan=False)
        ).map(_numeric_text),
        st.sampled_from(["NaN", "Infinity", "-Infinity", "0", "0.000", "1e20"]),
    )  # fmt: skip
    text = st.text(alphabet=_ALPHABET, max_size=6)
    varchar = st.text(alphabet=_ALPHABET, max_size=10)
    boolean = st.sampled_from(["t", "f"])
    d = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, -0.0, 1.5, 1e308, -1e-310, 2.0, 0.1]),
    ).map(_float_text)
    s = st.one_of(st.integers(-12, 12), st.sampled_from([32767, -32768, 181, 182])).map(str)
    r = st.one_of(
        st.floats(width=32, allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, 1.5, 3.4e38, 1e-45, 0.1]),
    ).map(_float_text)
    c = st.text(alphabet=_ALPHABET, max_size=4)
    return tuple(
        draw(_maybe(x))  # type: ignore[arg-type]
        for x in (i, b, n, text, varchar, boolean, d, _DATES, _TIMESTAMPS, s, r, c)
    )
