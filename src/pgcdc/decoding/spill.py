"""Bounded buffering of transactions' messages: in memory up to a limit, then on disk.

Every transaction the assembler holds until its commit keeps its messages in an
``ItemBuffer``: the raw pgoutput message bytes (compact, and decodable again at delivery) with
their WAL positions. A ``SpillPool`` accounts the memory of all buffers together, like
PostgreSQL's ``logical_decoding_work_mem``: when the total exceeds the limit, the buffer holding
the most memory writes its in-memory messages to its spill file (``length, lsn, bytes`` records)
in a private temporary directory. Reading a buffer back yields the spilled messages, then the
in-memory ones, in order, one at a time. Buffers can be truncated back to a mark (a
subtransaction's first message, for a subtransaction abort), in memory or on disk; files are
deleted when their transaction ends and the directory when the pool closes.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tempfile
import weakref
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["DEFAULT_MEMORY_LIMIT", "ITEM_OVERHEAD", "ItemBuffer", "Mark", "SpillPool"]

log = logging.getLogger(__name__)

#: Default limit on buffered message bytes across all transactions (64 MiB).
DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024
#: Bytes accounted per buffered message besides its payload: the bytes object's header (33),
#: its list slot (8) and its LSN slot (8).
ITEM_OVERHEAD = 49
_RECORD = struct.Struct("!IQ")  # payload length, lsn
_READ_BUFFER = 1 << 20


class Mark:
    """A position in an ``ItemBuffer`` (item index, and byte offset once it is on disk)."""

    __slots__ = ("index", "offset")

    def __init__(self, index: int) -> None:
        self.index = index
        self.offset = -1

    def __repr__(self) -> str:
        return f"Mark({self.index}, offset={self.offset})"


class ItemBuffer:
    """One transaction's buffered messages. Create with ``SpillPool.buffer``."""

    __slots__ = (
        "_file",
        "_file_size",
        "_lsns",
        "_marks",
        "_path",
        "_payloads",
        "_pool",
        "closed",
        "count",
        "label",
        "memory_bytes",
        "spilled",
    )

    def __init__(self, pool: SpillPool, label: str) -> None:
        self._pool = pool
        self.label = label
        self._payloads: list[bytes] = []
        self._lsns = array("Q")
        self._marks: list[Mark] = []
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._file_size = 0
        #: Messages buffered in all (on disk and in memory).
        self.count = 0
        #: Messages on disk (the first ``spilled`` of ``count``).
        self.spilled = 0
        self.memory_bytes = 0
        self.closed = False

    def append(self, payload: bytes, lsn: int) -> None:
        self._payloads.append(payload)
        self._lsns.append(lsn)
        self.count += 1
        cost = len(payload) + ITEM_OVERHEAD
        self.memory_bytes += cost
        pool = self._pool
        pool.memory_bytes += cost
        if pool.memory_bytes > pool.limit:
            pool.peak_memory_bytes = max(pool.peak_memory_bytes, pool.memory_bytes)
            pool.relieve()
        elif pool.memory_bytes > pool.peak_memory_bytes:
            pool.peak_memory_bytes = pool.memory_bytes

    def mark(self) -> Mark:
        """A mark at the current end (where the next message will go)."""
        mark = Mark(self.count)
        self._marks.append(mark)
        return mark

    def spill(self) -> None:
        """Move the in-memory messages to the spill file."""
        if not self._payloads:
            return
        if self._file is None:
            self._path = self._pool.new_path(self.label)
            self._file = open(self._path, "w+b")  # noqa: SIM115 - closed by close()
        write = self._file.write
        pack = _RECORD.pack
        offset = self._file_size
        marks = self._marks
        # marks waiting for an offset are the last ones, in index order
        first_mark = len(marks)
        while first_mark > 0 and marks[first_mark - 1].index >= self.spilled:
            first_mark -= 1
        mi = first_mark
        index = self.spilled
        for payload, lsn in zip(self._payloads, self._lsns, strict=True):
            while mi < len(marks) and marks[mi].index == index:
                marks[mi].offset = offset
                mi += 1
            write(pack(len(payload), lsn))
            write(payload)
            offset += _RECORD.size + len(payload)
            index += 1
        written = offset - self._file_size
        self._file_size = offset
        self.spilled = self.count
        self._pool.memory_bytes -= self.memory_bytes
        self._pool.spilled_bytes += written
        self._pool.spills += 1
        log.debug(
            "spilled %d bytes of transaction %s (%d messages on disk)",
            self.memory_bytes,
            self.label,
            self.spilled,
        )
        self.memory_bytes = 0
        self._payloads = []
        self._lsns = array("Q")

    def truncate(self, mark: Mark) -> None:
        """Drop every message from ``mark`` on (and the marks at or after it)."""
        index = mark.index
        if index > self.count:
            raise ValueError(f"mark {index} is beyond the buffer's {self.count} messages")
        self._marks = [m for m in self._marks if m.index < index]
        if index >= self.spilled:
            keep = index - self.spilled
            freed = sum(len(p) + ITEM_OVERHEAD for p in self._payloads[keep:])
            del self._payloads[keep:]
            del self._lsns[keep:]
            self.memory_bytes -= freed
            self._pool.memory_bytes -= freed
        else:
            if mark.offset < 0 or self._file is None:
                raise ValueError(f"mark {index} is on disk but has no recorded offset")
            self._file.flush()
            self._file.truncate(mark.offset)
            self._file.seek(mark.offset)
            self._file_size = mark.offset
            self._pool.memory_bytes -= self.memory_bytes
            self.memory_bytes = 0
            self._payloads = []
            self._lsns = array("Q")
            self.spilled = index
        self.count = index

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        """Every message in order, as (payload, lsn): from disk first, then from memory."""
        if self.spilled:
            assert self._file is not None and self._path is not None
            self._file.flush()
            with open(self._path, "rb", buffering=_READ_BUFFER) as reader:
                read = reader.read
                unpack = _RECORD.unpack
                size = _RECORD.size
                for _ in range(self.spilled):
                    length, lsn = unpack(read(size))
                    yield read(length), lsn
        yield from zip(self._payloads, self._lsns, strict=True)

    def __len__(self) -> int:
        return self.count

    def close(self) -> None:
        """Forget the messages and delete the spill file."""
        if self.closed:
            return
        self.closed = True
        self._pool.memory_bytes -= self.memory_bytes
        self.memory_bytes = 0
        self._payloads = []
        self._lsns = array("Q")
        self._marks = []
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None
        self._pool.forget(self)


class SpillPool:
    """Memory accounting and spilling for every buffer of one assembler.

    ``limit`` is in bytes (payloads plus ``ITEM_OVERHEAD`` each); ``directory`` is where the
    private temporary directory is made (default: the system temporary directory).
    """

    def __init__(
        self, limit: int = DEFAULT_MEMORY_LIMIT, directory: str | os.PathLike[str] | None = None
    ) -> None:
        if limit < 0:
            raise ValueError(f"memory limit must be 0 or more bytes, not {limit}")
        self.limit = limit
        self.directory = directory
        self.memory_bytes = 0
        self.peak_memory_bytes = 0
        self.spilled_bytes = 0
        self.spills = 0
        self._buffers: dict[int, ItemBuffer] = {}
        self._tmpdir: Path | None = None
        self._finalizer: weakref.finalize[..., SpillPool] | None = None
        self._files = 0

    def buffer(self, label: str) -> ItemBuffer:
        buf = ItemBuffer(self, label)
        self._buffers[id(buf)] = buf
        return buf

    def forget(self, buf: ItemBuffer) -> None:
        self._buffers.pop(id(buf), None)

    def relieve(self) -> None:
        """Spill the buffers holding the most memory until the total is within the limit."""
        while self.memory_bytes > self.limit:
            largest = max(self._buffers.values(), key=lambda b: b.memory_bytes, default=None)
            if largest is None or largest.memory_bytes == 0:
                return
            largest.spill()

    def new_path(self, label: str) -> Path:
        if self._tmpdir is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="pgcdc-spill-", dir=self.directory))
            self._finalizer = weakref.finalize(
                self, shutil.rmtree, str(self._tmpdir), ignore_errors=True
            )
            log.info("spilling large transactions to %s", self._tmpdir)
        self._files += 1
        return self._tmpdir / f"{label}-{self._files}.spill"

    @property
    def spill_directory(self) -> Path | None:
        """The temporary directory, once something was spilled."""
        return self._tmpdir

    @property
    def open_buffers(self) -> int:
        return len(self._buffers)

    def close(self) -> None:
        """Close every buffer and remove the temporary directory."""
        for buf in list(self._buffers.values()):
            buf.close()
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._tmpdir = None
