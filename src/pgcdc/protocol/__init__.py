"""The pgoutput codec: every logical replication message of protocol versions 1 to 4. No I/O.

``Decoder`` turns one message's bytes into one frozen dataclass from ``pgcdc.protocol.messages``;
``Encoder`` is its exact inverse. Column values are converted to Python and Arrow by
``pgcdc.protocol.values``; whole batches of changes decode column-wise by
``pgcdc.protocol.arrow.columnar``.
"""

from pgcdc.protocol.arrow.columnar import ColumnarBatch, ColumnarDecoder
from pgcdc.protocol.decoder import MAX_PROTO_VERSION, Decoder
from pgcdc.protocol.encoder import Encoder, encode_tuple
from pgcdc.protocol.errors import CopyFormatError, ProtocolError
from pgcdc.protocol.message_types import MessageHeader, MessageType, peek
from pgcdc.protocol.messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    ReplicationMessage,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    TupleValue,
    Type,
    UnchangedToast,
    Update,
)

__all__ = [
    "MAX_PROTO_VERSION",
    "UNCHANGED_TOAST",
    "Begin",
    "BeginPrepare",
    "Column",
    "ColumnarBatch",
    "ColumnarDecoder",
    "Commit",
    "CommitPrepared",
    "CopyFormatError",
    "Decoder",
    "Delete",
    "Encoder",
    "Insert",
    "Message",
    "MessageHeader",
    "MessageType",
    "Origin",
    "Prepare",
    "ProtocolError",
    "Relation",
    "ReplicationMessage",
    "RollbackPrepared",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "TupleValue",
    "Type",
    "UnchangedToast",
    "Update",
    "encode_tuple",
    "peek",
]
