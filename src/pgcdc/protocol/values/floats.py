"""float4 and float8 values, and PostgreSQL's shortest-exact float output.

Both load as Python float (float4 as the exact float32 value) and map to Arrow float32/float64.
``format_float8``/``format_float4`` print a value the way float8out/float4out do with the default
extra_float_digits = 1: the shortest digits that read back to the same value, exactly as
PostgreSQL's Ryu build picks them (it never accepts the bounds of the rounding interval, so it
sometimes prints one digit more than Python's repr), fixed-point
for decimal exponents -4 <= e < 15 (float4: < 6), otherwise ``d.ddde+XX``; NaN, Infinity,
-Infinity and -0 spelled as PostgreSQL does.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pyarrow as pa

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter
from pgcdc.protocol.values.errors import ConversionError
from pgcdc.protocol.values.numeric import fixed_width_converter

__all__ = ["CONVERTERS", "format_float4", "format_float8"]

_F4 = struct.Struct(">f")
_F8 = struct.Struct(">d")
_NATIVE_F4 = struct.Struct("=f")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


def _special(value: float) -> str | None:
    if math.isnan(value):
        return "NaN"
    if value == math.inf:
        return "Infinity"
    if value == -math.inf:
        return "-Infinity"
    if value == 0.0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    return None


def _log10_pow2(e: int) -> int:
    return (e * 78913) >> 18


def _log10_pow5(e: int) -> int:
    return (e * 732923) >> 20


def _d2d(ieee_mantissa: int, ieee_exponent: int) -> tuple[int, int]:
    """Ryu's d2d as PostgreSQL builds it (src/common/d2s.c, STRICTLY_SHORTEST off: the bounds
    of the rounding interval are never accepted), in exact integer arithmetic.

    Returns (decimal mantissa, decimal exponent).
    """
    if ieee_exponent == 0:
        e2, m2 = 1 - 1023 - 52 - 2, ieee_mantissa
    else:
        e2, m2 = ieee_exponent - 1023 - 52 - 2, (1 << 52) | ieee_mantissa
    mv = 4 * m2
    mm_shift = 1 if ieee_mantissa != 0 or ieee_exponent <= 1 else 0
    mp, mm = mv + 2, mv - 1 - mm_shift
    vr_trailing_zeros = False
    if e2 >= 0:
        q = _log10_pow2(e2) - (1 if e2 > 3 else 0)
        e10 = q
        den = 10**q
        vr, vp, vm = (mv << e2) // den, (mp << e2) // den, (mm << e2) // den
        if q <= 21:
            if mv % 5 == 0:
                vr_trailing_zeros = mv % 5**q == 0
            elif mp % 5**q == 0:
                vp -= 1
    else:
        q = _log10_pow5(-e2) - (1 if -e2 > 1 else 0)
        e10 = q + e2
        factor = 5 ** (-e2 - q)
        vr, vp, vm = (mv * factor) >> q, (mp * factor) >> q, (mm * factor) >> q
        if q <= 1:
            vr_trailing_zeros = True
            vp -= 1
        elif q < 63:
            vr_trailing_zeros = mv & ((1 << (q - 1)) - 1) == 0
    return _shortest(vr, vp, vm, e10, vr_trailing_zeros=vr_trailing_zeros, last_removed=0)


def _f2d(ieee_mantissa: int, ieee_exponent: int) -> tuple[int, int]:
    """Ryu's f2d as PostgreSQL builds it (src/common/f2s.c), in exact integer arithmetic."""
    if ieee_exponent == 0:
        e2, m2 = 1 - 127 - 23 - 2, ieee_mantissa
    else:
        e2, m2 = ieee_exponent - 127 - 23 - 2, (1 << 23) | ieee_mantissa
    mv = 4 * m2
    mm_shift = 1 if ieee_mantissa != 0 or ieee_exponent <= 1 else 0
    mp, mm = mv + 2, mv - 1 - mm_shift
    vr_trailing_zeros = False
    last_removed = 0
    if e2 >= 0:
        q = _log10_pow2(e2)
        e10 = q
        den = 10**q
        vr, vp, vm = (mv << e2) // den, (mp << e2) // den, (mm << e2) // den
        if q != 0 and (vp - 1) // 10 <= vm // 10:
            last_removed = ((mv << e2) // 10 ** (q - 1)) % 10
        if q <= 9:
            if mv % 5 == 0:
                vr_trailing_zeros = mv % 5**q == 0
            elif mp % 5**q == 0:
                vp -= 1
    else:
        q = _log10_pow5(-e2)
        e10 = q + e2
        i = -e2 - q
        vr, vp, vm = (mv * 5**i) >> q, (mp * 5**i) >> q, (mm * 5**i) >> q
        if q != 0 and (vp - 1) // 10 <= vm // 10:
            last_removed = ((mv * 5 ** (i + 1)) >> (q - 1)) % 10
        if q <= 1:
            vr_trailing_zeros = True
            vp -= 1
        elif q < 31:
            vr_trailing_zeros = mv & ((1 << (q - 1)) - 1) == 0
    return _shortest(
        vr, vp, vm, e10, vr_trailing_zeros=vr_trailing_zeros, last_removed=last_removed
    )


def _shortest(
    vr: int, vp: int, vm: int, e10: int, *, vr_trailing_zeros: bool, last_removed: int
) -> tuple[int, int]:
    """Ryu's step 4: drop digits while the interval allows, then round (bounds excluded)."""
    removed = 0
    while vp // 10 > vm // 10:
        vr_trailing_zeros = vr_trailing_zeros and last_removed == 0
        vr, last_removed = divmod(vr, 10)
        vp //= 10
        vm //= 10
        removed += 1
    if vr_trailing_zeros and last_removed == 5 and vr % 2 == 0:
        last_removed = 4  # round half to even when the exact value is ...50..0
    output = vr + (1 if vr == vm or last_removed >= 5 else 0)
    return output, e10 + removed


def _small_int(ieee_mantissa: int, ieee_exponent: int, bias: int, bits: int) -> int | None:
    """d2d_small_int/f2d_small_int: the value when it is an integer below 2**(bits+1)."""
    e2 = ieee_exponent - bias - bits
    if -bits <= e2 <= 0 and ieee_mantissa & ((1 << -e2) - 1) == 0:
        return ((1 << bits) | ieee_mantissa) >> -e2
    return None


def _to_chars(negative: bool, output: int, exponent: int, fixed_below: int) -> str:
    """to_chars of d2s.c/f2s.c: fixed-point for display exponents -4 .. fixed_below - 1."""
    digits = str(output)
    olength = len(digits)
    exp = exponent + olength - 1
    sign = "-" if negative else ""
    if -4 <= exp < fixed_below:
        nexp = exponent + olength
        if nexp <= 0:
            return f"{sign}0.{'0' * -nexp}{digits}"
        if exponent < 0:
            return f"{sign}{digits[:nexp]}.{digits[nexp:]}"
        return f"{sign}{digits}{'0' * exponent}"
    if exponent == 0:
        digits = digits.rstrip("0") or "0"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def format_float8(value: float) -> str:
    """float8out of ``value`` (extra_float_digits = 1): Ryu's shortest exact digits."""
    special = _special(value)
    if special is not None:
        return special
    (bits,) = _U64.unpack(_F8.pack(value))
    mantissa, exponent = bits & ((1 << 52) - 1), (bits >> 52) & 0x7FF
    small = _small_int(mantissa, exponent, 1023, 52)
    output, exp10 = (small, 0) if small is not None else _d2d(mantissa, exponent)
    return _to_chars(value < 0, output, exp10, 15)


def format_float4(value: float) -> str:
    """float4out of the float32 ``value`` (extra_float_digits = 1): shortest exact digits."""
    special = _special(value)
    if special is not None:
        return special
    (bits,) = _U32.unpack(_F4.pack(value))
    mantissa, exponent = bits & ((1 << 23) - 1), (bits >> 23) & 0xFF
    small = _small_int(mantissa, exponent, 127, 23)
    output, exp10 = (small, 0) if small is not None else _f2d(mantissa, exponent)
    return _to_chars(value < 0, output, exp10, 6)


def _to_float32(value: float) -> float:
    try:
        result: float = _NATIVE_F4.unpack(_NATIVE_F4.pack(value))[0]
    except OverflowError:
        raise ConversionError("text float4 value is outside the float4 range") from None
    return result


def _float_converter(name: str, st: struct.Struct, arrow: Any, float4: bool) -> Converter:
    dtype = ">f4" if float4 else ">f8"
    fmt = format_float4 if float4 else format_float8

    def from_text(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConversionError(f"text {name} value is not a number") from None
        return _to_float32(value) if float4 else value

    return fixed_width_converter(name, st, dtype, arrow, from_text=from_text, fmt=fmt)


CONVERTERS: dict[int, Converter] = {
    oids.FLOAT4_OID: _float_converter("float4", _F4, pa.float32(), True),
    oids.FLOAT8_OID: _float_converter("float8", _F8, pa.float64(), False),
}
