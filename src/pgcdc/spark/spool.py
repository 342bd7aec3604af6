"""The spool: every pgoutput message received, appended to local segment files.

The driver-side receiver writes each message as a record (``u32`` big-endian length, then the
bytes) at a global byte offset; records never straddle segment files (``segment_bytes`` each,
named by their first offset). Nothing is kept in memory but a write buffer: the transaction
index holds offsets only, and the data endpoint sends byte ranges straight from the files to
executors (``os.sendfile``). ``release_unneeded`` deletes the segments below an offset that no
range still needed touches, once Spark has committed every batch that read them. The directory
is private to the process and removed by ``close()``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from pgcdc.errors import PgcdcError

__all__ = ["RECORD_HEADER", "Spool", "SpoolReleasedError"]

log = logging.getLogger("pgcdc.spark")

#: Record header: the message length.
RECORD_HEADER = struct.Struct("!I")
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


_PREFIX = "pgcdc-spool-"


#: In each spool directory: a file its process holds an exclusive flock on while it lives
_OWNER = ".owner"


def _owned(directory: Path) -> int:
    """Lock the spool's owner file for this process's life (the kernel drops the lock when it
    ends, however it ends); its descriptor."""
    draft = directory / f"{_OWNER}.new"
    fd = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        draft.rename(directory / _OWNER)  # a sweeper never sees it unlocked
    except BaseException:
        os.close(fd)
        raise
    return fd


def _abandoned(directory: Path) -> bool:
    """Whether no live process owns the spool. A process id says nothing here: a driver in
    another PID namespace (a container sharing the folder) has ids this one cannot see."""
    try:
        fd = os.open(directory / _OWNER, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return _legacy_abandoned(directory)
    except OSError:  # another user's spool (mode 0700): not ours to judge
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its owner lives
        return False
    finally:
        os.close(fd)  # also releases the lock taken just now
    return True


def _legacy_abandoned(directory: Path) -> bool:
    """A spool without an owner file: written by an earlier pgcdc, or its process ended while
    creating it. Judged by the process id in its name, once it is an hour old (never one being
    created now)."""
    try:
        age = time.time() - directory.stat().st_mtime
    except OSError:
        return False
    pid_text = directory.name[len(_PREFIX) :].split("-", 1)[0]
    if age < 3600 or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _sweep(base: Path) -> None:
    """Delete the spools of reader processes that ended without cleaning up (Spark may end
    them with a signal)."""
    for path in base.glob(f"{_PREFIX}*-*"):
        if path.is_dir() and _abandoned(path):
            log.info("removing the spool of an ended process: %s", path)
            shutil.rmtree(path, ignore_errors=True)


class SpoolReleasedError(PgcdcError):
    """A byte range asked for was already released (or never written)."""


class Spool:
    """Append-only, segment-file backed record log with global byte offsets. Thread-safe."""

    def __init__(self, directory: str | None = None, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES):
        if segment_bytes < 4096:
            raise ValueError(f"segment_bytes must be at least 4096, not {segment_bytes}")
        base = Path(directory) if directory else Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        _sweep(base)
        self.directory = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base))
        self._owner = _owned(self.directory)
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._segments: list[int] = []  # first offsets of the live segments, ascending
        self._file: BinaryIO | None = None
        self._segment_start = 0
        self._size = 0  # the global offset the next record gets
        self._flushed = 0  # everything below is readable from the files
        self._released = 0  # everything below may be gone
        self._holes: dict[int, int] = {}  # live-list segments deleted: first offset -> bytes
        self._closed = False
        self.written_bytes = 0

    # -- writing ---------------------------------------------------------------------------
    def _path(self, start: int) -> Path:
        return self.directory / f"{start:020d}.seg"

    def append(self, payload: bytes) -> int:
        """Append one message; its record's global offset."""
        length = len(payload)
        record = RECORD_HEADER.size + length
        with self._lock:
            if self._closed:
                raise ValueError("the spool is closed")
            file = self._file
            if file is None or (
                self._size > self._segment_start
                and self._size - self._segment_start + record > self.segment_bytes
            ):
                if file is not None:
                    file.close()
                self._segment_start = self._size
                file = self._file = open(self._path(self._size), "wb", buffering=1 << 20)  # noqa: SIM115
                self._segments.append(self._size)
            offset = self._size
            file.write(RECORD_HEADER.pack(length))
            file.write(payload)
            self._size += record
            self.written_bytes += record
            return offset

    def flush(self) -> None:
        """Make everything appended so far readable by ``read_range``/``send_range``."""
        with self._lock:
            if self._file is not None:
                self._file.flush()
            self._flushed = self._size

    @property
    def size(self) -> int:
        """The offset the next record gets."""
        return self._size

    @property
    def released(self) -> int:
        return self._released

    @property
    def disk_bytes(self) -> int:
        """Bytes held in segment files."""
        with self._lock:
            held = self._size - (self._segments[0] if self._segments else self._size)
            return held - sum(self._holes.values())

    # -- reading ---------------------------------------------------------------------------
    def _pieces(self, start: int, end: int) -> list[tuple[Path, int, int]]:
        """(file, offset in file, length) pieces of the range; lock held."""
        if start < self._released or end > self._flushed or start > end:
            raise SpoolReleasedError(
                f"spool range {start}-{end} is not available (released below {self._released}, "
                f"written up to {self._flushed})"
            )
        pieces = []
        index = 0
        segments = self._segments
        while index + 1 < len(segments) and segments[index + 1] <= start:
            index += 1
        position = start
        while position < end:
            seg_start = segments[index]
            if seg_start in self._holes:
                raise SpoolReleasedError(
                    f"spool range {start}-{end} is not available (segment {seg_start} was released)"
                )
            seg_end = segments[index + 1] if index + 1 < len(segments) else self._size
            stop = min(end, seg_end)
            pieces.append((self._path(seg_start), position - seg_start, stop - position))
            position = stop
            index += 1
        return pieces

    def readable(self, start: int, end: int) -> bool:
        """Whether ``[start, end)`` can be read (written, and nothing of it released)."""
        with self._lock:
            try:
                self._pieces(start, end)
            except SpoolReleasedError:
                return False
            return True

    def read_range(self, start: int, end: int) -> bytes:
        """The bytes of ``[start, end)`` (whole records)."""
        with self._lock:
            pieces = self._pieces(start, end)
        out = bytearray()
        for path, offset, length in pieces:
            with open(path, "rb") as file:
                file.seek(offset)
                out += file.read(length)
        return bytes(out)

    def iter_records(self, start: int, end: int) -> Iterator[bytes]:
        """The messages of the records in ``[start, end)``."""
        data = self.read_range(start, end)
        position = 0
        unpack = RECORD_HEADER.unpack_from
        while position < len(data):
            (length,) = unpack(data, position)
            position += RECORD_HEADER.size
            yield data[position : position + length]
            position += length

    def send_range(self, sock: socket.socket, start: int, end: int) -> int:
        """Send ``[start, end)`` to a socket (``socket.sendfile``: zero-copy where the OS can,
        and it honours the socket's timeout); the bytes sent."""
        with self._lock:
            pieces = self._pieces(start, end)
            # open while holding the lock so release() cannot delete a file in between
            files = [(open(path, "rb"), offset, length) for path, offset, length in pieces]  # noqa: SIM115
        sent = 0
        try:
            for file, offset, length in files:
                count = sock.sendfile(file, offset, length)
                if count != length:
                    raise ConnectionError("the peer closed the connection")
                sent += count
        finally:
            for file, _, _ in files:
                file.close()
        return sent

    # -- releasing -------------------------------------------------------------------------
    def release_unneeded(self, needed: list[tuple[int, int]], below: int) -> int:
        """Delete the segments that end at or below ``below`` and that none of the ``needed``
        ``[start, end)`` byte ranges touches; how many were deleted."""
        removed = 0
        with self._lock:
            below = min(below, self._size)
            segments = self._segments
            for i in range(len(segments) - 1):  # never the segment being written
                start, stop = segments[i], segments[i + 1]
                if stop > below:
                    break
                if start in self._holes or any(a < stop and b > start for a, b in needed):
                    continue
                self._path(start).unlink(missing_ok=True)
                self._holes[start] = stop - start
                removed += 1
            # below the lowest range needed nothing is readable any more, deleted or not
            floor = min([below, *(a for a, _ in needed)])
            self._released = max(self._released, floor)
            while len(segments) > 1 and segments[0] in self._holes:
                del self._holes[segments.pop(0)]
                self._released = max(self._released, segments[0])
        if removed:
            log.debug("spool: released %d segment(s) below offset %d", removed, below)
        return removed

    def close(self) -> None:
        """Delete every file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None
            self._segments.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
        os.close(self._owner)
