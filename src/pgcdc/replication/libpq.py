"""The SQLSTATE of a refused connection, from the libpq psycopg runs on.

A server that refuses a connection (a wrong password, a missing database, a role without the
REPLICATION attribute, a server starting up or shutting down, no free connection) sends an error
with a SQLSTATE, but libpq keeps it to itself: a connection that failed has no result to read
fields from, only a message, and that message is written in the server's ``lc_messages``, which
need not be English. With ``PQERRORS_VERBOSE`` set on the connection before it connects, libpq
writes the SQLSTATE into the message (``FATAL:  28P01: ...``); ``verbose_errors`` sets it,
``default_errors`` sets the default back once connected (so that later errors read as psycopg
always shows them) and ``split_sqlstate`` takes the SQLSTATE out of the message again.

psycopg's ``pq`` does not wrap ``PQsetErrorVerbosity`` but hands out each connection's
``PGconn`` pointer (``pgconn_ptr``) for such calls. The call has to go to the very libpq psycopg
loaded (its binary wheel carries a copy of its own): it is looked up among the shared libraries
mapped into this process and checked by its version. Where it cannot be found, connections fail
as before, without a SQLSTATE, and ``pgcdc.replication.failures`` reads their English text.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import re
from pathlib import Path

from psycopg import pq

__all__ = ["default_errors", "split_sqlstate", "verbose_errors"]

log = logging.getLogger("pgcdc.replication")

# PGVerbosity, libpq-fe.h
_PQERRORS_DEFAULT = 1
_PQERRORS_VERBOSE = 2

# "FATAL:  28P01: password ...": the severity (in the server's language), two spaces, the code
_CODE = re.compile(r":  ([0-9A-Z]{5}): ")
_LOCATION = re.compile(r"(?m)^LOCATION:  .*(\n|$)")


def _mapped_libpqs() -> list[Path]:
    """The libpq files mapped into this process (Linux: ``/proc/self/maps``)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    found: dict[Path, None] = {}
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]).name.startswith("libpq"):
            found[Path(fields[5])] = None
    return list(found)


@functools.cache
def _psycopg_libpq() -> ctypes.CDLL | None:
    """psycopg's own libpq (loaded already: this finds the loaded copy), or None."""
    paths = _mapped_libpqs()
    if pq.__impl__ == "binary":  # the wheel's private copy, beside its package
        paths = [p for p in paths if p.parent.name == "psycopg_binary.libs"]
    else:  # the system's: not another wheel's private copy (psycopg2-binary's)
        paths = [p for p in paths if not p.parent.name.endswith(".libs")]
    matching = []
    for path in paths:
        try:
            lib = ctypes.CDLL(str(path))
            if lib.PQlibVersion() == pq.version():
                matching.append(lib)
        except (OSError, AttributeError):
            continue
    if len(matching) != 1:
        log.debug("libpq of psycopg not found among %s: connection errors carry no SQLSTATE", paths)
        return None
    lib = matching[0]
    lib.PQsetErrorVerbosity.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.PQsetErrorVerbosity.restype = ctypes.c_int
    return lib


def _set(conn: pq.abc.PGconn, verbosity: int) -> bool:
    lib = _psycopg_libpq()
    pointer = getattr(conn, "pgconn_ptr", None)  # each implementation has it; the protocol not
    if lib is None or pointer is None:
        return False
    lib.PQsetErrorVerbosity(pointer, verbosity)
    return True


def verbose_errors(conn: pq.abc.PGconn) -> bool:
    """Make libpq write the SQLSTATE into ``conn``'s error messages (set it before connecting);
    whether it could."""
    return _set(conn, _PQERRORS_VERBOSE)


def default_errors(conn: pq.abc.PGconn) -> None:
    """libpq's default error messages again, for everything after the connection is made."""
    _set(conn, _PQERRORS_DEFAULT)


def split_sqlstate(message: str) -> tuple[str, str | None]:
    """A verbose error message as libpq writes it by default, and the SQLSTATE it carried (the
    last one: libpq keeps the message of each address it tried)."""
    codes = _CODE.findall(message)
    if not codes:
        return message, None
    return _LOCATION.sub("", _CODE.sub(":  ", message)), codes[-1]
