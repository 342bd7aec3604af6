"""``pgcdc.spark.console.ConsoleRelay``: what the driver JVM writes on its standard output and
error becomes log records (issue 41): pgcdc's log4j 2 lines with the JVM's level, logger and
stack trace as fields, printed lines (Delta's VACUUM) at DEBUG, and the JVM's own words on
standard error as warnings, a Java stack trace as one record. The JVM's real console is
tested end to end in tests/cli/test_run_and_demo.py."""

from __future__ import annotations

import json
import logging
import os

import pytest

from pgcdc.spark.console import ConsoleRelay


def test_lines_become_records(caplog: pytest.LogCaptureFixture) -> None:
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    relay = ConsoleRelay({"stdout": out_read, "stderr": err_read})
    relay.start()
    event = {
        "jvm_level": "ERROR",
        "jvm_logger": "org.apache.spark.executor.Executor",
        "message": "Exception in task 0.0",
        "thrown": "java.io.IOException: No space left on device\n\tat x.y(Z.java:1)",
    }
    with caplog.at_level(logging.DEBUG, logger="pgcdc.spark.jvm"):
        os.write(out_write, b"Deleted 4 files and directories in a total of 4 directories.\n")
        os.write(err_write, json.dumps(event).encode() + b"\n")
        os.write(err_write, b"WARNING: Using incubator modules: jdk.incubator.vector\n")
        os.write(err_write, b'Exception in thread "main" java.lang.IllegalStateException: x\n')
        os.write(err_write, b"\tat a.b.C.d(C.java:1)\nCaused by: java.io.IOException: y\n")
        os.write(err_write, b"Terminating due to java.lang.OutOfMemoryError: Java heap")
        os.close(out_write)
        os.close(err_write)
        relay.join(10)
    assert not relay.is_alive()
    seen = [(r.levelname, r.getMessage(), r.exc_text) for r in caplog.records]
    assert sorted(seen, key=str) == sorted(
        [
            (
                "DEBUG",
                "Deleted 4 files and directories in a total of 4 directories.",
                None,
            ),
            ("DEBUG", "ERROR Executor: Exception in task 0.0", event["thrown"]),
            ("DEBUG", "WARNING: Using incubator modules: jdk.incubator.vector", None),
            (
                "WARNING",
                'Exception in thread "main" java.lang.IllegalStateException: x',
                "\tat a.b.C.d(C.java:1)\nCaused by: java.io.IOException: y",
            ),
            ("WARNING", "Terminating due to java.lang.OutOfMemoryError: Java heap", None),
        ],
        key=str,
    )
    (logged,) = [r for r in caplog.records if getattr(r, "jvm_logger", None)]
    assert logged.__dict__["jvm_level"] == "ERROR"
