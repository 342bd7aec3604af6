"""PostgreSQL ``numeric`` arithmetic on ``decimal.Decimal`` values, with the server's scales.

A numeric value is a Decimal whose exponent is the negated display scale (``Decimal('1.50')``
has scale 2), or NaN, or +-Infinity. All arithmetic is exact integer arithmetic on
(unscaled, scale) pairs, so no Decimal context precision is involved: addition and subtraction
keep the larger scale, multiplication adds the scales, division picks its scale with
select_div_scale (at least 16 significant digits, never less than either input's scale) and
rounds half away from zero, as numeric.c does. NaN equals NaN and sorts above everything.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

from pgcdc.filters.errors import FilterEvaluationError

__all__ = [
    "NAN",
    "NEG_INF",
    "POS_INF",
    "add",
    "apply_typmod",
    "ceil",
    "compare",
    "div",
    "div_trunc",
    "floor",
    "from_float",
    "from_int",
    "mod",
    "mul",
    "neg",
    "parse",
    "round_to",
    "scale_of",
    "sign",
    "sub",
    "to_float",
    "to_int",
    "trunc_to",
]

NAN = Decimal("NaN")
POS_INF = Decimal("Infinity")
NEG_INF = Decimal("-Infinity")

NUMERIC_MIN_SIG_DIGITS = 16
NUMERIC_MAX_DISPLAY_SCALE = 1000
NUMERIC_MAX_RESULT_SCALE = 2000
NUMERIC_DSCALE_MAX = 0x3FFF
_MAX_WEIGHT_DIGITS = 131072  # digits before the decimal point (NUMERIC_WEIGHT_MAX + 1) * 4


def _error(message: str, sqlstate: str, detail: str | None = None) -> FilterEvaluationError:
    return FilterEvaluationError(message, sqlstate=sqlstate, detail=detail)


def _p10(n: int) -> int:
    """10**n for n >= 0, typed as int."""
    result: int = 10**n
    return result


def division_by_zero() -> FilterEvaluationError:
    return _error("division by zero", "22012")


def scale_of(value: Decimal) -> int:
    """The display scale of a finite value."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    return max(0, -exponent)


def _parts(value: Decimal) -> tuple[int, int]:
    """(unscaled integer, scale) of a finite value."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    unscaled = int("".join(map(str, digits)) or "0")
    if exponent > 0:
        unscaled *= _p10(exponent)
        exponent = 0
    return (-unscaled if sign else unscaled), -exponent


def make(unscaled: int, scale: int) -> Decimal:
    """The value ``unscaled / 10**scale`` with display scale ``scale``."""
    if scale > NUMERIC_DSCALE_MAX:
        raise _error("value overflows numeric format", "22003")
    integer_digits = len(str(abs(unscaled))) - scale
    if unscaled and integer_digits > _MAX_WEIGHT_DIGITS:
        raise _error("value overflows numeric format", "22003")
    if scale == 0:
        return Decimal(unscaled)
    return Decimal(f"{unscaled}E-{scale}")


def from_int(value: int) -> Decimal:
    return Decimal(value)


def parse(text: str) -> Decimal:
    """numeric_in: the value of a numeric literal or input string (None: invalid)."""
    stripped = text.strip(" \t\n\r\f\v")
    lowered = stripped.lower()
    if lowered == "nan":
        return NAN
    if lowered in ("infinity", "+infinity", "inf", "+inf"):
        return POS_INF
    if lowered in ("-infinity", "-inf"):
        return NEG_INF
    if not stripped or not _is_decimal_syntax(stripped):
        raise _error(f'invalid input syntax for type numeric: "{text}"', "22P02")
    try:
        value = Decimal(stripped)
    except InvalidOperation:
        raise _error(f'invalid input syntax for type numeric: "{text}"', "22P02") from None
    unscaled, scale = _parts(value)
    return make(unscaled, scale)


def _is_decimal_syntax(text: str) -> bool:
    i = 0
    if text[0] in "+-":
        i = 1
    digits = 0
    while i < len(text) and text[i].isascii() and text[i].isdigit():
        i += 1
        digits += 1
    if i < len(text) and text[i] == ".":
        i += 1
        while i < len(text) and text[i].isascii() and text[i].isdigit():
            i += 1
            digits += 1
    if digits == 0:
        return False
    if i < len(text) and text[i] in "eE":
        i += 1
        if i < len(text) and text[i] in "+-":
            i += 1
        start = i
        while i < len(text) and text[i].isascii() and text[i].isdigit():
            i += 1
        if i == start:
            return False
    return i == len(text)


def compare(a: Decimal, b: Decimal) -> int:
    """cmp_numerics: NaN equals NaN and sorts above everything, infinities as expected."""
    if a.is_nan():
        return 0 if b.is_nan() else 1
    if b.is_nan():
        return -1
    if a < b:
        return -1
    return 1 if a > b else 0


def neg(a: Decimal) -> Decimal:
    if a.is_nan():
        return a
    if a.is_infinite():
        return NEG_INF if a > 0 else POS_INF
    unscaled, scale = _parts(a)
    return make(-unscaled, scale)


def sign(a: Decimal) -> Decimal:
    if a.is_nan():
        return a
    if a.is_infinite():
        return Decimal(1 if a > 0 else -1)
    unscaled, _ = _parts(a)
    return Decimal((unscaled > 0) - (unscaled < 0))


def abs_(a: Decimal) -> Decimal:
    if a.is_nan():
        return a
    if a.is_infinite():
        return POS_INF
    unscaled, scale = _parts(a)
    return make(abs(unscaled), scale)


def add(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan():
        return NAN
    if a.is_infinite() or b.is_infinite():
        if a.is_infinite() and b.is_infinite() and (a > 0) != (b > 0):
            return NAN
        return a if a.is_infinite() else b
    ua, sa = _parts(a)
    ub, sb = _parts(b)
    scale = max(sa, sb)
    return make(ua * _p10(scale - sa) + ub * _p10(scale - sb), scale)


def sub(a: Decimal, b: Decimal) -> Decimal:
    return add(a, neg(b))


def mul(a: Decimal, b: Decimal) -> Decimal:
    if a.is_nan() or b.is_nan():
        return NAN
    if a.is_infinite() or b.is_infinite():
        sa_, sb_ = compare(a, Decimal(0)), compare(b, Decimal(0))
        if sa_ == 0 or sb_ == 0:
            return NAN
        return POS_INF if sa_ == sb_ else NEG_INF
    ua, sa = _parts(a)
    ub, sb = _parts(b)
    scale = sa + sb
    product = ua * ub
    if scale > NUMERIC_DSCALE_MAX:
        product = _round_div(product, _p10(scale - NUMERIC_DSCALE_MAX))
        scale = NUMERIC_DSCALE_MAX
    return make(product, scale)


def _round_div(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded half away from zero (denominator > 0)."""
    q, r = divmod(abs(numerator), denominator)
    if 2 * r >= denominator:
        q += 1
    return -q if numerator < 0 else q


def _weight_firstdigit(unscaled: int, scale: int) -> tuple[int, int]:
    """The base-10000 weight and leading digit of |unscaled| / 10**scale (0, 0 for zero)."""
    if unscaled == 0:
        return 0, 0
    magnitude = abs(unscaled)
    # shift so the decimal point sits on a base-10000 digit boundary
    pad = (-scale) % 4
    magnitude *= _p10(pad)
    frac_groups = (scale + pad) // 4
    digits = len(str(magnitude))
    groups = (digits + 3) // 4
    weight = groups - 1 - frac_groups
    first = magnitude // _p10(4 * (groups - 1))
    return weight, first


def select_div_scale(ua: int, sa: int, ub: int, sb: int) -> int:
    """numeric.c's select_div_scale."""
    w1, f1 = _weight_firstdigit(ua, sa)
    w2, f2 = _weight_firstdigit(ub, sb)
    qweight = w1 - w2
    if f1 <= f2:
        qweight -= 1
    rscale = NUMERIC_MIN_SIG_DIGITS - qweight * 4
    rscale = max(rscale, sa, sb, 0)
    return min(rscale, NUMERIC_MAX_DISPLAY_SCALE)


def _special_div(a: Decimal, b: Decimal) -> Decimal | None:
    if a.is_nan() or b.is_nan():
        return NAN
    if a.is_infinite():
        if b.is_infinite():
            return NAN
        s = compare(b, Decimal(0))
        if s == 0:
            raise division_by_zero()
        return a if s > 0 else neg(a)
    if b.is_infinite():
        return Decimal(0)
    return None


def div(a: Decimal, b: Decimal) -> Decimal:
    special = _special_div(a, b)
    if special is not None:
        return special
    ua, sa = _parts(a)
    ub, sb = _parts(b)
    if ub == 0:
        raise division_by_zero()
    rscale = select_div_scale(ua, sa, ub, sb)
    # a / b = (ua / 10^sa) / (ub / 10^sb); result unscaled at rscale
    numerator = ua * _p10(sb + rscale)
    denominator = ub * _p10(sa)
    if denominator < 0:
        numerator, denominator = -numerator, -denominator
    return make(_round_div(numerator, denominator), rscale)


def _trunc_quotient(ua: int, sa: int, ub: int, sb: int) -> int:
    """trunc(a / b) as an integer."""
    numerator = ua * _p10(sb)
    denominator = ub * _p10(sa)
    q = abs(numerator) // abs(denominator)
    return q if (numerator < 0) == (denominator < 0) else -q


def div_trunc(a: Decimal, b: Decimal) -> Decimal:
    """div(a, b): the integer quotient, truncated toward zero."""
    if a.is_nan() or b.is_nan():
        return NAN
    if a.is_infinite():
        if b.is_infinite():
            return NAN
        s = compare(b, Decimal(0))
        if s == 0:
            raise division_by_zero()
        return a if s > 0 else neg(a)
    if b.is_infinite():
        return Decimal(0)
    ua, sa = _parts(a)
    ub, sb = _parts(b)
    if ub == 0:
        raise division_by_zero()
    return make(_trunc_quotient(ua, sa, ub, sb), 0)


def mod(a: Decimal, b: Decimal) -> Decimal:
    """a % b: the remainder of the truncated division, with the larger input scale."""
    if a.is_nan() or b.is_nan():
        return NAN
    if a.is_infinite():
        if not b.is_infinite() and compare(b, Decimal(0)) == 0:
            raise division_by_zero()
        return NAN
    if b.is_infinite():
        return a
    ua, sa = _parts(a)
    ub, sb = _parts(b)
    if ub == 0:
        raise division_by_zero()
    q = _trunc_quotient(ua, sa, ub, sb)
    scale = max(sa, sb)
    rem = ua * _p10(scale - sa) - q * ub * _p10(scale - sb)
    return make(rem, scale)


def round_to(a: Decimal, scale: int) -> Decimal:
    """round(a, scale): half away from zero; the result has display scale max(scale, 0)."""
    if a.is_nan() or a.is_infinite():
        return a
    scale = max(min(scale, NUMERIC_MAX_RESULT_SCALE), -NUMERIC_MAX_RESULT_SCALE)
    ua, sa = _parts(a)
    if scale >= sa:
        return make(ua * _p10(scale - sa), scale)
    rounded = _round_div(ua, _p10(sa - scale))
    if scale >= 0:
        return make(rounded, scale)
    return make(rounded * _p10(-scale), 0)


def trunc_to(a: Decimal, scale: int) -> Decimal:
    """trunc(a, scale): toward zero; display scale max(scale, 0)."""
    if a.is_nan() or a.is_infinite():
        return a
    scale = max(min(scale, NUMERIC_MAX_RESULT_SCALE), -NUMERIC_MAX_RESULT_SCALE)
    ua, sa = _parts(a)
    if scale >= sa:
        return make(ua * _p10(scale - sa), scale)
    q = abs(ua) // _p10(sa - scale)
    q = -q if ua < 0 else q
    if scale >= 0:
        return make(q, scale)
    return make(q * _p10(-scale), 0)


def floor(a: Decimal) -> Decimal:
    if a.is_nan() or a.is_infinite():
        return a
    ua, sa = _parts(a)
    return make(ua // _p10(sa), 0)


def ceil(a: Decimal) -> Decimal:
    if a.is_nan() or a.is_infinite():
        return a
    ua, sa = _parts(a)
    return make(-((-ua) // _p10(sa)), 0)


def to_int(a: Decimal, bits: int, type_name: str) -> int:
    """numeric -> int2/int4/int8: rounded half away from zero, range-checked."""
    if a.is_nan():
        raise _error(f"cannot convert NaN to {type_name}", "0A000")
    if a.is_infinite():
        raise _error(f"cannot convert infinity to {type_name}", "0A000")
    ua, sa = _parts(a)
    value = _round_div(ua, _p10(sa))
    limit = 1 << (bits - 1)
    if not -limit <= value < limit:
        raise _error(f"{_INT_RANGE_NAME[bits]} out of range", "22003")
    return value


_INT_RANGE_NAME = {16: "smallint", 32: "integer", 64: "bigint"}


def to_float(a: Decimal) -> float:
    """numeric -> float8 (correctly rounded; NaN and infinities map over)."""
    if a.is_nan():
        return math.nan
    if a.is_infinite():
        return math.inf if a > 0 else -math.inf
    value = float(a)
    if math.isinf(value):
        raise _error(f'"{a}" is out of range for type double precision', "22003")
    return value


def from_float(value: float, digits: int = 15) -> Decimal:
    """float8 -> numeric via ``%.15g`` (``%.6g`` for float4), as float8_numeric does."""
    if math.isnan(value):
        return NAN
    if math.isinf(value):
        return POS_INF if value > 0 else NEG_INF
    return parse(f"{value:.{digits}g}")


def apply_typmod(a: Decimal, typmod: int) -> Decimal:
    """numeric(p, s): round to scale s and check the precision (numeric field overflow)."""
    if typmod < 4 or a.is_nan():
        return a
    packed = typmod - 4
    precision = (packed >> 16) & 0xFFFF
    scale = packed & 0x7FF
    if scale & 0x400:
        scale -= 0x800  # negative scales (PostgreSQL 15+)
    if a.is_infinite():
        raise _error(
            "numeric field overflow",
            "22003",
            f"A field with precision {precision}, scale {scale} cannot hold an infinite value.",
        )
    rounded = round_to(a, scale)
    if scale < 0:
        rounded = make(_parts(rounded)[0], 0)
    unscaled, rscale = _parts(rounded)
    integer_digits = len(str(abs(unscaled))) - rscale if unscaled else 0
    maxdigits = precision - scale
    if integer_digits > maxdigits:
        raise _error(
            "numeric field overflow",
            "22003",
            f"A field with precision {precision}, scale {scale} must round to an absolute "
            f"value less than {'1' if maxdigits == 0 else '10^' + str(maxdigits)}.",
        )
    if scale >= 0:
        return make(unscaled * _p10(scale - rscale), scale)
    return rounded
