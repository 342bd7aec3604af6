"""Turning a server's or driver's error into a ``ReplicationError`` with the cause and the fix.

``classify`` looks at the SQLSTATE (when the driver has one) and the server's message (libpq
reports connection-time errors without a SQLSTATE) and decides two things: which
``ReplicationError`` subclass it is, and whether it is transient, i.e. worth a reconnect (the
server restarting, a dropped connection) rather than a configuration problem that retrying cannot
fix (a missing slot, a missing privilege).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pgcdc.replication.errors import (
    CONNINFO_ERROR,
    PublicationNotFoundError,
    ReplicationError,
    ReplicationPermissionError,
    ServerUnreachableError,
    SlotActiveError,
    SlotExistsError,
    SlotInvalidatedError,
    SlotMismatchError,
    SlotNotFoundError,
    scrub_secrets,
)

__all__ = ["Failure", "classify"]

_UNREACHABLE = (
    "connection refused",
    "could not translate host name",
    "failed to resolve host",
    "could not connect",
    "timeout expired",
    "no route to host",
    "network is unreachable",
    "server closed the connection unexpectedly",
    "connection already closed",
    "connection is closed",
    "connection is lost",
    "no copy in progress",
    "ssl syscall",
    "eof detected",
    "connection timed out",
    "connection reset",
    "broken pipe",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "terminating connection",
    "consuming input failed",
    "lost synchronization with server",
)
_TRANSIENT_SQLSTATES = {"57P01", "57P02", "57P03", "53300", "08000", "08003", "08006", "08001"}
_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failure means: the error to raise, and whether a reconnect may cure it."""

    error: ReplicationError
    transient: bool


def _quoted(message: str) -> str | None:
    match = _QUOTED.search(message)
    return match.group(1) if match else None


def classify(
    message: str,
    sqlstate: str | None,
    *,
    server: str,
    slot: str | None = None,
    user: str | None = None,
    lost: bool = False,
) -> Failure:
    """Map one error (its message and SQLSTATE) to a ``ReplicationError``."""
    text = " ".join(message.split())
    low = text.lower()
    role = f"role {user!r}" if user else "the connecting role"
    slot_name = f"{slot!r}" if slot else "the slot"

    if CONNINFO_ERROR.search(text) and sqlstate is None:
        return Failure(
            ReplicationError(
                f"the connection string cannot be read: {scrub_secrets(text)}",
                "write it as libpq reads it: in a URI, percent-encode the password's reserved "
                "characters (%25 for %, %2F for /, %40 for @, %3A for :, %20 for a space); in "
                "key=value form, single-quote a value with spaces",
            ),
            False,
        )

    if (
        "password authentication failed" in low
        or sqlstate in ("28P01", "28000")
        or ("no pg_hba.conf entry" in low)
    ):
        return Failure(
            ReplicationPermissionError(
                f"{server} refused the login: {text}",
                "check the user name and password, and that pg_hba.conf has a line allowing "
                "this user `replication` connections (and ordinary ones to the database) from "
                "this host",
            ),
            False,
        )
    if (
        "must be superuser or replication role" in low
        or "permission denied to start wal sender" in low
        or "permission denied to use replication slots" in low
        or "must be superuser or have privileges of" in low
        or "must be superuser or replication" in low
    ):
        return Failure(
            ReplicationPermissionError(
                f"{role} on {server} may not use logical replication: {text}",
                f"grant the REPLICATION attribute: ALTER ROLE {user or '<role>'} REPLICATION "
                "(or connect as a role that has it)",
            ),
            False,
        )
    if sqlstate == "42501" or "permission denied" in low or "must be owner" in low:
        return Failure(
            ReplicationPermissionError(
                f"{role} on {server} lacks a privilege: {text}",
                "grant the privilege named above to the role, or connect as a role that has it "
                "(creating publications needs CREATE on the database and ownership of the "
                "tables; FOR ALL TABLES and FOR TABLES IN SCHEMA need a superuser)",
            ),
            False,
        )
    if "replication slot" in low and "does not exist" in low:
        name = _quoted(text) or slot or "?"
        return Failure(
            SlotNotFoundError(
                f"replication slot {name!r} does not exist on {server}",
                "create it first (pgcdc.replication.create_slot) or fix the slot name",
            ),
            False,
        )
    if "publication" in low and "does not exist" in low:
        name = _quoted(text) or "?"
        return Failure(
            PublicationNotFoundError(
                f"publication {name!r} does not exist on {server}",
                "create it (pgcdc.replication.create_publication) in the slot's database, or "
                "fix publication_names",
            ),
            False,
        )
    if ("replication slot" in low and "is active for pid" in low) or sqlstate == "55006":
        return Failure(
            SlotActiveError(
                f"replication slot {slot_name} on {server} is in use by another process: {text}",
                "stop the other consumer of this slot, or terminate its walsender "
                "(pg_terminate_backend(active_pid) from pg_replication_slots), or use "
                "another slot",
            ),
            False,
        )
    if "can no longer get changes from replication slot" in low or (
        "this slot has been invalidated" in low
    ):
        return Failure(
            SlotInvalidatedError(
                f"replication slot {slot_name} on {server} was invalidated and can no longer "
                f"stream: {text}",
                "drop the slot and create it again, then re-copy the tables (changes since the "
                "slot's last position are gone); raise max_slot_wal_keep_size so it does not "
                "happen again",
            ),
            False,
        )
    if "replication slot" in low and "already exists" in low:
        name = _quoted(text) or slot or "?"
        return Failure(
            SlotExistsError(
                f"replication slot {name!r} already exists on {server}",
                "use the existing slot, drop it first, or choose another name",
            ),
            False,
        )
    if "was not created in this database" in low:
        return Failure(
            SlotMismatchError(
                f"replication slot {slot_name} belongs to another database than the one "
                f"{server} names: {text}",
                "connect to the slot's database (see pg_replication_slots.database)",
            ),
            False,
        )
    if "cannot use physical replication slot" in low:
        return Failure(
            SlotMismatchError(
                f"replication slot {slot_name} on {server} is a physical slot",
                "use a logical slot created with the pgoutput plugin",
            ),
            False,
        )
    if sqlstate == "3D000" or ("database" in low and "does not exist" in low):
        return Failure(
            ReplicationError(
                f"{server}: {text}", "fix dbname in the connection string or create the database"
            ),
            False,
        )
    if "all replication slots are in use" in low:
        return Failure(
            ReplicationError(
                f"{server} has no free replication slot: {text}",
                "drop unused slots or raise max_replication_slots (needs a restart)",
            ),
            False,
        )
    if "exceeds max_wal_senders" in low or "number of requested standby connections" in low:
        return Failure(
            ServerUnreachableError(
                f"{server} has no free walsender: {text}",
                "stop unused replication connections or raise max_wal_senders",
            ),
            True,
        )
    if "logical decoding requires" in low and "wal_level" in low:
        return Failure(
            ReplicationError(
                f"{server} is not configured for logical decoding: {text}",
                "set wal_level = logical in postgresql.conf and restart the server",
            ),
            False,
        )
    if (
        sqlstate in _TRANSIENT_SQLSTATES
        or (sqlstate is not None and sqlstate.startswith("08"))
        or any(marker in low for marker in _UNREACHABLE)
        or "too many connections" in low
        or "remaining connection slots are reserved" in low
    ):
        return Failure(
            ServerUnreachableError(
                f"lost or could not open the connection to {server}: {text}",
                "check that the server is running and accepts connections at that address "
                "(host, port, listen_addresses, pg_hba.conf, firewall)",
            ),
            True,
        )
    return Failure(
        ReplicationError(
            f"{server} reported an error"
            + (f" (SQLSTATE {sqlstate})" if sqlstate else "")
            + f": {text}",
            "see the server's message above; the server log has the details",
        ),
        lost and sqlstate is None,
    )
