"""The errors of the replication layer, and how a server's error becomes one of them.

Every failure the session, the slot and publication helpers or the SQL slot reader report is a
``ReplicationError`` subclass whose message says what went wrong, on which server, and what to do
about it. Messages never carry a password: anything that came from a connection string or a
driver passes through ``scrub_secrets`` first.
"""

from __future__ import annotations

import re

from psycopg.conninfo import conninfo_to_dict

from pgcdc.errors import PgcdcError

__all__ = [
    "ConnectionLostError",
    "PublicationExistsError",
    "PublicationNotFoundError",
    "ReconnectGaveUpError",
    "ReplicationError",
    "ReplicationPermissionError",
    "ServerUnreachableError",
    "SlotActiveError",
    "SlotExistsError",
    "SlotInvalidatedError",
    "SlotMismatchError",
    "SlotNotFoundError",
    "UnsupportedOptionError",
    "describe_server",
    "dsn_user",
    "scrub_secrets",
]

# password=secret, password = 'se cret', PASSWORD='it''s', password="x" (libpq takes the double
# quotes literally), and sslpassword (the client key's passphrase): libpq's keyword form
_KEYWORD_PASSWORD = re.compile(
    r"""(?i)((?<![?&])\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)"""
)
# postgresql://user:secret@host/db (URI form)
_URI_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]*)(@)")
# ?password=secret&... inside a URI query string
_QUERY_PASSWORD = re.compile(r"(?i)([?&](?:ssl)?password=)([^&\s]*)")


# libpq's (and psycopg's) complaints about a connection string it cannot read: they quote the
# piece they stumbled on, which may be (part of) the password
CONNINFO_ERROR = re.compile(
    r"(?i)connection info string|connection option|percent-encoded|\bURI\b|unexpected spaces "
    r"found in|invalid dsn"
)
_QUOTED_PIECE = re.compile(r'"[^\n]*"')


def scrub_secrets(text: str) -> str:
    """``text`` with every password of a connection string in it replaced by ``***``, and the
    quoted pieces of a connection string libpq could not read by ``"..."``."""
    if CONNINFO_ERROR.search(text):
        text = _QUOTED_PIECE.sub('"..."', text)
    text = _URI_PASSWORD.sub(r"\1***\3", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    return _KEYWORD_PASSWORD.sub(r"\1***", text)


def describe_server(dsn: str) -> str:
    """A short, password-free name of the server a connection string points at.

    ``"127.0.0.1:5432/app as user cdc"``; the parts the string leaves out are left out.
    """
    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return "the server of the given connection string (which could not be parsed)"
    if any("@" in str(value) for value in params.values()):
        # a URI whose password has a reserved character ('/', '@', ...): libpq split the
        # password into host, port and database
        return "the server of the given connection string (which could not be parsed)"
    host = str(params.get("host") or params.get("hostaddr") or "the default host")
    port = params.get("port")
    where = f"{host}:{port}" if port else host
    db = params.get("dbname")
    user = params.get("user")
    text = where + (f"/{db}" if db else "") + (f" as user {user}" if user else "")
    return scrub_secrets(text)


def dsn_user(dsn: str) -> str | None:
    """The user name a connection string names, if any (None if it cannot be parsed)."""
    try:
        user = conninfo_to_dict(dsn).get("user")
    except Exception:
        return None
    return str(user) if user else None


class ReplicationError(PgcdcError):
    """Base class: a replication session, slot or publication operation failed.

    ``cause`` says what went wrong, ``fix`` what to do about it; the message is both.
    """

    def __init__(self, cause: str, fix: str | None = None) -> None:
        self.cause = scrub_secrets(cause.strip())
        self.fix = scrub_secrets(fix.strip()) if fix else None
        message = self.cause if not self.fix else f"{self.cause}. Fix: {self.fix}"
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.cause, self.fix))


class ServerUnreachableError(ReplicationError):
    """The server could not be reached (refused, unknown host, timed out, shutting down)."""


class ReplicationPermissionError(ReplicationError):
    """The role may not replicate, read the slot, or create or drop the object."""


class SlotNotFoundError(ReplicationError):
    """The replication slot does not exist (in this database)."""


class SlotExistsError(ReplicationError):
    """A replication slot of that name already exists."""


class SlotActiveError(ReplicationError):
    """Another process is streaming from the slot."""


class SlotInvalidatedError(ReplicationError):
    """The slot was invalidated (``wal_status = 'lost'``): the WAL it needed is gone."""


class SlotMismatchError(ReplicationError):
    """The slot exists but cannot serve this session (other plugin, other database, physical)."""


class PublicationNotFoundError(ReplicationError):
    """A publication named in the options does not exist."""


class PublicationExistsError(ReplicationError):
    """A publication of that name already exists."""


class UnsupportedOptionError(ReplicationError, ValueError):
    """An option the server's version (or the chosen protocol version) does not support."""


class ConnectionLostError(ReplicationError):
    """The connection dropped and the session cannot resume (its temporary slot died with it)."""


class ReconnectGaveUpError(ReplicationError):
    """The connection dropped and every reconnect attempt failed within the policy's limits."""
