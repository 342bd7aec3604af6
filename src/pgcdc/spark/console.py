"""The driver JVM's console: what the JVM prints is logged through pgcdc's logger.

The driver JVM that ``spark_session`` launches (``launch_gateway``) writes its standard output
and error into pipes this process reads: a thread (``ConsoleRelay``) logs each line, so that
with ``pgcdc --log-format json`` every line pgcdc's process writes is JSON, and so that Spark's
start-up notices stay off a user's terminal:

* Spark's log (log4j 2 in the JVM) is set by this package's ``log4j2.properties``, passed with
  ``-Dlog4j2.configurationFile`` (``log4j2_option``; one later in
  ``spark.driver.extraJavaOptions`` replaces it; none when the path has white space):
  warnings and errors, one JSON line each.
  pgcdc reports every failure that reaches it, reduced to its root cause
  (``pgcdc.lake.run.failures``), so Spark's own account of it (each task's error, with Java stack
  traces) is logged at DEBUG: logger ``pgcdc.spark.jvm``, fields ``jvm_level`` and
  ``jvm_logger``, the stack trace as the record's exception.
* Other lines of its standard output (Delta's VACUUM prints what it deleted) are logged at
  DEBUG; other lines of its standard error (the JVM's own: why it cannot start, an uncaught
  exception, an exit on OutOfMemoryError) at WARNING, a Java stack trace as one record.

A JVM that pgcdc does not launch (one ``spark-submit`` started, or one running already) keeps
its own console and log configuration.

Py4J's callback server logs, at ERROR, every exception a Python callback raises (a
``foreachBatch`` function's), with its traceback and, for a Py4J error, the whole Java stack
trace, before it hands the exception to the JVM, which fails the query with it: whoever runs
the query reports that failure. ``quiet_callback_errors`` keeps those records for DEBUG.
"""

from __future__ import annotations

import json
import logging
import os
import re
import selectors
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "LOG4J2_CONFIG",
    "ConsoleRelay",
    "launch_gateway",
    "log4j2_option",
    "quiet_callback_errors",
]

log = logging.getLogger("pgcdc.spark.jvm")

#: pgcdc's log4j 2 configuration of the driver JVM (package data)
LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")

#: a line of standard error that continues the one before it (a Java stack trace)
_CONTINUATION = re.compile(r"(\s|Caused by: |Suppressed: )")
#: what the JVM says at every start with Spark's options: not a problem
_NOTICES = ("WARNING: Using incubator modules",)
#: seconds a line of standard error waits for its stack trace's next line
_GATHER = 0.2


def log4j2_option() -> str | None:
    """The JVM option that gives the driver pgcdc's log4j 2 configuration; None when its path
    has white space or quotes (Spark splits the JVM's options at white space: Spark's default
    configuration applies then)."""
    path = str(LOG4J2_CONFIG)
    if any(c.isspace() or c in "'\"" for c in path):
        return None
    return f"-Dlog4j2.configurationFile={path}"


def _emit(level: int, message: str, *, trace: str | None = None, **extra: Any) -> None:
    if not log.isEnabledFor(level):
        return
    try:
        record = log.makeRecord(log.name, level, __file__, 0, "%s", (message,), None, extra=extra)
        record.exc_text = trace or None  # formatted by every handler, as a traceback is
        log.handle(record)
    except Exception:  # the relay reads on whatever happens: a JVM whose pipe is full stops
        return


def _log4j_event(line: str) -> bool:
    """Log one of ``log4j2.properties``' JSON lines; whether ``line`` was one."""
    if not line.startswith('{"jvm_level"'):
        return False
    try:
        event = json.loads(line)
    except ValueError:
        return False
    if not isinstance(event, dict):
        return False
    level = str(event.get("jvm_level", ""))
    logger = str(event.get("jvm_logger", ""))
    _emit(
        logging.DEBUG,
        f"{level} {logger.rsplit('.', 1)[-1]}: {event.get('message', '')}",
        trace=str(event.get("thrown") or "").strip(),
        jvm_level=level,
        jvm_logger=logger,
    )
    return True


class ConsoleRelay(threading.Thread):
    """Reads the JVM's standard output and error (pipes' read ends, ``streams``: name ->
    file descriptor, closed at their end) and logs their lines (see the module doc)."""

    def __init__(self, streams: Mapping[str, int]) -> None:
        super().__init__(name="pgcdc-jvm-console", daemon=True)
        self._names = {fd: name for name, fd in streams.items()}
        self._pending: list[str] = []  # a line of standard error and its stack trace
        self._since = 0.0

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for fd, name in self._names.items():
                selector.register(fd, selectors.EVENT_READ, name)
            partial = dict.fromkeys(self._names, b"")
            while selector.get_map():
                wait = None if not self._pending else max(0.0, self._since + _GATHER - time.time())
                ready = selector.select(wait)
                if not ready:
                    self._flush()
                    continue
                for key, _ in ready:
                    fd = key.fd
                    try:
                        data = os.read(fd, 1 << 16)
                    except OSError:
                        data = b""
                    lines = (partial[fd] + data).split(b"\n")
                    partial[fd] = lines.pop() if data else b""
                    if not data and lines == [b""]:
                        lines = []
                    for raw in lines:
                        self._line(key.data, raw.decode("utf-8", "replace").rstrip("\r"))
                    if not data:
                        selector.unregister(fd)
                        os.close(fd)
        self._flush()

    def _line(self, stream: str, line: str) -> None:
        if stream == "stderr" and self._pending and _CONTINUATION.match(line):
            self._pending.append(line)
            return
        self._flush()
        if _log4j_event(line) or not line.strip():
            return
        if stream == "stdout":
            _emit(logging.DEBUG, line, jvm_stream=stream)
        else:
            self._pending = [line]
            self._since = time.time()

    def _flush(self) -> None:
        if not self._pending:
            return
        first, *trace = self._pending
        self._pending = []
        level = logging.DEBUG if first.startswith(_NOTICES) else logging.WARNING
        _emit(level, first, trace="\n".join(trace), jvm_stream="stderr")


def launch_gateway(settings: Mapping[str, str]) -> None:
    """Launch the driver JVM with ``settings`` (``spark-submit``'s ``--conf`` options, as
    ``SparkSession.builder`` would pass them) and its console relayed, as the gateway of the
    next SparkContext of this process. The relay starts first: a JVM that cannot start says
    why on its standard error, and that is logged before this raises pyspark's error."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway as pyspark_launch

    conf = SparkConf(loadDefaults=False)
    conf.setAll(list(settings.items()))
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    relay = ConsoleRelay({"stdout": out_read, "stderr": err_read})
    relay.start()
    try:
        gateway = pyspark_launch(  # type: ignore[no-untyped-call]
            conf, popen_kwargs={"stdout": out_write, "stderr": err_write}
        )
    except BaseException:
        os.close(out_write)
        os.close(err_write)
        relay.join(5.0)  # the JVM exited: its last words, before the error that follows
        raise
    os.close(out_write)
    os.close(err_write)
    SparkContext._ensure_initialized(gateway=gateway)


#: how Py4J's callback servers log an exception a Python callback raised
_CALLBACK_ERROR = "There was an exception while executing the Python Proxy"
_CALLBACK_LOGGERS = ("py4j.clientserver", "py4j.java_gateway")


class _CallbackErrors(logging.Filter):
    """Lets a callback's exception through only when the root logger shows DEBUG records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(_CALLBACK_ERROR):
            return True
        return logging.getLogger().isEnabledFor(logging.DEBUG)


_CALLBACK_FILTER = _CallbackErrors()


def quiet_callback_errors() -> None:
    """Keep Py4J's records of a Python callback's exception for DEBUG (idempotent)."""
    for name in _CALLBACK_LOGGERS:
        logger = logging.getLogger(name)
        if _CALLBACK_FILTER not in logger.filters:
            logger.addFilter(_CALLBACK_FILTER)
