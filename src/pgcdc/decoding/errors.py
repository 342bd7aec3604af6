"""The exceptions of the decoding layer: a bad plugin, and a stream that cannot be assembled."""

from __future__ import annotations

from pgcdc.errors import PgcdcError

__all__ = ["DecodingError", "PluginError"]


class PluginError(PgcdcError, TypeError):
    """An output plugin that cannot be used as it is (missing required callbacks, ...)."""


class DecodingError(PgcdcError, ValueError):
    """A replication stream that cannot be assembled into transactions.

    Raised for messages out of order (a change outside a transaction, a Commit without its
    Begin, a continued streamed transaction whose first block never arrived, ...) and for
    changes that do not fit their relation. The message names the LSNs and xids involved.
    """
