"""Prometheus metrics of a running pipeline (prometheus_client), served over HTTP.

``PipelineMetrics`` owns its own registry (so several pipelines or tests never collide) and the
metrics an operator watches: changes per table and operation, lag in bytes and seconds, batch
durations, retained WAL, errors by kind. ``serve(port)`` exposes them at ``/metrics``. Labels
carry table names and operations, never values.

``pgcdc run`` records them as ``pgcdc.lake.run.monitor`` describes (per batch in the process that
runs ``foreachBatch``: with a Spark Connect server, only the slot gauges are recorded here).
Error kinds: ``batch`` (a micro-batch failed), ``stream`` (the query failed), ``pipeline``
(``run`` stopped with an error), ``slot_invalidated``, ``health_check`` (the slot could not be
checked), ``heartbeat`` (a heartbeat could not be written).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["PipelineMetrics"]

#: a table's phases in the pipeline (``pgcdc.lake.store.state.TablePhaseName``)
TABLE_PHASES = ("copying", "catching-up", "streaming", "parked", "removed")
_BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


class PipelineMetrics:
    """The metrics of one pipeline (one slot)."""

    def __init__(self, slot: str, registry: CollectorRegistry | None = None) -> None:
        self.slot = slot
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ("slot",)
        self.changes = Counter(
            "pgcdc_changes",
            "Changes applied to the lake, by table and operation (I, U, D, T)",
            (*labels, "table", "op"),
            registry=self.registry,
        )
        self.transactions = Counter(
            "pgcdc_transactions", "Source transactions applied", labels, registry=self.registry
        )
        self.batches = Counter(
            "pgcdc_batches", "Micro-batches committed to the lake", labels, registry=self.registry
        )
        self.batch_seconds = Histogram(
            "pgcdc_batch_duration_seconds",
            "Time to process and commit one micro-batch",
            labels,
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.lag_bytes = Gauge(
            "pgcdc_lag_bytes",
            "WAL bytes between the server's current position and the slot's confirmed position",
            labels,
            registry=self.registry,
        )
        self.lag_seconds = Gauge(
            "pgcdc_lag_seconds",
            "Seconds from the commit of the newest source transaction of the last batch to "
            "that batch's commit to the lake",
            labels,
            registry=self.registry,
        )
        self.retained_wal_bytes = Gauge(
            "pgcdc_retained_wal_bytes",
            "WAL the slot keeps on the server (current position minus restart_lsn)",
            labels,
            registry=self.registry,
        )
        self.confirmed_lsn = Gauge(
            "pgcdc_confirmed_lsn",
            "The slot's confirmed position, as a number",
            labels,
            registry=self.registry,
        )
        self.errors = Counter(
            "pgcdc_errors", "Errors by kind", (*labels, "kind"), registry=self.registry
        )
        self.parked = Gauge(
            "pgcdc_table_parked",
            "1 while a table is parked (DDL the lake cannot follow; pgcdc resync brings it "
            "back), 0 while it is written",
            (*labels, "table"),
            registry=self.registry,
        )
        self.table_state = Gauge(
            "pgcdc_table_state",
            "1 for a table's phase (copying, catching-up, streaming, parked, removed), 0 for "
            "the others",
            (*labels, "table", "state"),
            registry=self.registry,
        )
        self._server: Any = None

    # -- recording ------------------------------------------------------------------------
    def record_batch(
        self,
        seconds: float,
        changes: Mapping[tuple[str, str], int],
        transactions: int = 0,
    ) -> None:
        """One committed batch: its duration and its change counts per (table, op)."""
        self.batches.labels(self.slot).inc()
        self.batch_seconds.labels(self.slot).observe(seconds)
        if transactions:
            self.transactions.labels(self.slot).inc(transactions)
        for (table, op), count in changes.items():
            if count:
                self.changes.labels(self.slot, table, op).inc(count)

    def record_lag(
        self,
        *,
        lag_bytes: int | None = None,
        lag_seconds: float | None = None,
        retained_bytes: int | None = None,
        confirmed_lsn: int | None = None,
    ) -> None:
        if lag_bytes is not None:
            self.lag_bytes.labels(self.slot).set(lag_bytes)
        if lag_seconds is not None:
            self.lag_seconds.labels(self.slot).set(lag_seconds)
        if retained_bytes is not None:
            self.retained_wal_bytes.labels(self.slot).set(retained_bytes)
        if confirmed_lsn is not None:
            self.confirmed_lsn.labels(self.slot).set(confirmed_lsn)

    def record_tables(self, phases: Mapping[str, str]) -> None:
        """Each table's phase, by table id (``pgcdc_table_state``, ``pgcdc_table_parked``)."""
        for table, phase in phases.items():
            self.parked.labels(self.slot, table).set(1 if phase == "parked" else 0)
            for name in TABLE_PHASES:
                self.table_state.labels(self.slot, table, name).set(1 if name == phase else 0)

    def record_error(self, kind: str) -> None:
        self.errors.labels(self.slot, kind).inc()

    # -- serving --------------------------------------------------------------------------
    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``addr:port`` (port 0 picks a free one); returns the port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
