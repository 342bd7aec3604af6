"""A pipeline's continuous run in a background thread, as the tests that disturb a running
pipeline (network cuts, server restarts, dropped publications, schema changes) need it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from pgcdc.lake.pipeline import Pipeline


class Background:
    """``pipeline.run()`` (continuous) in a thread: what it raised (``failures``), whether it
    started, and ``stop``, which the fixture also calls at teardown."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.failures: list[BaseException] = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.pipeline.run(on_started=lambda _p: self.started.set())
        except BaseException as exc:
            self.failures.append(exc)
        self.started.set()

    def start(self, timeout: float = 300) -> Background:
        """Start the run; return once its stream started (failing the test if it did not)."""
        self.thread.start()
        started = self.started.wait(timeout)
        causes = [str(f.__cause__ or f)[:3000] for f in self.failures]
        assert started and not self.failures, causes
        return self

    def join(self, timeout: float) -> bool:
        """Wait for the run to end on its own; whether it did."""
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def stop(self, timeout: float = 300) -> None:
        """Stop the run after its current batch and wait for it."""
        if self.thread.is_alive():
            self.pipeline.stop()
            self.thread.join(timeout)


@pytest.fixture
def background() -> Iterator[Callable[[Pipeline], Background]]:
    """``background(pipeline)``: a ``Background`` of it, stopped at teardown."""
    runs: list[Background] = []

    def make(pipeline: Pipeline) -> Background:
        run = Background(pipeline)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop()
