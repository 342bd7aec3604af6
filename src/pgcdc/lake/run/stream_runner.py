"""The stream step of a pipeline's run: the streaming query from the slot into the lake, and
what watches it.

The query reads the slot (``pgcdc.spark.read_stream``) and applies each micro-batch with
``foreachBatch`` (``batch.LakeBatchWriter``), from the checkpoint of the state's generation.
Around it: the slot monitor and the heartbeat (``monitor``), the batches' metrics and progress
(``BatchEvents``), and the failed-batch record (``failures.FailureRecord``). A
``pgcdc.spark.SchemaChanged`` restarts the query, which reads the new schema, on the same
checkpoint; a stop request stops it between two batches; an until-caught-up run
(``Trigger.AvailableNow``) waits for the maintenance its batches left due before it returns.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcdc.lake.diagnosis import diagnose, spark_hint
from pgcdc.lake.results import PipelineError
from pgcdc.lake.run.catalog import SourcePlan
from pgcdc.lake.run.failures import FailureRecord
from pgcdc.lake.run.monitor import BatchEvents, SlotMonitor
from pgcdc.lake.run.table_set import TableDiscovery
from pgcdc.lake.store.deltalog import write_checksums
from pgcdc.lake.store.state import PipelineState, load_state, remove_torn_writes
from pgcdc.lake.store.tables import LakeTable, renamed_columns_option, text_columns_option
from pgcdc.lake.write.batch import PROGRESS, LakeBatchWriter, Progress, table_column_pairs
from pgcdc.lake.write.held import held_tables
from pgcdc.lake.write.maintenance import worker_for
from pgcdc.lsn import Lsn
from pgcdc.replication import Heartbeat, SlotHealth, scrub_secrets

if TYPE_CHECKING:
    from pgcdc.lake.run.pipeline import Pipeline, RunResult

__all__ = ["MAX_SCHEMA_RESTARTS", "StreamRunner"]

log = logging.getLogger("pgcdc.lake")

#: A query restarted this often in a row for schema changes means something else is wrong.
MAX_SCHEMA_RESTARTS = 50


class StreamRunner:
    """The stream step of ``pipeline``'s run."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.config = pipeline.config
        self.layout = pipeline.layout
        self.failures = FailureRecord(pipeline)

    def run(
        self,
        plan: SourcePlan,
        state: PipelineState,
        result: RunResult,
        *,
        until_caught_up: bool,
        on_started: Callable[[Pipeline], None] | None,
    ) -> tuple[str, ...]:
        """Stream until stopped, failed, or (``until_caught_up``) caught up with the server;
        or until tables a ``[[tables]]`` pattern matches were created on the source
        (``TableDiscovery``): then their ids, for the pipeline to add them and stream again."""
        pipeline = self.pipeline
        progress = PROGRESS.setdefault(state.stream_app_id, Progress())
        batches, changes = progress.batches, progress.changes
        events = BatchEvents(pipeline.metrics, pipeline.observer)
        progress.subscribe(events)
        progress.subscribe(self.failures)
        source = self.config.source
        dsn = pipeline.dsn
        if source.heartbeat_interval > 0:
            schema, table = source.heartbeat_schema_table
            pipeline.heartbeat = Heartbeat(
                dsn,
                interval=source.heartbeat_interval,
                mode=source.heartbeat,
                schema=schema,
                table=table,
            )
        monitor = pipeline.monitor = SlotMonitor(
            dsn,
            source.slot,
            self.layout.root,
            metrics=pipeline.metrics,
            observer=pipeline.observer,
            interval=source.health_check_interval,
            warn_bytes=source.retained_wal_warning,
            on_fatal=pipeline.set_fatal,
            heartbeat=pipeline.heartbeat,
            publication=source.publication,
        )
        clean = False
        try:
            clock = time.monotonic()
            health = monitor.check()
            log.debug("slot checked: %.2f s", time.monotonic() - clock)
            pipeline.raise_fatal()
            if pipeline.heartbeat is not None:
                pipeline.heartbeat.start()
            monitor.start()
            found = self._stream(plan, state, until_caught_up, result, on_started, health=health)
            pipeline.raise_fatal()
            clean = True
            return found
        finally:
            worker = worker_for(state.stream_app_id)
            if worker is not None:  # a step in flight is cancelled; the table stays as it was
                worker.stop()
            # the next start's first commits (and its schema reads) need no table's state
            # rebuilt from its log; a failed run leaves the lake as its last batch did
            if clean:
                clock = time.monotonic()
                written = write_checksums(pipeline.spark())
                log.debug("%d checksum files written: %.2f s", written, time.monotonic() - clock)
            monitor.stop()
            if pipeline.heartbeat is not None:
                pipeline.heartbeat.stop()
                pipeline.heartbeat = None
            progress.unsubscribe(events)
            progress.unsubscribe(self.failures)
            result.batches += progress.batches - batches
            result.changes += progress.changes - changes
            result.added_rows.update(pipeline.syncs.copied)

    def _stream(
        self,
        plan: SourcePlan,
        state: PipelineState,
        until_caught_up: bool,
        result: RunResult,
        on_started: Callable[[Pipeline], None] | None,
        *,
        health: SlotHealth | None = None,
    ) -> tuple[str, ...]:
        from pgcdc.spark import is_schema_changed, read_stream

        pipeline = self.pipeline
        source = self.config.source
        stream = self.config.stream
        checkpoint = state.checkpoint(self.layout)
        torn = remove_torn_writes(checkpoint)
        if torn:
            log.warning(
                "removed %d temporary file(s) a killed run left in the checkpoint: %s",
                len(torn),
                ", ".join(torn),
            )
        clock = time.monotonic()
        pipeline.drop_gone_columns()  # and parks a table whose DDL the lake cannot follow
        log.debug("columns gone from the source checked: %.2f s", time.monotonic() - clock)
        options: dict[str, Any] = {}
        if stream.max_changes_per_trigger is not None:
            options["maxChangesPerTrigger"] = stream.max_changes_per_trigger
        if stream.max_bytes_per_trigger is not None:
            options["maxBytesPerTrigger"] = stream.max_bytes_per_trigger
        # created on stop: the source then plans no more batches, so that the query stops
        # between two even when batches follow each other at once (a busy source)
        # read by the source in this process: a local file whatever the lake's store
        pause = Path(tempfile.gettempdir()) / f"pgcdc-pause-{uuid.uuid4().hex}"
        options["pauseFile"] = str(pause)
        current = plan
        discovery = None if until_caught_up else TableDiscovery.of(pipeline)
        syncs = pipeline.syncs
        restarts = 0
        started = 0  # queries started
        while not pipeline.stopping.is_set():
            if restarts:  # a schema change: the first start checked in drop_gone_columns
                pipeline.check_shapes(replan=True)
                # a pattern entry's text_columns may name a column a table gained since
                current = pipeline.plan or plan
            state = load_state(self.layout) or pipeline.state or state
            pipeline.state = state
            # the tables being copied beside the stream: what it keeps aside for them is
            # registered before its first batch
            syncs.start(current.tables, state)
            writer = self._writer(plan, state)
            # and those whose changes it keeps aside
            mirrored = {t.table_id for t in writer.tables} | held_tables(state.stream_app_id).ids()
            # of the tables the writer mirrors: a table a replan found since joins at the
            # next start, and the source refuses text columns of a table it does not read
            texts = text_columns_option(t for t in current.tables if t.table_id in mirrored)
            if texts:
                options["textColumns"] = texts
            else:
                options.pop("textColumns", None)
            # changes from before a column rename the lake followed still name it as before
            renamed = renamed_columns_option(
                (t, state.shapes.get(t.table_id, {}).get("renamed", []))
                for t in current.tables
                if t.table_id in mirrored
            )
            if renamed:
                options["renamedColumns"] = renamed
            else:
                options.pop("renamedColumns", None)
            # a parked table stays published (its slot position is the others'), but the
            # source drops its changes unread: none of its values or DDL can fail the stream
            skipped = [[t.schema, t.name] for t in current.tables if t.table_id in writer.parked]
            if skipped:
                options["skipTables"] = skipped
            else:
                options.pop("skipTables", None)
            spark = pipeline.spark()
            df = read_stream(spark, pipeline.dsn, source.slot, [source.publication], **options)
            query_writer = df.writeStream.foreachBatch(writer).option(
                "checkpointLocation", str(checkpoint)
            )
            if until_caught_up:
                query_writer = query_writer.trigger(availableNow=True)
            else:
                query_writer = query_writer.trigger(
                    processingTime=f"{stream.trigger_interval:g} seconds"
                )
            clock = time.monotonic()
            try:
                query = query_writer.queryName(f"pgcdc_{source.slot}").start()
            except Exception as exc:  # its checkpoint cannot be written, say
                found = diagnose(exc, str(self.layout.root))
                raise PipelineError(
                    f"the stream did not start: {scrub_secrets(str(found))}"
                ) from exc
            pipeline.query = query
            log.debug("query started: %.2f s", time.monotonic() - clock)
            start = None if health is None else health.confirmed_flush_lsn
            target = None if health is None else health.server_lsn
            log.info(
                "stream started (query %s, checkpoint %s, %s) at %s",
                query.id,
                checkpoint,
                "until caught up" if until_caught_up else "continuous",
                start if start is not None else "the checkpoint",
                extra={
                    "slot": source.slot,
                    "lsn": None if start is None else str(start),
                    "server_lsn": None if target is None else str(target),
                    "mode": "until caught up" if until_caught_up else "continuous",
                },
            )
            if started == 0:
                pipeline.observer.stream_started(start, target, until_caught_up)
            if on_started is not None and started == 0:
                on_started(pipeline)
            started += 1
            error: BaseException | None
            joining: tuple[str, ...] = ()
            again = False  # the query starts again: a table's copy parked it
            try:
                while not query.awaitTermination(1):
                    if pipeline.fatal is not None:
                        query.stop()
                        break
                    if syncs.changed.is_set():
                        syncs.changed.clear()
                        fatal = syncs.failure()
                        if fatal is not None:
                            pipeline.set_fatal(str(fatal))
                            query.stop()
                            break
                        now_parked = (load_state(self.layout) or state).parked()
                        again = again or not set(now_parked) <= set(writer.parked)
                    if discovery is not None:
                        joining = discovery.found()
                        if joining:
                            log.info(
                                "%d table(s) to copy, or changed on the source (%s): the "
                                "stream stops after its batch to take them up",
                                len(joining),
                                ", ".join(joining),
                                extra={"tables": list(joining)},
                            )
                    if pipeline.stopping.is_set() or joining or again:
                        pause.touch()
                        try:
                            _stop_between_batches(query)
                        finally:
                            pause.unlink(missing_ok=True)
                        break
                if pipeline.fatal is not None:
                    return ()
                error = query.exception()
            except Exception as exc:  # awaitTermination raises the query's failure
                error = exc
            finally:
                pipeline.query = None
            if error is None:
                self.failures.clear(None)  # if the checkpoint committed the failed batch since
                if again and not pipeline.stopping.is_set() and not joining:
                    log.info("the stream starts again without the tables parked since")
                    continue
                if until_caught_up:
                    # the tables copied beside it join what it applied
                    syncs.wait(pipeline.stopping)
                    fatal = syncs.failure()
                    if fatal is not None:
                        raise fatal
                    self._drain_maintenance(state.stream_app_id)
                    pipeline.drop_gone_columns(every=True)
                return () if pipeline.stopping.is_set() else joining
            if pipeline.fatal is not None:
                return ()
            if is_schema_changed(error) and restarts < MAX_SCHEMA_RESTARTS:
                restarts += 1
                result.restarts += 1
                pipeline.restarts += 1
                log.info(
                    "schema change in the source: restarting the query (%s)",
                    restarts,
                    extra={"restarts": restarts},
                )
                continue
            unreadable = self._unreadable_table(error, writer.tables)
            if unreadable is not None and restarts < MAX_SCHEMA_RESTARTS:
                restarts += 1
                result.restarts += 1
                pipeline.restarts += 1
                pipeline.park_unreadable(*unreadable)
                continue
            pipeline.metrics.record_error("stream")
            lost = self._slot_lost()
            if lost is not None:
                # the slot went (pgcdc drop --force, pg_drop_replication_slot) or was
                # invalidated under the stream: the pipeline's fix, not the source's
                raise PipelineError(lost) from error
            diagnosis = self.failures.diagnosis(error)
            self.failures.record(error, diagnosis)
            hint = "" if diagnosis.fix else spark_hint(error)
            raise PipelineError(
                f"the stream failed: {scrub_secrets(str(diagnosis))}{hint}"
            ) from error
        return ()

    def _writer(self, plan: SourcePlan, state: PipelineState) -> LakeBatchWriter:
        """The batches' writer: the planned tables the lake mirrors (not the parked ones)."""
        pipeline = self.pipeline
        # not those being copied: the stream keeps their changes aside (``held``)
        tables = tuple(t for t in plan.tables if t.table_id in state.tables)
        return LakeBatchWriter(
            lake=str(self.layout.root),
            tables=tables,
            table_columns=table_column_pairs(tables),
            app_id=state.stream_app_id,
            dsn=pipeline.dsn,
            fail_after=pipeline.fail_after,
            kill_at=pipeline.kill_at,
            maintenance=self.config.lake.maintenance(),
            fence=pipeline.lease.check,
            indexed=self.config.lake.write == "indexed",
            copied_at=tuple(
                (table_id, int(Lsn.parse(lsn)))
                for table_id, lsn in sorted(state.copied_at().items())
            ),
            parked=tuple(sorted(state.parked())),
        )

    def _drain_maintenance(self, app_id: str) -> None:
        """Wait for the maintenance the run's batches left due (a run that ends when caught up
        leaves its tables maintained), unless the pipeline is asked to stop meanwhile."""
        worker = worker_for(app_id)
        if worker is None:
            return
        pipeline = self.pipeline
        while not pipeline.stopping.is_set() and pipeline.fatal is None:
            if worker.drain(timeout=1.0):
                return

    def _unreadable_table(
        self, error: BaseException, tables: Iterable[LakeTable]
    ) -> tuple[str, str] | None:
        """(table id, message) when ``error`` is a value of one of ``tables`` that no lake
        column holds and ``[lake] on_table_failure`` parks such a table; None otherwise."""
        from pgcdc.spark.errors import UnreadableValueError, tagged_message

        if self.pipeline.config.lake.on_table_failure == "stop":
            return None
        message = tagged_message(error, UnreadableValueError)
        if message is None:
            return None
        # the message starts with the table's schema.table (longest first: dots in names)
        for table_id in sorted((t.table_id for t in tables), key=len, reverse=True):
            if message.startswith(f"{table_id}: "):
                return table_id, message
        return None

    def _slot_lost(self) -> str | None:
        """After a failed stream: the slot monitor's message when the slot is gone or
        invalidated (or the publication dropped), checked now, else None."""
        pipeline = self.pipeline
        monitor = pipeline.monitor
        if monitor is not None and pipeline.fatal is None:
            try:
                monitor.check()
            except Exception as exc:  # the source unreachable: the stream's error stands
                log.debug("slot check after the stream failed: %s", scrub_secrets(str(exc)))
        return pipeline.fatal


def _stop_between_batches(query: Any, timeout: float = 300.0) -> None:
    """Stop a query when no batch is running (stopping mid-batch interrupts its commits); its
    source's pause file exists, so no trigger plans a new batch meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            active = bool(query.status.get("isTriggerActive"))
        except Exception:  # pragma: no cover - a query that already ended
            break
        if not active:
            break
        time.sleep(0.05)
    query.stop()
