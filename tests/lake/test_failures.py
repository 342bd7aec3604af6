"""``pgcdc.lake.diagnosis.diagnose``: a failure from the JVM reduced to its root cause, with the
path and the fix (issue 41). A full disk is tested for real in tests/chaos/test_full_disk.py;
here a Py4J error of the suite's JVM, the text of a Java stack trace (all that is left of an
error that crossed a Python callback), and the chains S3 gives (the AWS SDK's error code below
S3A's exceptions: their classes are not on the suite's class path, so the chains are written
out as ``java_causes`` reads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.lake.diagnosis import diagnose, recognise
from pgcdc.spark.errors import JavaCause, java_causes

LAKE = "s3a://analytics/pgcdc/shop"
OBJECT = f"{LAKE}/public/items/_delta_log/00000000000000000007.json"
S3A_DENIED = JavaCause(
    "java.nio.file.AccessDeniedException",
    f"{OBJECT}: PUT 0-byte object  on {OBJECT}: AccessDenied",
    frozenset(
        {
            "java.nio.file.AccessDeniedException",
            "java.nio.file.FileSystemException",
            "java.io.IOException",
        }
    ),
    path=OBJECT,
)
SPARK = JavaCause(
    "org.apache.spark.SparkException",
    "Job aborted.",
    frozenset({"org.apache.spark.SparkException", "org.apache.spark.SparkThrowable"}),
)


def sdk_error(code: str, status: int) -> JavaCause:
    name = "software.amazon.awssdk.services.s3.model.S3Exception"
    return JavaCause(
        name,
        f"(Service: S3, Status Code: {status}, Request ID: X)",
        frozenset({name, "software.amazon.awssdk.awscore.exception.AwsServiceException"}),
        error_code=code,
        status=status,
    )


@pytest.mark.parametrize(
    ("code", "status", "said", "fix"),
    [
        ("AccessDenied", 403, "S3 denied access (AccessDenied, HTTP 403)", "s3:PutObject"),
        ("InvalidAccessKeyId", 403, "S3 refused the credentials", "AWS_SECRET_ACCESS_KEY"),
        ("NoSuchBucket", 404, "S3 has no bucket analytics (NoSuchBucket", "create the bucket"),
        ("SlowDown", 503, "S3 refused a request (SlowDown, HTTP 503)", "ErrorResponses"),
    ],
)
def test_s3_refusals_by_their_error_code(code: str, status: int, said: str, fix: str) -> None:
    found = recognise([SPARK, S3A_DENIED, sdk_error(code, status)], LAKE)
    assert found is not None and found.known and found.cause.startswith(said), found
    assert found.path == OBJECT and OBJECT in found.cause
    assert found.fix is not None and fix in found.fix


def test_s3a_classes_without_an_error_code() -> None:
    unknown = "org.apache.hadoop.fs.s3a.UnknownStoreException"
    found = recognise([SPARK, JavaCause(unknown, "s3a://gone/lake", frozenset({unknown}))])
    assert found is not None
    assert found.cause == "S3 has no bucket gone (NoSuchBucket) for s3a://gone/lake", found
    none = "org.apache.hadoop.fs.s3a.auth.NoAuthWithAWSException"
    found = recognise([SPARK, JavaCause(none, "No AWS Credentials", frozenset({none}))], LAKE)
    assert found is not None and found.cause.startswith("no AWS credentials found")
    assert "AWS_PROFILE" in str(found)


def test_a_local_permission_denied() -> None:
    denied = "java.nio.file.AccessDeniedException"
    path = "/srv/lake/public/items/part-0.parquet"
    found = recognise([SPARK, JavaCause(denied, path, frozenset({denied}), path=path)])
    assert found is not None
    assert found.cause == f"Permission denied ({denied}) on {path}"
    assert found.fix is not None and "chown or chmod" in found.fix


def test_a_py4j_error_says_what_java_threw(spark: Any, tmp_path: Path) -> None:
    """Not "An error occurred while calling o12.<init>": what Java said, read through Py4J
    from the exception itself or from the pyspark error that captured it."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException

    jvm = spark.sparkContext._jvm
    missing = tmp_path / "missing"
    with pytest.raises(Py4JJavaError) as raised:
        jvm.java.io.FileInputStream(str(missing))
    (cause,) = java_causes(raised.value)
    assert cause.java_class == "java.io.FileNotFoundException"
    assert "java.io.IOException" in cause.classes  # its superclasses too
    found = diagnose(raised.value)
    assert not found.known and found.error == "java.io.FileNotFoundException"
    assert found.cause == f"java.io.FileNotFoundException: {missing} (No such file or directory)"

    with pytest.raises(CapturedException) as captured:
        jvm.java.lang.Integer.parseInt("pgcdc")
    (cause,) = java_causes(captured.value)
    assert cause.java_class == "java.lang.NumberFormatException"
    assert cause.message == 'For input string: "pgcdc"'


def test_the_text_of_a_stack_trace_is_read_when_nothing_else_is_left() -> None:
    """A ``foreachBatch`` function's Py4J error comes back from the JVM as the text of its
    traceback; the root cause is read from its ``Caused by`` lines."""
    text = """py4j.protocol.Py4JJavaError: An error occurred while calling o971.execute.
: org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed while writing rows to \
file:/srv/lake/public/items.history. SQLSTATE: 58030
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.taskFailedWhileWritingRowsError(x)
Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device
\tSuppressed: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device
Caused by: java.io.IOException: No space left on device
\t... 40 more
"""
    found = diagnose(RuntimeError(text), "/srv/lake")
    assert found.known and found.error == "java.io.IOException"
    assert found.cause == (
        "No space left on device (java.io.IOException) writing /srv/lake/public/items.history"
    )
    assert found.fix is not None
    assert found.fix.startswith("free space on the file system that holds /srv/lake/public/")
