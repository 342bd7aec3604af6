"""A pipeline's run in a background thread, as the tests that disturb a running pipeline
(network cuts, server restarts, dropped publications, schema changes, a second process on the
lake) need it: the one helper for it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from pgcdc.lake.run.pipeline import Pipeline, RunResult


class Background:
    """``pipeline.run()`` in a thread (continuous, or ``until_caught_up``): what it returned
    (``result``) or raised (``failures``), whether its stream started, and ``stop``, which the
    fixture also calls at teardown."""

    def __init__(self, pipeline: Pipeline, *, until_caught_up: bool = False) -> None:
        self.pipeline = pipeline
        self.until_caught_up = until_caught_up
        self.result: RunResult | None = None
        self.failures: list[BaseException] = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.result = self.pipeline.run(
                until_caught_up=self.until_caught_up, on_started=lambda _p: self.started.set()
            )
        except BaseException as exc:
            self.failures.append(exc)
        self.started.set()

    def launch(self) -> Background:
        """Start the run and return at once (a test that holds it before its stream starts)."""
        self.thread.start()
        return self

    def start(self, timeout: float = 300) -> Background:
        """Start the run; return once its stream started (failing the test if it did not)."""
        self.launch()
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
def background() -> Iterator[Callable[..., Background]]:
    """``background(pipeline, until_caught_up=False)``: a ``Background`` of it, stopped at
    teardown."""
    runs: list[Background] = []

    def make(pipeline: Pipeline, *, until_caught_up: bool = False) -> Background:
        run = Background(pipeline, until_caught_up=until_caught_up)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop()
