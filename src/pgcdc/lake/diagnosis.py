"""What a failure says: the one line and the fix a user reads.

``diagnose`` sums a failure up: from the JVM's exceptions (``pgcdc.spark.errors.java_causes``,
root cause first) it recognises a full disk (``No space left on device``, ``Disk quota
exceeded``), a read-only file system, permission denied (``AccessDeniedException``) and S3's
refusals (the AWS SDK's error code: ``AccessDenied``, ``NoSuchBucket``, ...; S3A's own
classes), and says the path and the fix, without a stack trace; any other failure is summed up
in one line (``first_line``: the Python exception it wraps, if any, or the Java exception
behind a Py4J call), with a fix for failures of Spark itself (``spark_hint``: its driver out of
memory, its JVM gone). Used by the batch writer, maintenance and the run alike.
"""

from __future__ import annotations

import getpass
import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pgcdc.errors import PgcdcError
from pgcdc.spark.errors import JavaCause, java_causes

__all__ = [
    "Diagnosis",
    "diagnose",
    "error_class",
    "first_line",
    "recognise",
    "spark_hint",
    "spark_reason",
]


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Changed|Again|Exit)): .+")


def first_line(error: BaseException) -> str:
    """What failed, in one line: the Python exception a Spark error wraps, if any."""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if raised:
        return raised[-1][:2000]
    return lines[0][:2000] if lines else type(error).__name__


def error_class(error: BaseException) -> str:
    """The class of the exception that failed: the last one a Spark or Py4J error's text
    names (``java.lang.OutOfMemoryError``, ``RuntimeError``), else the error's own."""
    for line in reversed(str(error).splitlines()):
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            return match.group(1)[:200]
    return type(error).__name__


_OUT_OF_MEMORY = ("OutOfMemoryError", "Java heap space", "GC overhead limit exceeded")
_JVM_GONE = ("Answer from Java side is empty", "Error while receiving", "Connection refused")


def spark_reason(error: BaseException) -> str:
    """Spark's own message in a Py4J error: the Java exception's class and whole message (the
    lines after the Py4J call's, up to the stack trace), on one line: Spark's messages say the
    fix on their second line."""
    lines = str(error).splitlines()
    for at, raw in enumerate(lines):
        line = raw.strip()
        if line.startswith(": "):
            said = [line[2:]]
            for more in lines[at + 1 :]:
                if more.startswith("\t") or not more.strip():
                    break
                said.append(more.strip())
            return " ".join(said)[:1000]
    return first_line(error)


def spark_hint(error: BaseException) -> str:
    """The fix for failures of Spark itself: its driver ran out of memory, or its JVM is gone.
    How a gone JVM ended tells which (``pgcdc.spark.session.driver_exit``, waiting a few
    seconds for one that is exiting): a JVM killed by a signal did not run out of its heap
    (``spark_session`` makes the JVM exit with status 3 on OutOfMemoryError rather than hang)."""
    from pgcdc.spark.session import driver_exit

    text = f"{type(error).__name__}: {error}"
    out_of_memory = any(marker in text for marker in _OUT_OF_MEMORY)
    if not out_of_memory and not any(marker in text for marker in _JVM_GONE):
        return ""
    exit_status = None if out_of_memory else driver_exit()
    out_of_memory = out_of_memory or exit_status == 3
    unconfirmed = (
        "Nothing of the failed batch was confirmed to PostgreSQL: the next start applies it"
    )
    signum = _killed_by(exit_status)
    if signum == signal.SIGKILL and not out_of_memory:
        return (
            f"; Spark's driver JVM was killed by SIGKILL (by another process, or by the kernel "
            f"when the machine ran out of memory). {unconfirmed}. Fix: look for the kernel's "
            "out-of-memory killer in the system log (then give the machine more memory, or "
            '[spark.conf] "spark.driver.memory" less), and run again'
        )
    if signum is not None and not out_of_memory:
        name = signal.Signals(signum).name
        return (
            f"; Spark's driver JVM was stopped by {name} from another process (one that "
            f"signals pgcdc's whole process group or service, or the JVM alone). {unconfirmed}. "
            f"Fix: send {name} to pgcdc's process only (it stops Spark after the batch in "
            "progress), and run again"
        )
    if exit_status is not None and not out_of_memory:
        return (
            f"; Spark's driver JVM exited with status {exit_status} (its last words are "
            f"logged above; pgcdc --log-level DEBUG shows Spark's log too). {unconfirmed}"
        )
    return (
        "; Spark's driver ran out of memory or stopped (a micro-batch holds whole source "
        "transactions, so a very large transaction needs a driver heap to match). Nothing "
        "of the failed batch was confirmed to PostgreSQL. Fix: give the driver more memory, "
        'e.g. [spark.conf] "spark.driver.memory" = "4g", and run again'
    )


def _killed_by(exit_status: int | None) -> int | None:
    """The signal that ended a JVM: one that killed it (status -N), or one whose handler
    made it exit with 128+N (SIGHUP, SIGINT, SIGTERM run the JVM's shutdown hooks first)."""
    if exit_status is None:
        return None
    signum = -exit_status if exit_status < 0 else exit_status - 128
    known = {s.value for s in signal.Signals}
    if exit_status < 0 or signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        return signum if signum in known else None
    return None


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What a failure comes down to: its ``cause`` in a line (no stack trace), ``error`` (the
    class of the exception that failed: the Java root cause's behind a Py4J call), the
    ``path`` it concerns and its ``fix``. ``known``: a failure pgcdc recognised; its cause and
    fix are then pgcdc's words and a path, never a value of a row, and the state keeps them."""

    cause: str
    error: str
    path: str | None = None
    fix: str | None = None
    known: bool = False

    def __str__(self) -> str:
        return f"{self.cause}. Fix: {self.fix}" if self.fix else self.cause


def diagnose(error: BaseException, lake: str | None = None) -> Diagnosis:
    """``error`` reduced to its root cause, with the path and the fix when pgcdc recognises it
    (see the module doc); ``lake``: the lake's root, named when the error names no path."""
    text = first_line(error)
    kind = error_class(error)
    if isinstance(error, PgcdcError):  # pgcdc's own words already, cause and fix
        return Diagnosis(text, kind)
    causes = java_causes(error)
    found = recognise(causes, lake)
    if found is not None:
        return found
    if causes and ("Py4JJavaError" in kind or _PY4J_CALL in text):
        # "An error occurred while calling o639.execute": the Java exceptions say what
        outer, root = causes[0], causes[-1]
        text = _describe(outer) + ("" if root is outer else f"; caused by {_describe(root)}")
        kind = root.java_class
    return Diagnosis(text, kind)


_PY4J_CALL = "An error occurred while calling"


def recognise(causes: Sequence[JavaCause], lake: str | None = None) -> Diagnosis | None:
    """The failure a Java cause chain (outermost first) shows, when pgcdc recognises it (see
    the module doc); ``lake``: the lake's root, named when the chain names no path."""
    for rule in _RULES:
        for cause in reversed(causes):  # the root cause first
            found = rule(cause, causes, lake)
            if found is not None:
                return found
    return None


def _describe(cause: JavaCause) -> str:
    lines = cause.message.strip().splitlines()
    return f"{cause.java_class}: {lines[0][:500]}" if lines else cause.java_class


_PYTHON_EXCEPTION = "org.apache.spark.api.python.PythonException"


def _said(cause: JavaCause, *reasons: str) -> str | None:
    """Which of the operating system's ``reasons`` (strerror texts: Java has no class for
    them) ``cause`` gives, as a file system error's reason or in an I/O error's message (any
    exception's, when only the text of a stack trace is left)."""
    io = cause.from_text or cause.is_a("java.io.IOException", "java.io.UncheckedIOException")
    # a Spark task's Python code (the indexed write's files) failing with an OSError
    io = io or (cause.is_a(_PYTHON_EXCEPTION) and "OSError: " in cause.message)
    for reason in reasons:
        if cause.reason == reason or (io and reason in cause.message):
            return reason
    return None


_URI = re.compile(r"\b((?:file|s3a?|hdfs|abfss?|gs):/[^\s,;'\"()\[\]]*[^\s,;'\"()\[\].:])")
#: java.io's ``<path> (<reason>)``, as FileOutputStream says it
_PATH_AND_REASON = re.compile(r"^(/\S.*) \([^()]+\)$")


def _local(path: str) -> str:
    """A local ``file:`` URI as a path (what the user types)."""
    if path.startswith("file://"):
        return path[len("file://") :] or "/"
    if path.startswith("file:"):
        return path[len("file:") :]
    return path


def _path(causes: Sequence[JavaCause]) -> str | None:
    """The path the failure concerns: the innermost one Java gives (a file system error's
    file, a Spark error's parameter), else one the innermost message names."""
    for cause in reversed(causes):
        if cause.path:
            return _local(cause.path)
    for cause in reversed(causes):
        match = _URI.search(cause.message) or _PATH_AND_REASON.match(cause.message.strip())
        if match is not None:
            return _local(match.group(1))
    return None


#: Spark's classes that write a streaming query's checkpoint (offset and commit logs)
_CHECKPOINT_WRITERS = ("MetadataLog", "CheckpointFileManager")


def _in_checkpoint(causes: Sequence[JavaCause]) -> bool:
    """Whether the root cause was thrown writing the streaming checkpoint (in the lake)."""
    return any(name in frame for frame in causes[-1].frames for name in _CHECKPOINT_WRITERS)


def _no_space(cause: JavaCause, causes: Sequence[JavaCause], lake: str | None) -> Diagnosis | None:
    said = _said(cause, "No space left on device", "Disk quota exceeded")
    if said is None:
        return None
    path = _path(causes)
    writing = "" if path is None else f" writing {path}"
    if path is None and lake and _in_checkpoint(causes):
        path = f"{lake}/_pgcdc"
        writing = f" writing the streaming checkpoint in {path}"
    if path is not None:
        where = f"the file system that holds {path}"
    else:
        lake_text = f" ({lake})" if lake else ""
        where = (
            f"the lake's file system{lake_text} or Spark's local directory (spark.local.dir, "
            "the temporary directory by default)"
        )
    return Diagnosis(
        f"{said} ({cause.java_class}){writing}",
        cause.java_class,
        path,
        f"free space on {where} (df shows how much is left; a disk quota limits its user), "
        "or give the lake a larger one, then run pgcdc run again: what failed is done again",
        known=True,
    )


def _read_only(cause: JavaCause, causes: Sequence[JavaCause], lake: str | None) -> Diagnosis | None:
    said = _said(cause, "Read-only file system") or (
        "Read-only file system" if cause.is_a("java.nio.file.ReadOnlyFileSystemException") else None
    )
    if said is None:
        return None
    path = _path(causes) or lake
    return Diagnosis(
        f"{said} ({cause.java_class})" + (f" writing {path}" if path else ""),
        cause.java_class,
        path,
        "mount that file system read-write, or point lake.path at a writable place, then run "
        "pgcdc run again",
        known=True,
    )


#: S3's error codes of a request refused for its credentials or their permissions
_S3_DENIED = frozenset({"AccessDenied", "AllAccessDisabled", "AccountProblem"})
_S3_CREDENTIALS = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidSecurity",
    }
)
_S3_NO_BUCKET = ("org.apache.hadoop.fs.s3a.UnknownStoreException",)
_S3_NO_CREDENTIALS = (
    "org.apache.hadoop.fs.s3a.auth.NoAuthWithAWSException",
    "org.apache.hadoop.fs.s3a.auth.NoAwsCredentialsException",
)
_S3_GRANTS = (
    "s3:ListBucket on the bucket and s3:GetObject, s3:PutObject and s3:DeleteObject on the "
    "lake's prefix (docs/s3.md)"
)


def _s3(cause: JavaCause, causes: Sequence[JavaCause], lake: str | None) -> Diagnosis | None:
    code = cause.error_code
    if code is None and cause.is_a(*_S3_NO_BUCKET):
        code = "NoSuchBucket"
    if code is None and not cause.is_a(*_S3_NO_CREDENTIALS):
        return None
    path = _path(causes) or lake
    on = f" for {path}" if path else ""
    status = f", HTTP {cause.status}" if cause.status else ""
    if code is None:
        cause_text = f"no AWS credentials found ({cause.java_class}){on}"
        fix = (
            "give pgcdc and Spark credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            f"AWS_PROFILE, or an instance or pod role, allowed {_S3_GRANTS}"
        )
    elif code == "NoSuchBucket":
        bucket = path[len("s3a://") :].split("/", 1)[0] if path and "://" in path else None
        cause_text = f"S3 has no bucket {bucket or ''}".rstrip() + f" (NoSuchBucket{status}){on}"
        fix = (
            "create the bucket, or correct lake.path (and [lake.s3] endpoint and region, which "
            "name where it is)"
        )
    elif code in _S3_CREDENTIALS:
        cause_text = f"S3 refused the credentials ({code}{status}){on}"
        fix = (
            "set the right AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN "
            "for temporary ones, renewed before they expire), or the profile or role that "
            "holds them"
        )
    elif code in _S3_DENIED:
        cause_text = f"S3 denied access ({code}{status}){on}"
        fix = f"give the credentials pgcdc and Spark use {_S3_GRANTS}"
    else:
        cause_text = f"S3 refused a request ({code}{status}){on}"
        fix = (
            f"see what S3's error code {code} means "
            "(https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html); a busy "
            "or unavailable store (SlowDown, HTTP 503) passes: run pgcdc run again"
        )
    return Diagnosis(cause_text, cause.java_class, path, fix, known=True)


def _denied(cause: JavaCause, causes: Sequence[JavaCause], lake: str | None) -> Diagnosis | None:
    if not (
        cause.is_a("java.nio.file.AccessDeniedException")
        or _said(cause, "Permission denied") is not None
    ):
        return None
    path = _path(causes) or lake
    if path is not None and "://" in path and not path.startswith("file:"):
        return None  # a store's refusal: its error code says more (``_s3``)
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid
        user = "this user"
    return Diagnosis(
        f"Permission denied ({cause.java_class})" + (f" on {path}" if path else ""),
        cause.java_class,
        path,
        f"let the user pgcdc runs as ({user}) write the lake's folders (chown or chmod), or "
        "run pgcdc as their owner, then run pgcdc run again",
        known=True,
    )


#: in this order: an S3 refusal is also an AccessDeniedException, which says less
_RULES: tuple[Callable[[JavaCause, Sequence[JavaCause], str | None], Diagnosis | None], ...] = (
    _no_space,
    _read_only,
    _s3,
    _denied,
)
