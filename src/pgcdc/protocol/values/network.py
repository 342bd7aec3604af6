"""inet, cidr, macaddr and macaddr8 values; Arrow string (the text form) for all of them.

inet loads as ``ipaddress.ip_address`` when it has no netmask (a full-length mask, which inet's
output omits) and ``ipaddress.ip_interface`` otherwise; cidr loads as ``ipaddress.ip_network``.
macaddr/macaddr8 load as their text (``08:00:2b:01:02:03``).

The inet/cidr binary form (inet_send): family byte (2 = IPv4, 3 = IPv6), mask bits, is-cidr
byte, address length, address bytes. ``inet_text`` prints it exactly as network_out does
(PostgreSQL's own IPv6 compression, which writes ``::ffff:1.2.3.4`` and ``::1.2.3.4`` with an
embedded IPv4 part, unlike Python's ``ipaddress``).
"""

from __future__ import annotations

import ipaddress
from typing import TypeAlias

from pgcdc.protocol.values import oids
from pgcdc.protocol.values.converter import Converter, text_converter
from pgcdc.protocol.values.errors import ConversionError

__all__ = ["CONVERTERS", "inet_text", "macaddr_text"]

PGSQL_AF_INET = 2
PGSQL_AF_INET6 = 3

InetValue: TypeAlias = (
    ipaddress.IPv4Address
    | ipaddress.IPv6Address
    | ipaddress.IPv4Interface
    | ipaddress.IPv6Interface
)
CidrValue: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


def _parts(data: bytes) -> tuple[int, int, bool, bytes]:
    if len(data) < 4:
        raise ConversionError("binary inet/cidr value is shorter than its 4-byte header")
    family, bits, is_cidr, nb = data[0], data[1], data[2], data[3]
    addr = data[4:]
    size = 4 if family == PGSQL_AF_INET else 16 if family == PGSQL_AF_INET6 else -1
    if size < 0 or nb != size or len(addr) != size or bits > size * 8:
        raise ConversionError("binary inet/cidr value has an invalid family, length or mask")
    return family, bits, bool(is_cidr), addr


def _ipv6_text(addr: bytes) -> str:
    words = [addr[i] << 8 | addr[i + 1] for i in range(0, 16, 2)]
    best_base, best_len, cur_base, cur_len = -1, 0, -1, 0
    for i, word in enumerate(words):
        if word == 0:
            if cur_base == -1:
                cur_base, cur_len = i, 1
            else:
                cur_len += 1
        elif cur_base != -1:
            if best_base == -1 or cur_len > best_len:
                best_base, best_len = cur_base, cur_len
            cur_base = -1
    if cur_base != -1 and (best_base == -1 or cur_len > best_len):
        best_base, best_len = cur_base, cur_len
    if best_base != -1 and best_len < 2:
        best_base = -1
    out = []
    for i in range(8):
        if best_base != -1 and best_base <= i < best_base + best_len:
            if i == best_base:
                out.append(":")
            continue
        if i != 0:
            out.append(":")
        if (
            i == 6
            and best_base == 0
            and (
                best_len == 6
                or (best_len == 7 and words[7] != 1)
                or (best_len == 5 and words[5] == 0xFFFF)
            )
        ):
            out.append(".".join(str(b) for b in addr[12:]))
            break
        out.append(f"{words[i]:x}")
    if best_base != -1 and best_base + best_len == 8:
        out.append(":")
    return "".join(out)


def inet_text(data: bytes) -> str:
    """network_out of a binary inet or cidr value."""
    family, bits, is_cidr, addr = _parts(data)
    if family == PGSQL_AF_INET:
        text, full = ".".join(str(b) for b in addr), 32
    else:
        text, full = _ipv6_text(addr), 128
    if bits != full or is_cidr:
        text += f"/{bits}"
    return text


def _inet_from_binary(data: bytes) -> InetValue:
    _, bits, _, addr = _parts(data)
    address = ipaddress.ip_address(addr)
    if bits == len(addr) * 8:
        return address
    return ipaddress.ip_interface((address, bits))


def _inet_from_text(text: str) -> InetValue:
    try:
        return ipaddress.ip_interface(text) if "/" in text else ipaddress.ip_address(text)
    except ValueError:
        raise ConversionError("text inet value is not an IP address") from None


def _cidr_from_binary(data: bytes) -> CidrValue:
    _, bits, _, addr = _parts(data)
    try:
        return ipaddress.ip_network((ipaddress.ip_address(addr), bits))
    except ValueError:
        raise ConversionError("binary cidr value has bits set to the right of its mask") from None


def _cidr_from_text(text: str) -> CidrValue:
    try:
        return ipaddress.ip_network(text)
    except ValueError:
        raise ConversionError("text cidr value is not a network address") from None


def macaddr_text(data: bytes) -> str:
    """macaddr_out/macaddr8_out of a binary value: lowercase hex pairs joined by ':'."""
    if len(data) not in (6, 8):
        raise ConversionError(f"binary macaddr value must be 6 or 8 bytes, got {len(data)}")
    return ":".join(f"{b:02x}" for b in data)


def _macaddr6(data: bytes) -> str:
    if len(data) != 6:
        raise ConversionError(f"binary macaddr value must be 6 bytes, got {len(data)}")
    return macaddr_text(data)


def _macaddr8(data: bytes) -> str:
    if len(data) != 8:
        raise ConversionError(f"binary macaddr8 value must be 8 bytes, got {len(data)}")
    return macaddr_text(data)


CONVERTERS: dict[int, Converter] = {
    oids.INET_OID: text_converter("inet", inet_text, _inet_from_text, _inet_from_binary),
    oids.CIDR_OID: text_converter("cidr", inet_text, _cidr_from_text, _cidr_from_binary),
    oids.MACADDR_OID: text_converter("macaddr", _macaddr6),
    oids.MACADDR8_OID: text_converter("macaddr8", _macaddr8),
}
