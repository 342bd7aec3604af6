"""Where a micro-batch's changes of one source table go: the ``TableSink`` interface and its
three implementations, one per Delta table a source table can have (mirror, history,
changelog).

``batch.LakeBatchWriter`` builds one ``TableBatch`` per source table with changes in the batch
and hands it to each sink of the table whose Delta table does not hold the batch yet
(``SINKS``), each in a Spark session of its own, at the same time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pgcdc.lake.store.tables import LakeTable, TableKind
from pgcdc.lake.write.changelog import append_changelog, changelog_rows
from pgcdc.lake.write.changes import TableOverview
from pgcdc.lake.write.history import history_rows, merge_history
from pgcdc.lake.write.mirror import merge_mirror, mirror_rows
from pgcdc.lake.write.schema_evolution import Defaults

__all__ = ["SINKS", "ChangelogSink", "HistorySink", "MirrorSink", "TableBatch", "TableSink"]


@dataclass(frozen=True, slots=True)
class TableBatch:
    """One micro-batch's changes of one source table, as every sink of the table reads them."""

    table: LakeTable
    #: the batch's id, the version of its Delta application transaction
    batch_id: int
    app_id: str
    #: the micro-batch (a Spark DataFrame of every table's changes) and this table's column
    changes: Any
    column: str
    #: the table's columns the batch carries, and those the lake keeps (a keyless table's row
    #: id added)
    names: Sequence[str]
    columns: Sequence[str]
    overview: TableOverview
    #: the table's events with unchanged TOAST values resolved (None when no sink needs them)
    resolved: Any | None
    #: the mirror as it was before the batch (a Spark DataFrame; None when there was none)
    stored: Any | None
    #: only INSERTs of new keys: appended without a MERGE
    inserts_only: bool
    #: the commit metadata every Delta commit of the batch carries
    metadata: dict[str, Any]
    #: existing rows' values of columns added with a default (None: the source is not asked)
    defaults: Defaults | None


class TableSink(Protocol):
    """One Delta table a source table's changes are written to (the MERGE path; the indexed
    write, ``pgcdc.lake.write.indexed.direct_write``, keeps the same contract for many tables at
    once).

    **What a write promises.** ``write`` applies ``batch`` to the Delta table at ``path`` in
    exactly one Delta commit, tagged with the application transaction
    ``(batch.app_id, batch.batch_id)``, after evolving the table's schema to the batch's columns
    (creating the table when there is none). When it returns, that commit is in the table's
    log: its JSON file written by Delta's log store for the lake's storage, durable as that
    storage makes it. A write that raises has committed nothing of the batch (files it wrote
    are in no commit, and the vacuum removes them) and leaves the table as it was.

    **When the slot may advance.** Never on a sink's return alone: ``LakeBatchWriter`` returns
    only when every Delta table of every source table in the batch has its commit, and only
    then does Spark commit the batch's offsets, after which the source confirms the batch's end
    LSN to PostgreSQL. A failure anywhere leaves the slot where it was: the batch is read again.

    **How a replay is recognised.** A sink keeps no state between calls and may be called again
    with the same batch (after losing a conflict with maintenance, or when a stopped or killed
    run replays its last batch). Before writing, the writer reads the table's latest version of
    the application transaction ``batch.app_id`` from the log; a table that holds
    ``batch.batch_id`` already is skipped, so a commit Delta already has is never made twice,
    and a batch half-written when the process died is completed table by table.

    ``write`` returns the newest source commit time the table holds from the batch, or None
    when the table does not keep one.
    """

    kind: TableKind

    def write(self, spark: Any, path: str, batch: TableBatch) -> datetime | None: ...


class MirrorSink:
    """The mirror: per key its newest row, by Delta's MERGE (deletion vectors), or an append
    when the batch only inserted new keys."""

    kind: TableKind = "mirror"

    def write(self, spark: Any, path: str, batch: TableBatch) -> datetime | None:
        overview = batch.overview
        return merge_mirror(
            spark,
            path,
            mirror_rows(batch.resolved, batch.table, batch.columns, overview),
            batch.table,
            batch.columns,
            truncated=bool(overview.truncates),
            inserts_only=batch.inserts_only,
            newest=overview.max_commit_time,
            app_id=batch.app_id,
            version=batch.batch_id,
            metadata=batch.metadata,
            defaults=batch.defaults,
        )


class HistorySink:
    """The history: a version row per change, the previous version of its key closed, by
    Delta's MERGE; unchanged values come from the mirror as it was before the batch."""

    kind: TableKind = "history"

    def write(self, spark: Any, path: str, batch: TableBatch) -> datetime | None:
        merge_history(
            spark,
            path,
            history_rows(batch.resolved, batch.table, batch.columns, batch.overview),
            batch.table,
            batch.columns,
            stored=batch.stored,
            overview=batch.overview,
            inserts_only=batch.inserts_only,
            app_id=batch.app_id,
            version=batch.batch_id,
            metadata=batch.metadata,
            defaults=batch.defaults,
        )
        return None


class ChangelogSink:
    """The changelog: every change as the source sent it, appended."""

    kind: TableKind = "changelog"

    def write(self, spark: Any, path: str, batch: TableBatch) -> datetime | None:
        append_changelog(
            spark,
            path,
            changelog_rows(batch.changes, batch.table, batch.column, batch.names),
            batch.table,
            app_id=batch.app_id,
            version=batch.batch_id,
            metadata=batch.metadata,
            defaults=batch.defaults,
        )
        return None


#: The sink of each kind of Delta table
SINKS: Mapping[TableKind, TableSink] = {
    sink.kind: sink for sink in (HistorySink(), MirrorSink(), ChangelogSink())
}
