"""pgcdc: change data capture from PostgreSQL logical replication into lakehouse tables.

Layers, each using only the ones before it:
``protocol`` (pgoutput codec, no I/O) -> ``replication`` (the session) ->
``decoding`` (transaction assembly, output-plugin callbacks) and ``filters`` (row filters) ->
``spark`` (streaming source, snapshot reader) -> ``lake`` (Delta tables) -> ``cli``.
"""

from pgcdc.lsn import Lsn

__all__ = ["Lsn", "__version__"]
__version__ = "0.1.0"
