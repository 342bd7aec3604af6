"""Lakehouse tables from PostgreSQL changes: the pipeline behind ``pgcdc run`` and ``pgcdc demo``.

Layer: uses ``pgcdc.spark`` (the source), ``pgcdc.filters``, ``pgcdc.replication`` and below.
Transformations (ordering, per-key reduction, history rows, casts, routing) run in Spark, and
every table is written by Delta Lake's own Spark connector on the executors (MERGE with
deletion vectors, appends; ``pgcdc.lake.store.delta``), each commit with an application transaction
``(app id, version)`` so a replayed batch is skipped, never applied twice. delta-rs
(``deltalake``) only reads the tables (status, verification).

Tables, per source table ``schema.table`` (``tables.encode_name`` makes names path-safe):

``<lake>/<schema>/<table>``: the mirror (SCD type 1)
    the source's columns, plus ``__commit_lsn`` (long) and ``__commit_time`` (timestamp) of
    the change that last wrote the row (the consistent point / snapshot time for copied rows).
    One row per key (primary key, replica identity index); a table without either (REPLICA
    IDENTITY FULL) has one row per copy of its rows, told apart by ``__row_id``
    (``pgcdc.lake.write.multiset``).
``<lake>/<schema>/<table>.history``: the history (SCD type 2), if ``history = true``
    the source's columns, plus ``__start_lsn``, ``__start_at``, ``__end_lsn``, ``__end_at``
    (NULL while current), ``__is_current``, ``__start_op`` ('S' snapshot, 'I' insert, 'U'
    update) and ``__end_op`` ('U', 'D', 'T'). One version per key and transaction.
``<lake>/<schema>/<table>.changelog``: the changelog, if ``changelog = true``
    the new image's columns, plus ``__op`` ('S', 'I', 'U', 'D', 'T'), ``__commit_lsn``,
    ``__commit_lsn_text``, ``__end_lsn``, ``__position``, ``__xid``, ``__commit_time``,
    ``__old_kind`` ('K'/'O'), ``__old`` (struct of the old image), ``__unchanged`` (columns
    whose value was unchanged TOAST).
``<lake>/_pgcdc/``
    the pipeline's state (``state.json``) and the streaming checkpoint.

Semantics next to Databricks' ``AUTO CDC`` / ``APPLY CHANGES INTO``:

======================  ======================================  ==================================
AUTO CDC                 what it means there                     pgcdc
======================  ======================================  ==================================
``KEYS (...)``           row identity                            the primary key, else the replica
                                                                 identity index, else (REPLICA
                                                                 IDENTITY FULL) every column; a
                                                                 key-changing UPDATE deletes the
                                                                 old key and writes the new one
``SEQUENCE BY col``      order of changes, latest wins           commit LSN, then the change's
                                                                 position in its transaction;
                                                                 never out of order (WAL order)
``APPLY AS DELETE        which rows are deletes                  pgoutput DELETE (key from the old
WHEN``                                                           image, 'K' or 'O')
``APPLY AS TRUNCATE      which rows truncate the table           pgoutput TRUNCATE: changes of the
WHEN``                                                           batch before it are void, the
                                                                 table is emptied in the same
                                                                 commit as the changes after it;
                                                                 history closes every current row
``STORED AS SCD TYPE 1`` upsert / delete in place                the mirror
``STORED AS SCD TYPE 2`` ``__START_AT`` / ``__END_AT`` versions   the history: ``__start_lsn`` /
                                                                 ``__end_lsn`` (and the commit
                                                                 times ``__start_at`` /
                                                                 ``__end_at``), ``__is_current``;
                                                                 a delete closes the current
                                                                 version, as in AUTO CDC
``COLUMNS * EXCEPT``     column selection                        publication column lists are not
                                                                 used: every column is mirrored
``TRACK HISTORY ON``     which column changes open a version     every change opens a version
                                                                 (one per transaction and key)
``IGNORE NULL UPDATES``  NULL in an update keeps the old value   not needed: NULL is a value; an
                                                                 unchanged TOAST value (not sent)
                                                                 keeps the stored one
out-of-order events      late rows are reconciled by sequence    cannot happen: one slot, commit
                                                                 order
======================  ======================================  ==================================

The package is three rooms, each importing only the ones before it: ``store`` (storage,
state, table layout, Delta's connector and log, delta-rs reads), ``write`` (a micro-batch's
Delta work, the initial copy's files, maintenance) and ``run`` (a pipeline's life: planning,
bootstrap, copy, stream, failures, monitoring, verification); ``config``, ``results`` and
``diagnosis`` sit beside them. Entry points: ``config.load_config`` (``pipeline.toml``),
``run.pipeline.Pipeline`` (``run``), ``run.verify.compare_tables`` (mirror = source?),
``write.batch.LakeBatchWriter`` (the ``foreachBatch`` function).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgcdc.lake.config import ConfigError, PipelineConfig, load_config, parse_config
    from pgcdc.lake.results import PipelineError
    from pgcdc.lake.run.pipeline import Pipeline, RunResult
    from pgcdc.lake.run.verify import TableCheck, compare_tables
    from pgcdc.lake.store.tables import LakeLayout, LakeTable, encode_name

#: The public names, imported when first used: Spark's Python workers unpickle the copy and
#: staging tasks of ``pgcdc.lake`` modules, and need neither the pipeline nor its
#: configuration (pydantic), which would add about a second to every worker's start.
_EXPORTS = {
    "ConfigError": "pgcdc.lake.config",
    "LakeLayout": "pgcdc.lake.store.tables",
    "LakeTable": "pgcdc.lake.store.tables",
    "Pipeline": "pgcdc.lake.run.pipeline",
    "PipelineConfig": "pgcdc.lake.config",
    "PipelineError": "pgcdc.lake.results",
    "RunResult": "pgcdc.lake.run.pipeline",
    "TableCheck": "pgcdc.lake.run.verify",
    "compare_tables": "pgcdc.lake.run.verify",
    "encode_name": "pgcdc.lake.store.tables",
    "load_config": "pgcdc.lake.config",
    "parse_config": "pgcdc.lake.config",
}

__all__ = [
    "ConfigError",
    "LakeLayout",
    "LakeTable",
    "Pipeline",
    "PipelineConfig",
    "PipelineError",
    "RunResult",
    "TableCheck",
    "compare_tables",
    "encode_name",
    "load_config",
    "parse_config",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgcdc.lake' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
