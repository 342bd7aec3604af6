"""Turning a server's or driver's error into a ``ReplicationError`` with the cause and the fix.

``classify`` decides two things: which ``ReplicationError`` subclass an error is, and whether it
is transient, i.e. worth a reconnect (the server restarting, a dropped connection) rather than a
configuration problem that retrying cannot fix (a missing slot, a missing privilege).

It decides by the error's SQLSTATE, which is the same whatever language the server writes its
messages in (``lc_messages``), and by what the failing call was doing (``Doing``): SQLSTATE
42704, undefined_object, is a missing slot where a slot is acquired and a missing publication
where pgoutput decodes changes. The server's message is quoted in the error and never read,
but for the name of a missing publication, between quotes of any language.

Only errors that carry no SQLSTATE are read, as English text (``_WITHOUT_SQLSTATE``): libpq's
own, written by the client (a connection string it cannot read, a refused, timed out or lost
connection), and a server's refusal of a connection where the driver hides its SQLSTATE.
Connections pgcdc opens with psycopg 3 get that SQLSTATE from libpq (``pgcdc.replication.libpq``);
psycopg2's, the initial copy's, do not, and there an English server's words are recognised.
"""

from __future__ import annotations

import enum
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
    SlotNotFoundError,
    scrub_secrets,
)

__all__ = ["Doing", "Failure", "classify", "doing_in_phase", "sqlstate_of"]


class Doing(enum.Enum):
    """What the failing call was doing: a SQLSTATE means different things in each."""

    #: connecting for SQL, or an ordinary statement
    SQL = "sql"
    #: a replication connection, or using a slot: START_REPLICATION, a peek, an advance, a drop
    SLOT = "slot"
    #: creating a slot (CREATE_REPLICATION_SLOT, pg_create_logical_replication_slot)
    CREATE_SLOT = "create slot"
    #: streaming a started slot: the walsender decodes changes with pgoutput
    DECODE = "decode"


def doing_in_phase(phase: str) -> Doing:
    """What a replication connection (``TransportError.phase``) was doing."""
    return {"command": Doing.CREATE_SLOT, "stream": Doing.DECODE}.get(phase, Doing.SLOT)


#: English words of errors without a SQLSTATE, and the SQLSTATE each stands for (the first
#: match counts). libpq's (and psycopg's) own about the connection, in the client's words:
_CLIENT_TEXTS = (
    ("connection refused", "08001"),
    ("could not translate host name", "08001"),
    ("failed to resolve host", "08001"),
    ("could not connect", "08001"),
    ("timeout expired", "08001"),
    ("no route to host", "08001"),
    ("network is unreachable", "08001"),
    ("connection timed out", "08006"),
    ("server closed the connection unexpectedly", "08006"),
    ("connection already closed", "08003"),
    ("connection is closed", "08003"),
    ("connection is lost", "08006"),
    ("no copy in progress", "08006"),
    ("ssl syscall", "08006"),
    ("eof detected", "08006"),
    ("connection reset", "08006"),
    ("broken pipe", "08006"),
    ("consuming input failed", "08006"),
    ("lost synchronization with server", "08006"),
)
#: and an English server's refusals of a connection, for a driver that hides their SQLSTATE
_SERVER_TEXTS = (
    ("password authentication failed", "28P01"),
    ("no pg_hba.conf entry", "28000"),
    ("pg_hba.conf rejects connection", "28000"),
    ("is not permitted to log in", "28000"),
    ("must be superuser or replication role to start walsender", "42501"),
    ("permission denied to start wal sender", "42501"),
    ("the database system is starting up", "57P03"),
    ("the database system is shutting down", "57P03"),
    ("the database system is in recovery mode", "57P03"),
    ("the database system is not yet accepting connections", "57P03"),
    ("the database system is not accepting connections", "57P03"),
    ("terminating connection", "57P01"),
    ("too many connections", "53300"),
    ("too many clients", "53300"),
    ("remaining connection slots are reserved", "53300"),
    ("exceeds max_wal_senders", "53300"),
    ("number of requested standby connections", "53300"),
)
_WITHOUT_SQLSTATE = _CLIENT_TEXTS + _SERVER_TEXTS
#: "database "x" does not exist" (3D000), "role "x" does not exist" (28000)
_MISSING = re.compile(r'\b(database|role) "[^"]*" does not exist')

#: errors after which a new connection may succeed: the connection ended (class 08, a server
#: stopping or restarting, a session timeout ended it) or the server had no room for it
_TRANSIENT_SQLSTATES = frozenset(("57P01", "57P02", "57P03", "57P05", "25P03", "25P04", "53300"))
#: on a standby, a recovery conflict ends the connection with these
_RECOVERY_CONFLICT = frozenset(("40001", "40P01"))
# a name the server quoted: "x" in English, »x« in German, « x » in French, ...
_QUOTED = re.compile(r'["«»„“‘「]\s?(.+?)\s?["«»“”’」]')


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failure means: the error to raise, and whether a reconnect may cure it."""

    error: ReplicationError
    transient: bool


def _quoted(message: str) -> str | None:
    match = _QUOTED.search(message)
    return match.group(1) if match else None


def sqlstate_of(message: str, sqlstate: str | None) -> str | None:
    """An error's SQLSTATE; for one without, the SQLSTATE its English words stand for."""
    if sqlstate is not None:
        return sqlstate
    low = message.lower()
    for words, code in _WITHOUT_SQLSTATE:
        if words in low:
            return code
    match = _MISSING.search(low)
    if match:
        return "3D000" if match.group(1) == "database" else "28000"
    return None


def classify(
    message: str,
    sqlstate: str | None,
    *,
    server: str,
    slot: str | None = None,
    user: str | None = None,
    lost: bool = False,
    doing: Doing = Doing.SQL,
) -> Failure:
    """Map one error (its message and SQLSTATE) to a ``ReplicationError``."""
    text = " ".join(message.split())
    role = f"role {user!r}" if user else "the connecting role"
    slot_name = f"{slot!r}" if slot else "the slot"

    if sqlstate is None and CONNINFO_ERROR.search(text):
        return Failure(
            ReplicationError(
                f"the connection string cannot be read: {scrub_secrets(text)}",
                "write it as libpq reads it: in a URI, percent-encode the password's reserved "
                "characters (%25 for %, %2F for /, %40 for @, %3A for :, %20 for a space); in "
                "key=value form, single-quote a value with spaces",
            ),
            False,
        )
    code = sqlstate_of(text, sqlstate) or ""
    replication = doing in (Doing.SLOT, Doing.CREATE_SLOT)

    if code.startswith("28"):  # invalid_authorization_specification, invalid_password
        return Failure(
            ReplicationPermissionError(
                f"{server} refused the login: {text}",
                "check the user name and password, and that pg_hba.conf has a line allowing "
                "this user `replication` connections (and ordinary ones to the database) from "
                "this host",
            ),
            False,
        )
    if code == "42501" and replication:  # insufficient_privilege: a walsender, a slot
        return Failure(
            ReplicationPermissionError(
                f"{role} on {server} may not use logical replication: {text}",
                f"grant the REPLICATION attribute: ALTER ROLE {user or '<role>'} REPLICATION "
                "(or connect as a role that has it)",
            ),
            False,
        )
    if code == "42501":
        return Failure(
            ReplicationPermissionError(
                f"{role} on {server} lacks a privilege: {text}",
                "grant the privilege named above to the role, or connect as a role that has it "
                "(creating publications needs CREATE on the database and ownership of the "
                "tables; FOR ALL TABLES and FOR TABLES IN SCHEMA need a superuser)",
            ),
            False,
        )
    if code == "42704" and doing is Doing.SLOT:  # undefined_object
        return Failure(
            SlotNotFoundError(
                f"replication slot {slot_name} does not exist on {server}",
                "create it first (pgcdc.replication.create_slot) or fix the slot name",
            ),
            False,
        )
    if code == "42704" and doing is Doing.DECODE:
        name = _quoted(text)
        which = f"publication {name!r}" if name else "a publication it reads"
        return Failure(
            PublicationNotFoundError(
                f"{which} does not exist on {server}: {text}",
                "create it (pgcdc.replication.create_publication) in the slot's database, or "
                "fix publication_names",
            ),
            False,
        )
    if code == "55006" and doing in (Doing.SLOT, Doing.DECODE):  # object_in_use
        return Failure(
            SlotActiveError(
                f"replication slot {slot_name} on {server} is in use by another process: {text}",
                "stop the other consumer of this slot, or terminate its walsender "
                "(pg_terminate_backend(active_pid) from pg_replication_slots), or use "
                "another slot",
            ),
            False,
        )
    if code == "55000" and doing is Doing.SLOT:  # object_not_in_prerequisite_state
        # a slot of another plugin, type or database is refused before it is used (the
        # catalog says so: slot.require_usable_slot); what the server refuses then is a slot
        # invalidated since
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
    if code == "55000" and doing is Doing.CREATE_SLOT:
        return Failure(
            ReplicationError(
                f"{server} is not configured for logical decoding: {text}",
                "set wal_level = logical in postgresql.conf and restart the server (a logical "
                "slot also needs a connection to a database, and, before PostgreSQL 16, a "
                "primary server)",
            ),
            False,
        )
    if code == "42710" and doing is Doing.CREATE_SLOT:  # duplicate_object
        return Failure(
            SlotExistsError(
                f"replication slot {slot_name} already exists on {server}",
                "use the existing slot, drop it first, or choose another name",
            ),
            False,
        )
    if code == "53400" and doing is Doing.CREATE_SLOT:  # configuration_limit_exceeded
        return Failure(
            ReplicationError(
                f"{server} has no free replication slot: {text}",
                "drop unused slots or raise max_replication_slots (needs a restart)",
            ),
            False,
        )
    if code == "3D000":  # invalid_catalog_name
        return Failure(
            ReplicationError(
                f"{server}: {text}", "fix dbname in the connection string or create the database"
            ),
            False,
        )
    if code == "53300" and replication:  # too_many_connections, for a walsender: its own pool
        return Failure(
            ServerUnreachableError(
                f"{server} has no free walsender: {text}",
                "stop unused replication connections or raise max_wal_senders",
            ),
            True,
        )
    if code == "53300":
        return Failure(
            ServerUnreachableError(
                f"{server} has no free connection: {text}",
                "close unused connections, or raise max_connections",
            ),
            True,
        )
    if (
        code in _TRANSIENT_SQLSTATES
        or code.startswith("08")  # connection_exception
        or (lost and code in _RECOVERY_CONFLICT)
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
