"""pgoutput's stream options, and which server versions support which of them.

``StreamOptions`` is what a consumer asks for; ``resolve_options`` checks it against the server's
version, picks the protocol version, and returns the option list that START_REPLICATION (or
``pg_logical_slot_peek_binary_changes``) takes. Unsupported combinations fail here, before
anything reaches the server, with an error that names the option, the server version and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from pgcdc.replication.errors import UnsupportedOptionError

__all__ = [
    "Origin",
    "ResolvedOptions",
    "StreamOptions",
    "StreamingMode",
    "max_proto_version",
    "quote_publication_names",
    "resolve_options",
]

StreamingMode: TypeAlias = Literal["off", "on", "parallel"]
Origin: TypeAlias = Literal["any", "none"]

_STREAMING_MODES = ("off", "on", "parallel")
_ORIGINS = ("any", "none")


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """START_REPLICATION / pgoutput options.

    ``proto_version`` None means the highest the server supports (4 on PostgreSQL 16 and later,
    3 on 15). ``streaming`` ``"parallel"`` needs PostgreSQL 16+ and protocol 4; ``origin`` needs
    PostgreSQL 16+; ``two_phase`` needs protocol 3 (PostgreSQL 15+).
    """

    publication_names: tuple[str, ...]
    proto_version: int | None = None
    binary: bool = False
    messages: bool = False
    streaming: StreamingMode = "off"
    two_phase: bool = False
    origin: Origin | None = None

    def __post_init__(self) -> None:
        given: object = self.publication_names
        if isinstance(given, str):
            raise TypeError(
                f"publication_names must be a tuple of names, not the string {given!r}; "
                f"write publication_names=({given!r},)"
            )
        names = tuple(self.publication_names)
        object.__setattr__(self, "publication_names", names)
        if not names:
            raise ValueError("publication_names is empty: name at least one publication")
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"publication name {name!r} must be a non-empty string")
            if "\0" in name:
                raise ValueError(f"publication name {name!r} contains a NUL character")
        if self.proto_version is not None and (
            isinstance(self.proto_version, bool)
            or not isinstance(self.proto_version, int)
            or not 1 <= self.proto_version <= 4
        ):
            raise ValueError(
                f"proto_version must be 1, 2, 3 or 4 (or None for the server's highest), "
                f"not {self.proto_version!r}"
            )
        if self.streaming not in _STREAMING_MODES:
            raise ValueError(
                f"streaming must be one of {', '.join(_STREAMING_MODES)}, not {self.streaming!r}"
            )
        if self.origin is not None and self.origin not in _ORIGINS:
            raise ValueError(f"origin must be 'any', 'none' or None, not {self.origin!r}")


@dataclass(frozen=True, slots=True)
class ResolvedOptions:
    """The options as they go to the server: the protocol version and the key/value pairs."""

    proto_version: int
    pairs: tuple[tuple[str, str], ...]

    def flat(self) -> list[str]:
        """``[key1, value1, key2, value2, ...]``, the SQL interface's VARIADIC options."""
        return [item for pair in self.pairs for item in pair]


def max_proto_version(server_version: int) -> int:
    """The highest pgoutput protocol version a server (``server_version_num``) speaks."""
    major = server_version // 10000
    if major >= 16:
        return 4
    if major >= 15:
        return 3
    if major >= 14:
        return 2
    return 1


def quote_publication_names(names: Iterable[str]) -> str:
    """The ``publication_names`` option value: a comma-separated list of quoted identifiers.

    pgoutput splits the value with ``SplitIdentifierString``, which folds unquoted names to lower
    case and breaks on commas, so every name is double-quoted (inner quotes doubled).
    """
    return ",".join('"' + name.replace('"', '""') + '"' for name in names)


def _version_text(server_version: int) -> str:
    return f"PostgreSQL {server_version // 10000} (server_version_num {server_version})"


def resolve_options(options: StreamOptions, server_version: int) -> ResolvedOptions:
    """Check ``options`` against the server and return what to send it."""
    major = server_version // 10000
    server = _version_text(server_version)
    highest = max_proto_version(server_version)
    proto = options.proto_version
    if proto is None:
        proto = highest
    elif proto > highest:
        raise UnsupportedOptionError(
            f"proto_version {proto} is not supported by {server}, which speaks pgoutput "
            f"protocol versions 1 to {highest}",
            f"leave proto_version unset to use the highest the server supports, or pass "
            f"proto_version={highest}",
        )
    if major < 14 and (options.binary or options.messages):
        raise UnsupportedOptionError(
            f"the binary and messages options need PostgreSQL 14 or later; {server} lacks them",
            "turn them off or upgrade the server",
        )
    if options.streaming != "off" and proto < 2:
        raise UnsupportedOptionError(
            f"streaming={options.streaming!r} needs protocol version 2 or later, "
            f"but proto_version is {proto}",
            "raise proto_version or set streaming='off'",
        )
    if options.streaming == "parallel":
        if major < 16:
            raise UnsupportedOptionError(
                f"streaming='parallel' needs PostgreSQL 16 or later; {server} only has "
                "streaming 'on' and 'off'",
                "use streaming='on' on this server",
            )
        if proto < 4:
            raise UnsupportedOptionError(
                f"streaming='parallel' needs protocol version 4, but proto_version is {proto}",
                "pass proto_version=4 (or leave it unset), or use streaming='on'",
            )
    if options.two_phase and proto < 3:
        raise UnsupportedOptionError(
            f"two_phase needs protocol version 3 or later (PostgreSQL 15+), "
            f"but proto_version is {proto} on {server}",
            "raise proto_version to 3 or more, or set two_phase=False",
        )
    if options.origin is not None and major < 16:
        raise UnsupportedOptionError(
            f"the origin option needs PostgreSQL 16 or later; {server} lacks it",
            "leave origin unset (None) on this server",
        )
    pairs: list[tuple[str, str]] = [
        ("proto_version", str(proto)),
        ("publication_names", quote_publication_names(options.publication_names)),
    ]
    if options.binary:
        pairs.append(("binary", "true"))
    if options.messages:
        pairs.append(("messages", "true"))
    if options.streaming != "off":
        pairs.append(("streaming", options.streaming))
    if options.two_phase:
        pairs.append(("two_phase", "true"))
    if options.origin is not None:
        pairs.append(("origin", options.origin))
    return ResolvedOptions(proto, tuple(pairs))
