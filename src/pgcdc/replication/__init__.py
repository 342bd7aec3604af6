"""The replication session: read a logical slot's pgoutput stream from PostgreSQL.

* ``ReplicationSession`` streams a slot over a replication connection (libpq through psycopg
  3's ``pq``, kept behind ``transport.ReplicationTransport``), reports progress, and
  reconnects; ``SqlSlotReader`` reads the same stream through the SQL interface. Both yield
  ``WalData``, ``Idle`` and ``Reconnected`` events and take ``confirm(lsn)``.
* ``create_slot`` / ``create_slot_with_snapshot`` / ``drop_slot`` / ``slot_info`` manage slots;
  ``create_publication`` / ``alter_publication_tables`` / ``drop_publication`` /
  ``publication_info`` manage publications.
* ``copy.CopyConnection`` reads a ``COPY ... TO STDOUT`` (the initial copy's tables) through a
  callback that psycopg2's C loop calls for every row.
* Every failure is a ``ReplicationError`` subclass naming the cause and the fix.

Uses only ``pgcdc.protocol``'s layer and below; decodes nothing itself.
"""

from pgcdc.replication.errors import (
    ConnectionLostError,
    PublicationExistsError,
    PublicationNotFoundError,
    ReconnectGaveUpError,
    ReplicationError,
    ReplicationPermissionError,
    ServerUnreachableError,
    SlotActiveError,
    SlotExistsError,
    SlotInvalidatedError,
    SlotMismatchError,
    SlotNotFoundError,
    UnsupportedOptionError,
    scrub_secrets,
)
from pgcdc.replication.events import Idle, Reconnected, ReplicationEvent, WalData
from pgcdc.replication.health import (
    DEFAULT_WARN_BYTES,
    Heartbeat,
    SlotHealth,
    raise_if_lost,
    slot_health,
)
from pgcdc.replication.options import StreamOptions, max_proto_version, quote_publication_names
from pgcdc.replication.publication import (
    PublicationInfo,
    PublicationTable,
    PublishedTable,
    RowFilterSQL,
    alter_publication_tables,
    check_publication_name,
    create_publication,
    drop_publication,
    missing_publications,
    publication_info,
)
from pgcdc.replication.reconnect import NO_RECONNECT, ReconnectPolicy
from pgcdc.replication.session import ReplicationSession
from pgcdc.replication.slot import (
    CreatedSlot,
    ExportedSnapshot,
    SlotInfo,
    create_slot,
    create_slot_with_snapshot,
    drop_slot,
    list_slots,
    slot_info,
)
from pgcdc.replication.sql_interface import SqlSlotReader

__all__ = [
    "DEFAULT_WARN_BYTES",
    "NO_RECONNECT",
    "ConnectionLostError",
    "CreatedSlot",
    "ExportedSnapshot",
    "Heartbeat",
    "Idle",
    "PublicationExistsError",
    "PublicationInfo",
    "PublicationNotFoundError",
    "PublicationTable",
    "PublishedTable",
    "ReconnectGaveUpError",
    "ReconnectPolicy",
    "Reconnected",
    "ReplicationError",
    "ReplicationEvent",
    "ReplicationPermissionError",
    "ReplicationSession",
    "RowFilterSQL",
    "ServerUnreachableError",
    "SlotActiveError",
    "SlotExistsError",
    "SlotHealth",
    "SlotInfo",
    "SlotInvalidatedError",
    "SlotMismatchError",
    "SlotNotFoundError",
    "SqlSlotReader",
    "StreamOptions",
    "UnsupportedOptionError",
    "WalData",
    "alter_publication_tables",
    "check_publication_name",
    "create_publication",
    "create_slot",
    "create_slot_with_snapshot",
    "drop_publication",
    "drop_slot",
    "list_slots",
    "max_proto_version",
    "missing_publications",
    "publication_info",
    "quote_publication_names",
    "raise_if_lost",
    "scrub_secrets",
    "slot_health",
    "slot_info",
]
