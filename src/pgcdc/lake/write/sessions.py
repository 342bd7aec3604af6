"""Spark sessions for the threads that write a batch's tables (and commit them): each thread
needs a session of its own, because a session's settings carry its writes' application
transaction and maintenance's options."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

__all__ = ["in_sessions"]

_T = TypeVar("_T")
_R = TypeVar("_R")


class _SessionPool:
    """Idle Spark sessions for the threads writing tables, reused from batch to batch: a
    session per write would leave the context a session (and its listeners) per table and
    batch until a garbage collection cleans them up. Sessions of a stopped context (another
    ``SparkContext`` object: compared by identity, as an application id is three gateway
    calls) are dropped."""

    def __init__(self) -> None:
        self._idle: list[tuple[Any, Any]] = []
        self._lock = threading.Lock()

    def borrow(self, spark: Any) -> Any:
        context = spark.sparkContext
        with self._lock:
            self._idle = [(c, s) for c, s in self._idle if c is context]
            if self._idle:
                return self._idle.pop()[1]
        return spark.newSession()

    def give_back(self, session: Any) -> None:
        with self._lock:
            self._idle.append((session.sparkContext, session))


_SESSIONS = _SessionPool()


def in_sessions(
    spark: Any, work: Callable[[Any, _T], _R], items: Sequence[_T], workers: int
) -> list[_R]:
    """``work(session, item)`` for each item, up to ``workers`` at the same time, each in a
    Spark session of its own (a session's settings carry its writes' application
    transaction, and maintenance's options); what each returned, in order. Every item runs
    to its end; then the first error is raised."""
    if len(items) <= 1 or workers <= 1:
        return [work(spark, item) for item in items]

    def run(item: _T) -> _R:
        session = _SESSIONS.borrow(spark)
        try:
            return work(session, item)
        finally:
            _SESSIONS.give_back(session)

    with ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="pgcdc-write") as pool:
        futures = [pool.submit(run, item) for item in items]
        wait(futures)
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]
