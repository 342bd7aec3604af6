"""Transaction assembly and the output-plugin callback API.

Layer: uses ``pgcdc.protocol`` (and, in ``runner`` only, a ``pgcdc.replication`` source through
its ``events()`` / ``confirm()`` interface).

* ``OutputPlugin`` (``plugin``): PostgreSQL's OutputPluginCallbacks in Python; ``capabilities``
  validates a plugin the way PostgreSQL does.
* ``Transaction``, ``Change``, ``TruncateChange``, ``LogicalMessage``, ``StreamAbortInfo``
  (``transaction``): what callbacks receive.
* ``RelationInfo``, ``ColumnInfo``, ``SchemaChange``, ``RelationCache`` (``relations``).
* ``Assembler`` (``assembler``): sans-I/O reorder buffer turning any pgoutput stream into
  committed transactions in commit order, with bounded memory (``spill``).
* ``run`` (``runner``): session + assembler + plugin, with durable confirmation.
"""

from pgcdc.decoding.assembler import Assembler, AssemblerStats
from pgcdc.decoding.errors import DecodingError, PluginError
from pgcdc.decoding.plugin import Capabilities, DecodingContext, OutputPlugin, capabilities
from pgcdc.decoding.relations import ColumnInfo, RelationCache, RelationInfo, SchemaChange
from pgcdc.decoding.runner import RunResult, run
from pgcdc.decoding.spill import DEFAULT_MEMORY_LIMIT
from pgcdc.decoding.transaction import (
    Change,
    ChangeAction,
    LogicalMessage,
    StreamAbortInfo,
    Transaction,
    TruncateChange,
)

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "Assembler",
    "AssemblerStats",
    "Capabilities",
    "Change",
    "ChangeAction",
    "ColumnInfo",
    "DecodingContext",
    "DecodingError",
    "LogicalMessage",
    "OutputPlugin",
    "PluginError",
    "RelationCache",
    "RelationInfo",
    "RunResult",
    "SchemaChange",
    "StreamAbortInfo",
    "Transaction",
    "TruncateChange",
    "capabilities",
    "run",
]
