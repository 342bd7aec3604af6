"""Deletion-vector bitmaps built in numpy against Delta's own ``RoaringBitmapArray`` (the JVM's):
each reads what the other writes, on random sets of row indexes (sparse, dense, runs, several
high halves)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.lake.store import deletion_vectors

_MAGIC = deletion_vectors.PORTABLE_MAGIC


def jvm_bitmap(spark: Any, values: np.ndarray, *, run_optimize: bool) -> Any:
    """Delta's ``RoaringBitmapArray`` of ``values`` (below 2**31), built from a Java
    ``RoaringBitmap`` as Delta's own code builds them (independently of the numpy codec)."""
    jvm = spark.sparkContext._jvm
    gateway = spark.sparkContext._gateway
    ints = gateway.new_array(gateway.jvm.int, int(values.size))
    little = jvm.java.nio.ByteOrder.LITTLE_ENDIAN
    if values.size:
        data = bytearray(values.astype("<i4").tobytes())
        jvm.java.nio.ByteBuffer.wrap(data).order(little).asIntBuffer().get(ints)
    roaring = jvm.org.roaringbitmap.RoaringBitmap.bitmapOf(ints)
    if run_optimize:
        roaring.runOptimize()
    buffer = jvm.java.nio.ByteBuffer.allocate(16 + roaring.serializedSizeInBytes())
    buffer.order(little)
    buffer.putInt(_MAGIC)
    buffer.putLong(1)
    buffer.putInt(0)
    roaring.serialize(buffer)
    return jvm.org.apache.spark.sql.delta.deletionvectors.RoaringBitmapArray.readFrom(
        buffer.array()
    )


def portable(spark: Any) -> Any:
    formats = spark.sparkContext._jvm.org.apache.spark.sql.delta.deletionvectors
    return formats.RoaringBitmapArrayFormat.Portable()


def row_sets() -> st.SearchStrategy[np.ndarray]:
    """Row indexes as data files hold deleted rows: scattered ones, dense blocks (bitmap
    containers), runs (run containers), spread over several 16-bit containers."""
    scattered = st.lists(st.integers(0, 2**31 - 1), max_size=200)
    block = st.tuples(st.integers(0, 40), st.integers(1, 9000), st.integers(1, 3)).map(
        lambda t: list(range(t[0] * 65536, t[0] * 65536 + t[1] * t[2], t[2]))
    )
    return st.tuples(scattered, st.lists(block, max_size=3)).map(
        lambda t: np.unique(np.asarray(t[0] + [v for b in t[1] for v in b], dtype=np.int64))
    )


@settings(max_examples=40, deadline=None)
@given(values=row_sets(), run_optimize=st.booleans())
def test_the_jvms_bitmaps_read_as_written(
    spark: Any, values: np.ndarray, run_optimize: bool
) -> None:
    jvm = jvm_bitmap(spark, values, run_optimize=run_optimize)
    decoded = deletion_vectors.decode(bytes(jvm.serializeAsByteArray(portable(spark))))
    assert decoded.tolist() == values.tolist()


@settings(max_examples=40, deadline=None)
@given(values=row_sets())
def test_the_jvm_reads_the_numpy_bitmaps(spark: Any, values: np.ndarray) -> None:
    formats = spark.sparkContext._jvm.org.apache.spark.sql.delta.deletionvectors
    data = deletion_vectors.encode(values[::-1])  # any order in, sorted out
    read = formats.RoaringBitmapArray.readFrom(data)
    assert int(read.cardinality()) == values.size
    assert list(read.toArray()) == values.tolist()
    # and Delta writes it back the same set
    again = deletion_vectors.decode(bytes(read.serializeAsByteArray(portable(spark))))
    assert again.tolist() == values.tolist()


def test_row_indexes_past_32_bits_and_the_edges(spark: Any) -> None:
    formats = spark.sparkContext._jvm.org.apache.spark.sql.delta.deletionvectors
    values = np.array([0, 65535, 65536, 2**31 - 1, 2**32, 2**32 + 7, 3 * 2**32], dtype=np.int64)
    data = deletion_vectors.encode(values)
    assert deletion_vectors.decode(data).tolist() == values.tolist()
    read = formats.RoaringBitmapArray.readFrom(data)
    assert list(read.toArray()) == values.tolist()
    assert deletion_vectors.decode(deletion_vectors.encode(np.empty(0, np.int64))).size == 0
    with pytest.raises(ValueError, match="negative"):
        deletion_vectors.encode(np.array([-1]))
    with pytest.raises(ValueError, match="magic"):
        deletion_vectors.decode(b"\0" * 12)
