"""The built-in functions and operators row filters can call, keyed by pg_proc.prosrc (the C
function PostgreSQL runs), implemented with the server's semantics: integer overflow and
division by zero raise, floats follow float.c's overflow/underflow checks and NaN ordering,
numeric uses ``pgcdc.filters.numeric``, text comparisons are C-collation (code point) order,
LIKE is a port of like_match.c's MatchText, dates and timestamps use PostgreSQL's integer
representation and calendar routines.

Functions receive non-NULL arguments only when they are strict (the evaluator checks); every
one here is strict. ``IMPLEMENTATIONS`` maps a prosrc to its Python function;
``COLLATION_SENSITIVE`` lists those whose result depends on the collation (ordering, case
mapping), which the binder refuses under collations other than C.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from decimal import Decimal

import numpy as np

from pgcdc.filters import numeric as num
from pgcdc.filters.datums import (
    DATE_END_JULIAN,
    DATEVAL_NOBEGIN,
    DATEVAL_NOEND,
    DT_NOBEGIN,
    DT_NOEND,
    END_TIMESTAMP,
    MIN_TIMESTAMP,
    POSTGRES_EPOCH_JDATE,
    USECS_PER_DAY,
    date2j,
    j2date,
    to_float4,
)
from pgcdc.filters.errors import FilterEvaluationError

__all__ = [
    "COLLATION_SENSITIVE",
    "IMPLEMENTATIONS",
    "UNICODE_CASE_SUFFIX",
    "compare_values",
]

Impl = Callable[..., object]
IMPLEMENTATIONS: dict[str, Impl] = {}

#: prosrc of functions whose result depends on the collation (refused unless it is C or, but for
#: initcap, C.UTF-8).
COLLATION_SENSITIVE = frozenset(
    {
        "text_lt",
        "text_le",
        "text_gt",
        "text_ge",
        "bpcharlt",
        "bpcharle",
        "bpchargt",
        "bpcharge",
        "lower",
        "upper",
        "initcap",
        "texticlike",
        "texticnlike",
        "cmp:text",
        "cmp:bpchar",
    }
)


def _err(message: str, sqlstate: str) -> FilterEvaluationError:
    return FilterEvaluationError(message, sqlstate=sqlstate)


def _register(name: str, fn: Impl) -> None:
    IMPLEMENTATIONS[name] = fn


# -- integers ---------------------------------------------------------------------------------

_INT_RANGE = {2: (-(2**15), 2**15 - 1), 4: (-(2**31), 2**31 - 1), 8: (-(2**63), 2**63 - 1)}
_INT_NAME = {2: "smallint", 4: "integer", 8: "bigint"}


def _check_int(value: int, size: int) -> int:
    lo, hi = _INT_RANGE[size]
    if not lo <= value <= hi:
        raise _err(f"{_INT_NAME[size]} out of range", "22003")
    return value


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - b * _c_div(a, b)


def _int_ops(prefix: str, size: int) -> None:
    """The arithmetic of one integer operator family (int4pl, int48mul, ...)."""

    def pl(a: int, b: int) -> int:
        return _check_int(a + b, size)

    def mi(a: int, b: int) -> int:
        return _check_int(a - b, size)

    def mul(a: int, b: int) -> int:
        return _check_int(a * b, size)

    def div(a: int, b: int) -> int:
        if b == 0:
            raise _err("division by zero", "22012")
        return _check_int(_c_div(a, b), size)

    _register(prefix + "pl", pl)
    _register(prefix + "mi", mi)
    _register(prefix + "mul", mul)
    _register(prefix + "div", div)


def _compare_ops(prefix: str, key: Callable[[object], object] | None = None) -> None:
    """eq/ne/lt/le/gt/ge for a family whose values compare with Python's operators."""
    if key is None:
        _register(prefix + "eq", lambda a, b: a == b)
        _register(prefix + "ne", lambda a, b: a != b)
        _register(prefix + "lt", lambda a, b: a < b)
        _register(prefix + "le", lambda a, b: a <= b)
        _register(prefix + "gt", lambda a, b: a > b)
        _register(prefix + "ge", lambda a, b: a >= b)
        return
    k = key
    _register(prefix + "eq", lambda a, b: k(a) == k(b))
    _register(prefix + "ne", lambda a, b: k(a) != k(b))
    _register(prefix + "lt", lambda a, b: k(a) < k(b))  # type: ignore[operator]
    _register(prefix + "le", lambda a, b: k(a) <= k(b))  # type: ignore[operator]
    _register(prefix + "gt", lambda a, b: k(a) > k(b))  # type: ignore[operator]
    _register(prefix + "ge", lambda a, b: k(a) >= k(b))  # type: ignore[operator]


for _a, _b in ((2, 2), (4, 4), (8, 8), (2, 4), (4, 2), (2, 8), (8, 2), (4, 8), (8, 4)):
    _name = f"int{_a}" if _a == _b else f"int{_a}{_b}"
    _int_ops(_name, max(_a, _b))
    _compare_ops(_name)


def _int_mod(size: int) -> Impl:
    def mod(a: int, b: int) -> int:
        if b == 0:
            raise _err("division by zero", "22012")
        if b == -1:
            return 0
        return _c_mod(a, b)

    return mod


def _int_um(size: int) -> Impl:
    return lambda a: _check_int(-a, size)


def _int_abs(size: int) -> Impl:
    return lambda a: _check_int(abs(a), size)


def _gcd(size: int) -> Impl:
    def gcd(a: int, b: int) -> int:
        return _check_int(math.gcd(a, b), size)

    return gcd


def _lcm(size: int) -> Impl:
    def lcm(a: int, b: int) -> int:
        if a == 0 or b == 0:
            return 0
        return _check_int(abs(a * b) // math.gcd(a, b), size)

    return lcm


for _size in (2, 4, 8):
    _register(f"int{_size}mod", _int_mod(_size))
    _register(f"int{_size}um", _int_um(_size))
    _register(f"int{_size}up", lambda a: a)
    _register(f"int{_size}abs", _int_abs(_size))
for _size in (4, 8):
    _register(f"int{_size}gcd", _gcd(_size))
    _register(f"int{_size}lcm", _lcm(_size))


def _narrow(size: int) -> Impl:
    return lambda a: _check_int(a, size)


_register("i2toi4", lambda a: a)
_register("int28", lambda a: a)
_register("int48", lambda a: a)
_register("i4toi2", _narrow(2))
_register("int82", _narrow(2))
_register("int84", _narrow(4))
_register("int4_bool", lambda a: a != 0)
_register("bool_int4", lambda a: 1 if a else 0)

# -- floats -----------------------------------------------------------------------------------


def _overflow() -> FilterEvaluationError:
    return _err("value out of range: overflow", "22003")


def _underflow() -> FilterEvaluationError:
    return _err("value out of range: underflow", "22003")


def float_cmp(a: float, b: float) -> int:
    """float8_cmp_internal: NaN equals NaN and sorts above every other value."""
    if math.isnan(a):
        return 0 if math.isnan(b) else 1
    if math.isnan(b):
        return -1
    return (a > b) - (a < b)


def _float_ops(prefix: str, single: bool) -> None:
    """pl/mi/mul/div and comparisons; ``single``: the result is real (float4)."""

    def fix(x: float) -> float:
        return to_float4(x) if single else x

    def pl(a: float, b: float) -> float:
        r = fix(a + b)
        if math.isinf(r) and not math.isinf(a) and not math.isinf(b):
            raise _overflow()
        return r

    def mi(a: float, b: float) -> float:
        r = fix(a - b)
        if math.isinf(r) and not math.isinf(a) and not math.isinf(b):
            raise _overflow()
        return r

    def mul(a: float, b: float) -> float:
        if (math.isinf(a) and b == 0) or (math.isinf(b) and a == 0):
            return math.nan
        r = fix(a * b)
        if math.isinf(r) and not math.isinf(a) and not math.isinf(b):
            raise _overflow()
        if r == 0.0 and a != 0.0 and b != 0.0:
            raise _underflow()
        return r

    def div(a: float, b: float) -> float:
        if b == 0.0 and not math.isnan(a):
            raise _err("division by zero", "22012")
        if math.isnan(a) or math.isnan(b):
            return math.nan
        if b == 0.0:
            return math.nan
        if math.isinf(a) and math.isinf(b):
            return math.nan
        r = fix(a / b)
        if math.isinf(r) and not math.isinf(a):
            raise _overflow()
        if r == 0.0 and a != 0.0 and not math.isinf(b):
            raise _underflow()
        return r

    _register(prefix + "pl", pl)
    _register(prefix + "mi", mi)
    _register(prefix + "mul", mul)
    _register(prefix + "div", div)
    _register(prefix + "eq", lambda a, b: float_cmp(a, b) == 0)
    _register(prefix + "ne", lambda a, b: float_cmp(a, b) != 0)
    _register(prefix + "lt", lambda a, b: float_cmp(a, b) < 0)
    _register(prefix + "le", lambda a, b: float_cmp(a, b) <= 0)
    _register(prefix + "gt", lambda a, b: float_cmp(a, b) > 0)
    _register(prefix + "ge", lambda a, b: float_cmp(a, b) >= 0)


_float_ops("float4", single=True)
_float_ops("float8", single=False)
_float_ops("float48", single=False)
_float_ops("float84", single=False)
_register("float4um", lambda a: -a)
_register("float8um", lambda a: -a)
_register("float4up", lambda a: a)
_register("float8up", lambda a: a)
_register("float4abs", abs)
_register("float8abs", abs)


def _rint(x: float) -> float:
    if math.isnan(x) or math.isinf(x):
        return x
    return float(round(x))


def _dtrunc(x: float) -> float:
    if math.isnan(x) or math.isinf(x):
        return x
    return float(math.trunc(x))


def _dfloor(x: float) -> float:
    return x if math.isnan(x) or math.isinf(x) else float(math.floor(x))


def _dceil(x: float) -> float:
    return x if math.isnan(x) or math.isinf(x) else float(math.ceil(x))


def _dsign(x: float) -> float:
    if math.isnan(x):
        return x
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


_register("dround", _rint)
_register("dtrunc", _dtrunc)
_register("dfloor", _dfloor)
_register("dceil", _dceil)
_register("dsign", _dsign)


def _dsqrt(x: float) -> float:
    if x < 0:
        raise _err("cannot take square root of a negative number", "2201F")
    return math.sqrt(x)


_register("dsqrt", _dsqrt)


def _dpow(x: float, y: float) -> float:
    """float.c's dpow."""
    if math.isnan(x):
        return 1.0 if (not math.isnan(y) and y == 0.0) else math.nan
    if math.isnan(y):
        return 1.0 if x == 1.0 else math.nan
    if x == 0 and y < 0:
        raise _err("zero raised to a negative power is undefined", "2201F")
    if x < 0 and math.floor(y) != y:
        raise _err(
            "a negative number raised to a non-integer power yields a complex result", "2201F"
        )
    if math.isinf(y):
        ax = abs(x)
        if ax == 1.0:
            return 1.0
        if y > 0:
            return y if ax > 1.0 else 0.0
        return 0.0 if ax > 1.0 else -y
    if math.isinf(x):
        if y == 0.0:
            return 1.0
        if x > 0:
            return x if y > 0 else 0.0
        odd = y == math.floor(y) and (0.5 * y) != math.floor(0.5 * y)
        if y > 0:
            return x if odd else -x
        return -0.0 if odd else 0.0
    try:
        result = math.pow(x, y)
    except OverflowError:
        raise _overflow() from None
    if math.isinf(result):
        raise _overflow()
    if result == 0.0 and x != 0.0:
        raise _underflow()
    return result


_register("dpow", _dpow)


def _float_to_int(size: int) -> Impl:
    lo = _INT_RANGE[size][0]

    def convert(x: float) -> int:
        r = _rint(x)
        if math.isnan(r) or not (lo <= r < -float(lo)):
            raise _err(f"{_INT_NAME[size]} out of range", "22003")
        return int(r)

    return convert


for _size, _suffix in ((2, "2"), (4, "4"), (8, "8")):
    _register(f"dtoi{_suffix}", _float_to_int(_size))
    _register(f"ftoi{_suffix}", _float_to_int(_size))


def _int_to_float4(a: int) -> float:
    return float(np.float32(np.int64(a)))


_register("i2tod", float)
_register("i4tod", float)
_register("i8tod", float)
_register("i2tof", _int_to_float4)
_register("i4tof", _int_to_float4)
_register("i8tof", _int_to_float4)
_register("ftod", lambda a: a)


def _dtof(x: float) -> float:
    r = to_float4(x)
    if math.isinf(r) and not math.isinf(x):
        raise _overflow()
    if r == 0.0 and x != 0.0:
        raise _underflow()
    return r


_register("dtof", _dtof)

# -- numeric ----------------------------------------------------------------------------------

_register("numeric_add", num.add)
_register("numeric_sub", num.sub)
_register("numeric_mul", num.mul)
_register("numeric_div", num.div)
_register("numeric_mod", num.mod)
_register("numeric_div_trunc", num.div_trunc)
_register("numeric_uminus", num.neg)
_register("numeric_uplus", lambda a: a)
_register("numeric_abs", num.abs_)
_register("numeric_sign", num.sign)
_register("numeric_floor", num.floor)
_register("numeric_ceil", num.ceil)
_register("numeric_round", num.round_to)
_register("numeric_trunc", num.trunc_to)
_register("sql:round(numeric)", lambda a: num.round_to(a, 0))
_register("sql:trunc(numeric)", lambda a: num.trunc_to(a, 0))
_register("numeric_eq", lambda a, b: num.compare(a, b) == 0)
_register("numeric_ne", lambda a, b: num.compare(a, b) != 0)
_register("numeric_lt", lambda a, b: num.compare(a, b) < 0)
_register("numeric_le", lambda a, b: num.compare(a, b) <= 0)
_register("numeric_gt", lambda a, b: num.compare(a, b) > 0)
_register("numeric_ge", lambda a, b: num.compare(a, b) >= 0)
_register("numeric", num.apply_typmod)


def _numeric_scale(a: Decimal) -> int | None:
    if a.is_nan() or a.is_infinite():
        return None
    return num.scale_of(a)


def _numeric_min_scale(a: Decimal) -> int | None:
    if a.is_nan() or a.is_infinite():
        return None
    normalized = a.normalize()
    exponent = normalized.as_tuple().exponent
    assert isinstance(exponent, int)
    return max(0, -exponent) if normalized != 0 else 0


def _numeric_trim_scale(a: Decimal) -> Decimal:
    if a.is_nan() or a.is_infinite():
        return a
    scale = _numeric_min_scale(a)
    assert scale is not None
    return num.round_to(a, scale)


_register("numeric_scale", _numeric_scale)
_register("numeric_min_scale", _numeric_min_scale)
_register("numeric_trim_scale", _numeric_trim_scale)


def _numeric_gcd(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan() or a.is_infinite() or b.is_infinite():
        return num.NAN
    ua, sa = num._parts(a)
    ub, sb = num._parts(b)
    scale = max(sa, sb)
    g = math.gcd(ua * 10 ** (scale - sa), ub * 10 ** (scale - sb))
    return num.make(g, scale)


def _numeric_lcm(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan() or a.is_infinite() or b.is_infinite():
        return num.NAN
    ua, sa = num._parts(a)
    ub, sb = num._parts(b)
    scale = max(sa, sb)
    x, y = ua * 10 ** (scale - sa), ub * 10 ** (scale - sb)
    if x == 0 or y == 0:
        return num.make(0, scale)
    return num.make(abs(x * y) // math.gcd(x, y), scale)


_register("numeric_gcd", _numeric_gcd)
_register("numeric_lcm", _numeric_lcm)


def _int_to_numeric(a: int) -> Decimal:
    return num.from_int(a)


for _src in ("int2", "int4", "int8"):
    _register(f"{_src}_numeric", _int_to_numeric)
_register("numeric_int2", lambda a: num.to_int(a, 16, "smallint"))
_register("numeric_int4", lambda a: num.to_int(a, 32, "integer"))
_register("numeric_int8", lambda a: num.to_int(a, 64, "bigint"))


def _numeric_float8(a: Decimal) -> float:
    return num.to_float(a)


def _numeric_float4(a: Decimal) -> float:
    if a.is_nan() or a.is_infinite():
        return num.to_float(a)
    value = to_float4(float(a))
    if math.isinf(value) or (value == 0.0 and a != 0):
        raise _err(f'"{a}" is out of range for type real', "22003")
    return value


_register("numeric_float8", _numeric_float8)
_register("numeric_float4", _numeric_float4)
_register("float8_numeric", lambda x: num.from_float(x, 15))
_register("float4_numeric", lambda x: num.from_float(x, 6))

# -- booleans ---------------------------------------------------------------------------------

_compare_ops("bool")
_register("booltext", lambda b: "true" if b else "false")

# -- text -------------------------------------------------------------------------------------


def _bpchar_key(s: object) -> object:
    assert isinstance(s, str)
    return s.rstrip(" ")


# Python compares str by code point, which is UTF-8 byte order: the C collation's order.
_register("texteq", lambda a, b: a == b)
_register("textne", lambda a, b: a != b)
_register("text_lt", lambda a, b: a < b)
_register("text_le", lambda a, b: a <= b)
_register("text_gt", lambda a, b: a > b)
_register("text_ge", lambda a, b: a >= b)
_compare_ops("bpchar", _bpchar_key)
for _suffix in ("eq", "ne", "lt", "le", "gt", "ge"):
    IMPLEMENTATIONS["name" + _suffix] = IMPLEMENTATIONS[
        "texteq" if _suffix == "eq" else "textne" if _suffix == "ne" else f"text_{_suffix}"
    ]
    IMPLEMENTATIONS[f"name{_suffix}text"] = IMPLEMENTATIONS["name" + _suffix]
    IMPLEMENTATIONS[f"text{_suffix}name"] = IMPLEMENTATIONS["name" + _suffix]
_register("textcat", lambda a, b: a + b)


def _ascii_lower(s: str) -> str:
    return s.translate(_LOWER)


def _ascii_upper(s: str) -> str:
    return s.translate(_UPPER)


_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_UPPER = {c: c - 32 for c in range(ord("a"), ord("z") + 1)}

_register("lower", _ascii_lower)
_register("upper", _ascii_upper)
_register("textlen", len)
_register("bpcharlen", lambda s: len(s.rstrip(" ")))
_register("textoctetlen", lambda s: len(s.encode()))
_register("bpcharoctetlen", lambda s: len(s.encode()))
_register("sql:bit_length(text)", lambda s: len(s.encode()) * 8)


def _substr(s: str, start: int, count: int) -> str:
    if count < 0:
        raise _err("negative substring length not allowed", "22011")
    first = max(start, 1)
    end = start + count
    if end < first:
        return ""
    return s[first - 1 : end - 1]


def _substr_no_len(s: str, start: int) -> str:
    return s[max(start, 1) - 1 :]


_register("text_substr", _substr)
_register("text_substr_no_len", _substr_no_len)


def _left(s: str, n: int) -> str:
    if n < 0:
        n = max(len(s) + n, 0)
    return s[:n]


def _right(s: str, n: int) -> str:
    if n < 0:
        return s[min(-n, len(s)) :]
    return s[len(s) - min(n, len(s)) :]


_register("text_left", _left)
_register("text_right", _right)
_register("btrim", lambda s, chars: s.strip(chars) if chars else s)
_register("ltrim", lambda s, chars: s.lstrip(chars) if chars else s)
_register("rtrim", lambda s, chars: s.rstrip(chars) if chars else s)
_register("btrim1", lambda s: s.strip(" "))
_register("ltrim1", lambda s: s.lstrip(" "))
_register("rtrim1", lambda s: s.rstrip(" "))
_register("replace_text", lambda s, old, new: s.replace(old, new) if old else s)
_register("text_reverse", lambda s: s[::-1])

_MAX_TEXT = (1 << 30) - 1


def _repeat(s: str, n: int) -> str:
    if n <= 0 or not s:
        return ""
    if len(s.encode()) * n > _MAX_TEXT:
        raise _err("requested length too large", "54000")
    return s * n


def _pad(left: bool) -> Impl:
    def pad(s: str, length: int, fill: str = " ") -> str:
        length = max(length, 0)
        if len(s) >= length or not fill:
            return s[:length]
        if length * 4 > _MAX_TEXT:
            raise _err("requested length too large", "54000")
        need = length - len(s)
        padding = (fill * (need // len(fill) + 1))[:need]
        return padding + s if left else s + padding

    return pad


_register("repeat", _repeat)
_register("lpad", _pad(True))
_register("rpad", _pad(False))
_register("sql:lpad(text,int4)", _pad(True))
_register("sql:rpad(text,int4)", _pad(False))
_register("textpos", lambda s, sub: s.find(sub) + 1)
_register("text_starts_with", lambda s, prefix: s.startswith(prefix))


def _split_part(s: str, delimiter: str, n: int) -> str:
    if n == 0:
        raise _err("field position must not be zero", "22023")
    if not s:
        return ""
    if not delimiter:
        return s if n in (1, -1) else ""
    parts = s.split(delimiter)
    if n > 0:
        return parts[n - 1] if n <= len(parts) else ""
    return parts[n] if -n <= len(parts) else ""


def _translate(s: str, source: str, target: str) -> str:
    out = []
    for ch in s:
        i = source.find(ch)
        if i < 0:
            out.append(ch)
        elif i < len(target):
            out.append(target[i])
    return "".join(out)


def _chr(code: int) -> str:
    if code < 0:
        raise _err("character number must be positive", "22023")
    if code == 0:
        raise _err("null character not permitted", "54000")
    if code > 0x10FFFF:
        raise _err(f"requested character too large for encoding: {code}", "54000")
    if 0xD800 <= code <= 0xDFFF:
        raise _err(f"requested character not valid for encoding: {code}", "54000")
    return chr(code)


_register("split_part", _split_part)
_register("translate", _translate)
_register("ascii", lambda s: ord(s[0]) if s else 0)
_register("chr", _chr)
_register("md5_text", lambda s: hashlib.md5(s.encode(), usedforsecurity=False).hexdigest())


def _to_name(s: str) -> str:
    raw = s.encode()
    return raw[:63].decode(errors="ignore") if len(raw) > 63 else s


_register("text_name", _to_name)
_register("name_text", lambda s: s)
_register("bpchar_name", lambda s: _to_name(s.rstrip(" ")))
_register("name_bpchar", lambda s: s)


def _varchar_typmod(s: str, typmod: int, explicit: bool) -> str:
    if typmod < 4:
        return s
    maxlen = typmod - 4
    if len(s) <= maxlen:
        return s
    if not explicit and s[maxlen:].strip(" "):
        raise _err(f"value too long for type character varying({maxlen})", "22001")
    return s[:maxlen]


def _bpchar_typmod(s: str, typmod: int, explicit: bool) -> str:
    if typmod < 4:
        return s
    maxlen = typmod - 4
    if len(s) > maxlen:
        if not explicit and s[maxlen:].strip(" "):
            raise _err(f"value too long for type character({maxlen})", "22001")
        return s[:maxlen]
    return s + " " * (maxlen - len(s))


_register("varchar", _varchar_typmod)
_register("bpchar", _bpchar_typmod)


# LIKE (like_match.c)
_LIKE_TRUE, _LIKE_FALSE, _LIKE_ABORT = 1, 0, -1


def _like_end_error() -> FilterEvaluationError:
    return _err("LIKE pattern must not end with escape character", "22025")


def match_text(t: str, p: str) -> int:
    """like_match.c's MatchText on code points ('\\' escapes, '%' and '_' wildcards)."""
    if p == "%":
        return _LIKE_TRUE
    ti, pi = 0, 0
    tlen, plen = len(t), len(p)
    while ti < tlen and pi < plen:
        c = p[pi]
        if c == "\\":
            pi += 1
            if pi >= plen:
                raise _like_end_error()
            if p[pi] != t[ti]:
                return _LIKE_FALSE
        elif c == "%":
            pi += 1
            while pi < plen:
                if p[pi] == "%":
                    pi += 1
                elif p[pi] == "_":
                    if ti >= tlen:
                        return _LIKE_ABORT
                    ti += 1
                    pi += 1
                else:
                    break
            if pi >= plen:
                return _LIKE_TRUE
            if p[pi] == "\\":
                if plen - pi < 2:
                    raise _like_end_error()
                firstpat = p[pi + 1]
            else:
                firstpat = p[pi]
            rest = p[pi:]
            while ti < tlen:
                if t[ti] == firstpat:
                    matched = match_text(t[ti:], rest)
                    if matched != _LIKE_FALSE:
                        return matched
                ti += 1
            return _LIKE_ABORT
        elif c == "_":
            ti += 1
            pi += 1
            continue
        elif c != t[ti]:
            return _LIKE_FALSE
        ti += 1
        pi += 1
    if ti < tlen:
        return _LIKE_FALSE
    while pi < plen and p[pi] == "%":
        pi += 1
    return _LIKE_TRUE if pi >= plen else _LIKE_ABORT


def _like(s: str, pattern: str) -> bool:
    return match_text(s, pattern) == _LIKE_TRUE


def _ilike(s: str, pattern: str) -> bool:
    return match_text(_ascii_lower(s), _ascii_lower(pattern)) == _LIKE_TRUE


def _like_escape(pattern: str, escape: str) -> str:
    if not escape:
        return pattern.replace("\\", "\\\\")
    if len(escape) != 1:
        raise FilterEvaluationError(
            "invalid escape string",
            sqlstate="22025",
            hint="Escape string must be empty or one character.",
        )
    if escape == "\\":
        return pattern
    out = []
    after_escape = False
    for ch in pattern:
        if ch == escape and not after_escape:
            out.append("\\")
            after_escape = True
        elif ch == "\\":
            out.append("\\" if after_escape else "\\\\")
            after_escape = False
        else:
            out.append(ch)
            after_escape = False
    return "".join(out)


_register("textlike", _like)
_register("textnlike", lambda s, p: not _like(s, p))
_register("texticlike", _ilike)
_register("texticnlike", lambda s, p: not _ilike(s, p))


# -- case mapping under C.UTF-8 ---------------------------------------------------------------
# PostgreSQL maps case one code point at a time (towlower_l/towupper_l under glibc's C.UTF-8,
# the simple mappings of UnicodeData.txt under the builtin pg_c_utf8): never the full or
# context-dependent mappings of SpecialCasing.txt that str.lower()/str.upper() apply ('ß' stays
# 'ß' in upper(), 'İ' lowers to 'i', a final 'Σ' to 'σ').

#: IMPLEMENTATIONS[name + UNICODE_CASE_SUFFIX]: the function under C.UTF-8.
UNICODE_CASE_SUFFIX = "@c.utf8"


def _simple_lower_of(c: str) -> str:
    full = c.lower()
    if len(full) == 1:
        return full
    return "i" if c == "\u0130" else c  # İ: the only code point whose full lowering is longer


def _simple_upper_of(c: str) -> str:
    full = c.upper()
    if len(full) == 1:
        return full
    # SpecialCasing's longer uppercase forms: where a simple mapping exists (the Greek letters
    # with ypogegrammeni, ᾳ -> ᾼ) it is the single-code-point titlecase; elsewhere none (ß, ﬀ)
    title = c.title()
    return title if len(title) == 1 else c


class _SimpleCase(dict[int, str]):
    """str.translate table mapping each code point on first sight."""

    def __init__(self, one: Callable[[str], str]) -> None:
        super().__init__()
        self._one = one

    def __missing__(self, code: int) -> str:
        mapped = self[code] = self._one(chr(code))
        return mapped


_SIMPLE_LOWER = _SimpleCase(_simple_lower_of)
_SIMPLE_UPPER = _SimpleCase(_simple_upper_of)


def _unicode_lower(s: str) -> str:
    return s.translate(_SIMPLE_LOWER)


def _unicode_upper(s: str) -> str:
    return s.translate(_SIMPLE_UPPER)


def _unicode_ilike(s: str, pattern: str) -> bool:
    # Generic_Text_IC_like: in a multibyte encoding both sides go through lower() first
    return match_text(_unicode_lower(s), _unicode_lower(pattern)) == _LIKE_TRUE


_register("lower" + UNICODE_CASE_SUFFIX, _unicode_lower)
_register("upper" + UNICODE_CASE_SUFFIX, _unicode_upper)
_register("texticlike" + UNICODE_CASE_SUFFIX, _unicode_ilike)
_register("texticnlike" + UNICODE_CASE_SUFFIX, lambda s, p: not _unicode_ilike(s, p))
_register("namelike", _like)
_register("namenlike", lambda s, p: not _like(s, p))
_register("like_escape", _like_escape)

# -- dates and timestamps -----------------------------------------------------------------------

_UNIX_EPOCH_DAYS = date2j(1970, 1, 1) - POSTGRES_EPOCH_JDATE
_MIN_DATE = -POSTGRES_EPOCH_JDATE
_END_DATE = DATE_END_JULIAN - POSTGRES_EPOCH_JDATE
_TIMESTAMP_END_DAYS = 109203528  # TIMESTAMP_END_JULIAN - POSTGRES_EPOCH_JDATE


def _date_finite(d: int) -> bool:
    return d not in (DATEVAL_NOBEGIN, DATEVAL_NOEND)


def _ts_finite(t: int) -> bool:
    return t not in (DT_NOBEGIN, DT_NOEND)


_compare_ops("date_")
_compare_ops("timestamp_")
_register("date_finite", _date_finite)
_register("timestamp_finite", _ts_finite)


def _date_pli(d: int, days: int) -> int:
    if not _date_finite(d):
        return d
    result = d + days
    if not (-(2**31) <= result < 2**31) or not _MIN_DATE <= result < _END_DATE:
        raise _err("date out of range", "22008")
    return result


_register("date_pli", _date_pli)
_register("date_mii", lambda d, days: _date_pli(d, -days))
_register("sql:integer_pl_date(int4,date)", lambda days, d: _date_pli(d, days))


def _date_mi(a: int, b: int) -> int:
    if not _date_finite(a) or not _date_finite(b):
        raise _err("cannot subtract infinite dates", "22008")
    return a - b


_register("date_mi", _date_mi)


def _date_to_ts_overflow(d: int) -> tuple[int, int]:
    """date2timestamp_opt_overflow: (timestamp, overflow sign)."""
    if d == DATEVAL_NOBEGIN:
        return DT_NOBEGIN, 0
    if d == DATEVAL_NOEND:
        return DT_NOEND, 0
    if d >= _TIMESTAMP_END_DAYS:
        return DT_NOEND, 1
    return d * USECS_PER_DAY, 0


def _date_timestamp(d: int) -> int:
    ts, overflow = _date_to_ts_overflow(d)
    if overflow:
        raise _err("date out of range for timestamp", "22008")
    return ts


def _date_cmp_timestamp(d: int, t: int) -> int:
    ts, overflow = _date_to_ts_overflow(d)
    if overflow > 0:
        return -1 if t == DT_NOEND else 1
    return (ts > t) - (ts < t)


def _date_vs_timestamp(test: Callable[[int], bool]) -> tuple[Impl, Impl]:
    def date_first(d: int, t: int) -> bool:
        return test(_date_cmp_timestamp(d, t))

    def timestamp_first(t: int, d: int) -> bool:
        return test(-_date_cmp_timestamp(d, t))

    return date_first, timestamp_first


for _suffix, _test in (
    ("eq", lambda c: c == 0),
    ("ne", lambda c: c != 0),
    ("lt", lambda c: c < 0),
    ("le", lambda c: c <= 0),
    ("gt", lambda c: c > 0),
    ("ge", lambda c: c >= 0),
):
    _date_first, _timestamp_first = _date_vs_timestamp(_test)
    IMPLEMENTATIONS[f"date_{_suffix}_timestamp"] = _date_first
    IMPLEMENTATIONS[f"timestamp_{_suffix}_date"] = _timestamp_first

_register("date_timestamp", _date_timestamp)


def _timestamp_date(t: int) -> int:
    if t == DT_NOBEGIN:
        return DATEVAL_NOBEGIN
    if t == DT_NOEND:
        return DATEVAL_NOEND
    return t // USECS_PER_DAY


_register("timestamp_date", _timestamp_date)

_SCALES = [1_000_000, 100_000, 10_000, 1_000, 100, 10, 1]


def _timestamp_scale(t: int, typmod: int) -> int:
    if not _ts_finite(t) or typmod < 0 or typmod > 6:
        return t
    scale = _SCALES[typmod]
    offset = scale // 2
    result = ((t + offset) // scale) * scale if t >= 0 else -((((-t) + offset) // scale) * scale)
    if not MIN_TIMESTAMP <= result < END_TIMESTAMP:
        raise _err("timestamp out of range", "22008")
    return result


_register("timestamp_scale", _timestamp_scale)


def _make_date(year: int, month: int, day: int) -> int:
    shown = f"{year}-{month:02d}-{day:02d}"
    bc = year < 0
    y = -year if bc else year
    if y == 0:
        raise _err(f"date field value out of range: {shown}", "22008")
    astro = 1 - y if bc else y
    leap = astro % 4 == 0 and (astro % 100 != 0 or astro % 400 == 0)
    month_days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    if not 1 <= month <= 12 or not 1 <= day <= month_days[month - 1]:
        raise _err(f"date field value out of range: {shown}", "22008")
    days = date2j(astro, month, day) - POSTGRES_EPOCH_JDATE
    if not _MIN_DATE <= days < _END_DATE:
        raise _err(f"date out of range: {shown}", "22008")
    return days


_register("make_date", _make_date)


def _j2day(jd: int) -> int:
    return (jd + 1) % 7


def _iso_week_start(year: int) -> int:
    day4 = date2j(year, 1, 4)
    return day4 - _j2day(day4 - 1)


def _date2isoweek(year: int, month: int, day: int) -> int:
    dayn = date2j(year, month, day)
    start = _iso_week_start(year)
    if dayn < start:
        start = _iso_week_start(year - 1)
    result = (dayn - start) // 7 + 1
    if result >= 52:
        nxt = _iso_week_start(year + 1)
        if dayn >= nxt:
            result = (dayn - nxt) // 7 + 1
    return result


def _date2isoyear(year: int, month: int, day: int) -> int:
    dayn = date2j(year, month, day)
    start = _iso_week_start(year)
    if dayn < start:
        start = _iso_week_start(year - 1)
        year -= 1
    result = (dayn - start) // 7 + 1
    if result >= 52 and dayn >= _iso_week_start(year + 1):
        year += 1
    return year


#: DecodeUnits/DecodeSpecial spellings: unit -> canonical field.
_UNITS = {
    **dict.fromkeys(("microsecond", "microseconds", "us", "usec", "usecs"), "microseconds"),
    **dict.fromkeys(
        ("millisecond", "milliseconds", "ms", "msec", "msecs", "millisecon"), "milliseconds"
    ),
    **dict.fromkeys(("second", "seconds", "s", "sec", "secs"), "second"),
    **dict.fromkeys(("minute", "minutes", "m", "min", "mins"), "minute"),
    **dict.fromkeys(("hour", "hours", "h", "hr", "hrs"), "hour"),
    **dict.fromkeys(("day", "days", "d"), "day"),
    **dict.fromkeys(("week", "weeks", "w"), "week"),
    **dict.fromkeys(("month", "months", "mon", "mons"), "month"),
    **dict.fromkeys(("quarter", "qtr"), "quarter"),
    **dict.fromkeys(("year", "years", "y", "yr", "yrs"), "year"),
    **dict.fromkeys(("decade", "decades", "dec", "decs"), "decade"),
    **dict.fromkeys(("century", "centuries", "c", "cent"), "century"),
    **dict.fromkeys(("millennium", "millennia", "mil", "mils"), "millennium"),
    **dict.fromkeys(("julian", "j", "jd"), "julian"),
    "isoyear": "isoyear",
    "dow": "dow",
    "isodow": "isodow",
    "doy": "doy",
    "epoch": "epoch",
}
_MONOTONIC = frozenset({"year", "decade", "century", "millennium", "julian", "isoyear", "epoch"})
_TIMESTAMP_ONLY = frozenset({"microseconds", "milliseconds", "second", "minute", "hour"})
_KNOWN_UNSUPPORTED = frozenset(
    {"timezone", "timezone_h", "timezone_m", "tz", "tz_hour", "tz_minute"}
)


def _unit(text: str, type_name: str) -> str:
    lowered = text.lower()
    unit = _UNITS.get(lowered)
    if unit is None:
        if lowered in _KNOWN_UNSUPPORTED:
            raise _err(f'unit "{lowered}" not supported for type {type_name}', "0A000")
        raise _err(f'unit "{lowered}" not recognized for type {type_name}', "22023")
    return unit


def _year_field(unit: str, year: int) -> int:
    if unit == "year":
        return year if year > 0 else year - 1
    if unit == "decade":
        return year // 10 if year >= 0 else -((8 - (year - 1)) // 10)
    if unit == "century":
        return (year + 99) // 100 if year > 0 else -((99 - (year - 1)) // 100)
    assert unit == "millennium"
    return (year + 999) // 1000 if year > 0 else -((999 - (year - 1)) // 1000)


def _date_fields(unit: str, days: int) -> int:
    year, month, day = j2date(days + POSTGRES_EPOCH_JDATE)
    if unit == "day":
        return day
    if unit == "month":
        return month
    if unit == "quarter":
        return (month - 1) // 3 + 1
    if unit == "week":
        return _date2isoweek(year, month, day)
    if unit in ("year", "decade", "century", "millennium"):
        return _year_field(unit, year)
    if unit == "isoyear":
        iso = _date2isoyear(year, month, day)
        return iso - 1 if iso <= 0 else iso
    if unit in ("dow", "isodow"):
        dow = _j2day(days + POSTGRES_EPOCH_JDATE)
        return 7 if unit == "isodow" and dow == 0 else dow
    assert unit == "doy"
    return date2j(year, month, day) - date2j(year, 1, 1) + 1


def _extract_date(field: str, d: int) -> Decimal | None:
    unit = _unit(field, "date")
    if unit in _TIMESTAMP_ONLY:
        raise _err(f'unit "{field.lower()}" not supported for type date', "0A000")
    if not _date_finite(d):
        if unit in _MONOTONIC:
            return num.NEG_INF if d == DATEVAL_NOBEGIN else num.POS_INF
        return None
    if unit == "julian":
        return Decimal(d + POSTGRES_EPOCH_JDATE)
    if unit == "epoch":
        return Decimal((d - _UNIX_EPOCH_DAYS) * 86400)
    return Decimal(_date_fields(unit, d))


_register("extract_date", _extract_date)


def _timestamp_part(field: str, t: int, as_numeric: bool) -> object:
    unit = _unit(field, "timestamp without time zone")
    if not _ts_finite(t):
        if unit in _MONOTONIC:
            if as_numeric:
                return num.NEG_INF if t == DT_NOBEGIN else num.POS_INF
            return -math.inf if t == DT_NOBEGIN else math.inf
        return None
    days, time_us = divmod(t, USECS_PER_DAY)
    second_us = time_us % 60_000_000
    if unit == "epoch":
        micros = t - _UNIX_EPOCH_DAYS * USECS_PER_DAY
        if as_numeric:
            return num.make(micros, 6)
        return micros / 1_000_000.0
    if unit == "microseconds":
        result: int = second_us
    elif unit == "milliseconds":
        if as_numeric:
            return num.make(second_us, 3)
        return (second_us // 1_000_000) * 1000.0 + (second_us % 1_000_000) / 1000.0
    elif unit == "second":
        if as_numeric:
            return num.make(second_us, 6)
        return second_us // 1_000_000 + (second_us % 1_000_000) / 1_000_000.0
    elif unit == "minute":
        result = (time_us // 60_000_000) % 60
    elif unit == "hour":
        result = time_us // 3_600_000_000
    elif unit == "julian":
        jd = days + POSTGRES_EPOCH_JDATE
        if as_numeric:
            return num.add(Decimal(jd), num.div(Decimal(time_us), Decimal(USECS_PER_DAY)))
        seconds = time_us // 1_000_000
        fsec = time_us % 1_000_000
        return jd + (seconds + fsec / 1_000_000.0) / 86400.0
    else:
        result = _date_fields(unit, days)
    return Decimal(result) if as_numeric else float(result)


_register("extract_timestamp", lambda f, t: _timestamp_part(f, t, True))
_register("timestamp_part", lambda f, t: _timestamp_part(f, t, False))


def _date_part_date(field: str, d: int) -> object:
    return _timestamp_part(field, _date_timestamp(d), False)


_register("sql:date_part(text,date)", _date_part_date)


def _timestamp_trunc(field: str, t: int) -> int:
    unit = _unit(field, "timestamp without time zone")
    if unit in ("dow", "isodow", "doy", "epoch", "julian", "isoyear"):
        raise _err(
            f'unit "{field.lower()}" not supported for type timestamp without time zone',
            "0A000",
        )
    if not _ts_finite(t):
        return t
    days, time_us = divmod(t, USECS_PER_DAY)
    year, month, day = j2date(days + POSTGRES_EPOCH_JDATE)
    hour = time_us // 3_600_000_000
    minute = (time_us // 60_000_000) % 60
    second = (time_us // 1_000_000) % 60
    fsec = time_us % 1_000_000
    if unit == "week":
        woy = _date2isoweek(year, month, day)
        if woy >= 52 and month == 1:
            year -= 1
        if woy <= 1 and month == 12:
            year += 1
        start = _iso_week_start(year)
        result_days = (woy - 1) * 7 + start - POSTGRES_EPOCH_JDATE
        return _checked_timestamp(result_days * USECS_PER_DAY)
    order = [
        "millennium",
        "century",
        "decade",
        "year",
        "quarter",
        "month",
        "day",
        "hour",
        "minute",
        "second",
        "milliseconds",
        "microseconds",
    ]
    level = order.index(unit)
    if unit == "millennium":
        year = (
            ((year + 999) // 1000) * 1000 - 999
            if year > 0
            else -((999 - (year - 1)) // 1000) * 1000 + 1
        )
    elif unit == "century":
        year = (
            ((year + 99) // 100) * 100 - 99 if year > 0 else -((99 - (year - 1)) // 100) * 100 + 1
        )
    elif unit == "decade":
        year = (year // 10) * 10 if year > 0 else -((8 - (year - 1)) // 10) * 10
    if level <= order.index("year"):
        month = 1
    if level <= order.index("quarter"):
        month = 3 * ((month - 1) // 3) + 1
    if level <= order.index("month"):
        day = 1
    if level <= order.index("day"):
        hour = 0
    if level <= order.index("hour"):
        minute = 0
    if level <= order.index("minute"):
        second = 0
    if level <= order.index("second"):
        fsec = 0
    elif unit == "milliseconds":
        fsec = (fsec // 1000) * 1000
    result_days = date2j(year, month, day) - POSTGRES_EPOCH_JDATE
    micros = ((hour * 60 + minute) * 60 + second) * 1_000_000 + fsec
    return _checked_timestamp(result_days * USECS_PER_DAY + micros)


def _checked_timestamp(t: int) -> int:
    if not MIN_TIMESTAMP <= t < END_TIMESTAMP:
        raise _err("timestamp out of range", "22008")
    return t


_register("timestamp_trunc", _timestamp_trunc)

# -- btree comparisons (GREATEST / LEAST) -----------------------------------------------------


def compare_values(kind: str, a: object, b: object) -> int:
    """The btree comparison of two values of a type family (text: C collation)."""
    if kind == "float":
        return float_cmp(a, b)  # type: ignore[arg-type]
    if kind == "numeric":
        return num.compare(a, b)  # type: ignore[arg-type]
    if kind == "bpchar":
        ka, kb = _bpchar_key(a), _bpchar_key(b)
    else:
        ka, kb = a, b
    result: int = (ka > kb) - (ka < kb)  # type: ignore[operator]
    return result


def _comparison(kind: str) -> Impl:
    def compare(a: object, b: object) -> int:
        return compare_values(kind, a, b)

    return compare


for _kind in ("int", "float", "numeric", "text", "bpchar", "bool", "date", "timestamp"):
    IMPLEMENTATIONS["cmp:" + _kind] = _comparison(_kind)
