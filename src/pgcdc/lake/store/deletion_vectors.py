"""Delta's deletion-vector bitmaps as bytes: ``RoaringBitmapArray`` in its portable format.

A deletion vector marks rows of one data file deleted by their row index. Delta stores it as a
``RoaringBitmapArray`` (64-bit row indexes: one 32-bit Roaring bitmap per high half) serialized
in its portable format: the magic number ``1681511377`` (int32, little-endian), the number of
bitmaps (int64), then per bitmap its key (the high half, int32) and the bitmap in the portable
Roaring format of https://github.com/RoaringBitmap/RoaringFormatSpec (what Java's
``RoaringBitmap.serialize`` writes): a cookie, a header of 16-bit container keys and
cardinalities, offsets, then array (up to 4096 sorted 16-bit values), bitmap (8 KiB) and run
containers (16-bit start, length minus one), each container the smallest of the three, as
``runOptimize`` picks them.

Built here in numpy rather than through the JVM's bitmap classes (a dozen gateway calls a data
file: a batch of many tables made thousands of them); Delta's own deletion-vector store still
writes and reads the files (``deltalog.TableLog.mark_deleted``). Tests compare both ways with the
JVM's ``RoaringBitmapArray`` on random sets.
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["decode", "encode"]

#: ``RoaringBitmapArrayFormat.Portable``'s magic number
PORTABLE_MAGIC = 1681511377
_NO_RUNS = 12346  # SERIAL_COOKIE_NO_RUNCONTAINER
_WITH_RUNS = 12347  # SERIAL_COOKIE
_NO_OFFSET_THRESHOLD = 4
_ARRAY_MAX = 4096

_U16 = np.dtype("<u2")
_U32 = np.dtype("<u4")
_U64 = np.dtype("<u8")


def encode(rows: np.ndarray) -> bytes:
    """The portable ``RoaringBitmapArray`` of ``rows`` (row indexes, any order, repeats
    allowed; each in 0 .. 2**63-1)."""
    values = np.unique(np.asarray(rows, dtype=np.int64))
    if values.size and values[0] < 0:
        raise ValueError("a deletion vector holds no negative row index")
    highs = (values >> 32).astype(np.int64)
    keys = np.unique(highs)
    count = int(keys[-1]) + 1 if keys.size else 0
    # one bitmap per high half from 0 up to the largest, the empty ones too (as Delta's
    # RoaringBitmapArray keeps its array of bitmaps)
    parts = [struct.pack("<iq", PORTABLE_MAGIC, count)]
    starts = np.searchsorted(highs, np.arange(count + 1))
    for high in range(count):
        low = (values[starts[high] : starts[high + 1]] & 0xFFFFFFFF).astype(np.uint32)
        parts.append(struct.pack("<i", high))
        parts.append(_encode32(low))
    return b"".join(parts)


def decode(data: bytes) -> np.ndarray:
    """The row indexes (sorted int64) of a portable ``RoaringBitmapArray``."""
    view = memoryview(data)
    magic, count = struct.unpack_from("<iq", view, 0)
    if magic != PORTABLE_MAGIC:
        raise ValueError(f"not a portable RoaringBitmapArray (magic {magic})")
    at = 12
    out = []
    for _ in range(count):
        (high,) = struct.unpack_from("<i", view, at)
        low, at = _decode32(view, at + 4)
        out.append((np.int64(high) << 32) | low.astype(np.int64))
    return np.concatenate(out) if out else np.empty(0, np.int64)


def _encode32(values: np.ndarray) -> bytes:
    """A 32-bit Roaring bitmap of ``values`` (sorted, distinct uint32), portable format."""
    if not values.size:
        return struct.pack("<II", _NO_RUNS, 0)
    keys_all = (values >> 16).astype(np.uint16)
    keys, starts = np.unique(keys_all, return_index=True)
    ends = np.append(starts[1:], values.size)
    containers: list[bytes] = []
    runs: list[bool] = []
    for start, end in zip(starts, ends, strict=True):
        low = (values[start:end] & 0xFFFF).astype(np.uint16)
        card = low.size
        breaks = np.flatnonzero(np.diff(low.astype(np.int32)) != 1)
        n_runs = breaks.size + 1
        array_size = 2 * card if card <= _ARRAY_MAX else 8192
        if 2 + 4 * n_runs < min(array_size, 8192):
            run_starts = low[np.concatenate(([0], breaks + 1))]
            run_ends = low[np.concatenate((breaks, [card - 1]))]
            pairs = np.empty(2 * n_runs, dtype=_U16)
            pairs[0::2] = run_starts
            pairs[1::2] = run_ends - run_starts
            containers.append(struct.pack("<H", n_runs) + pairs.tobytes())
            runs.append(True)
        elif card <= _ARRAY_MAX:
            containers.append(low.astype(_U16).tobytes())
            runs.append(False)
        else:
            bits = np.zeros(65536, dtype=bool)
            bits[low] = True
            containers.append(np.packbits(bits, bitorder="little").tobytes())
            runs.append(False)
    size = len(containers)
    header = np.empty(2 * size, dtype=_U16)
    header[0::2] = keys
    header[1::2] = (ends - starts - 1).astype(np.uint16)
    if any(runs):
        flags = np.packbits(np.asarray(runs, dtype=bool), bitorder="little").tobytes()
        head = struct.pack("<HH", _WITH_RUNS, size - 1) + flags + header.tobytes()
        with_offsets = size >= _NO_OFFSET_THRESHOLD
    else:
        head = struct.pack("<II", _NO_RUNS, size) + header.tobytes()
        with_offsets = True
    if not with_offsets:
        return head + b"".join(containers)
    lengths = np.array([len(c) for c in containers], dtype=np.int64)
    first = len(head) + 4 * size
    offsets = (first + np.concatenate(([0], np.cumsum(lengths)[:-1]))).astype(_U32)
    return head + offsets.tobytes() + b"".join(containers)


def _decode32(view: memoryview, at: int) -> tuple[np.ndarray, int]:
    """The values (uint32, sorted) of the 32-bit Roaring bitmap at ``at``, and where it ends."""
    (cookie,) = struct.unpack_from("<I", view, at)
    if cookie & 0xFFFF == _WITH_RUNS:
        size = (cookie >> 16) + 1
        at += 4
        flag_bytes = (size + 7) // 8
        flags = np.unpackbits(
            np.frombuffer(view, np.uint8, flag_bytes, at), bitorder="little", count=size
        ).astype(bool)
        at += flag_bytes
        header = np.frombuffer(view, _U16, 2 * size, at)
        at += 4 * size
        if size >= _NO_OFFSET_THRESHOLD:
            at += 4 * size
    elif cookie == _NO_RUNS:
        (size,) = struct.unpack_from("<I", view, at + 4)
        at += 8
        flags = np.zeros(size, dtype=bool)
        header = np.frombuffer(view, _U16, 2 * size, at)
        at += 4 * size + 4 * size  # the header, then the offsets
    else:
        raise ValueError(f"not a portable Roaring bitmap (cookie {cookie})")
    out = []
    for i in range(size):
        key = np.uint32(header[2 * i]) << np.uint32(16)
        card = int(header[2 * i + 1]) + 1
        if flags[i]:
            (n_runs,) = struct.unpack_from("<H", view, at)
            pairs = np.frombuffer(view, _U16, 2 * n_runs, at + 2).astype(np.uint32)
            at += 2 + 4 * n_runs
            low = np.concatenate(
                [np.arange(s, s + n + 1, dtype=np.uint32) for s, n in pairs.reshape(-1, 2)]
            )
        elif card <= _ARRAY_MAX:
            low = np.frombuffer(view, _U16, card, at).astype(np.uint32)
            at += 2 * card
        else:
            words = np.frombuffer(view, np.uint8, 8192, at)
            low = np.flatnonzero(np.unpackbits(words, bitorder="little")).astype(np.uint32)
            at += 8192
        out.append(key | low)
    return (np.concatenate(out) if out else np.empty(0, np.uint32)), at
