"""Fitting the codec's Arrow arrays to the exact Arrow types Spark expects from ``read()``.

Spark checks every record batch a Python data source yields against the Arrow form of the
declared schema (``pyspark.sql.pandas.types.to_arrow_type``): list children are named
``element``, VARIANT is ``struct<value, metadata>`` of binaries, TIME is ``time64[ns]``. The
decoders (``pgcdc.protocol.arrow.columnar``) produce the codec's own Arrow types; ``conform``
converts one array to its target type without a Python object per value, except JSON to
VARIANT, which goes through Spark's own VARIANT encoder value by value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["conform", "is_variant_type", "null_array"]

_INTERVAL = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanos", "<i8")])


def is_variant_type(target: pa.DataType) -> bool:
    """Whether ``target`` is the Arrow form of Spark's VARIANT."""
    if not pa.types.is_struct(target) or target.num_fields != 2:
        return False
    metadata = target.field(1).metadata or {}
    return target.field(0).name == "value" and metadata.get(b"variant") == b"true"


def null_array(target: pa.DataType, length: int) -> pa.Array:
    """``length`` nulls of ``target``."""
    return pa.nulls(length, target)


def _mask(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def _variant(array: pa.Array, target: pa.StructType) -> pa.Array:
    from pyspark.sql.variant_utils import VariantUtils

    values: list[bytes] = []
    metadata: list[bytes] = []
    for text in array.cast(pa.string()).to_pylist():
        if text is None:
            values.append(b"")
            metadata.append(b"")
            continue
        value, meta = VariantUtils.parse_json(text)
        values.append(bytes(value))
        metadata.append(bytes(meta))
    return pa.StructArray.from_arrays(
        [pa.array(values, pa.binary()), pa.array(metadata, pa.binary())],
        fields=list(target),
        mask=_mask(array),
    )


def _interval(array: pa.Array, target: pa.StructType) -> pa.Array:
    n = len(array)
    raw = np.frombuffer(array.buffers()[1], dtype=_INTERVAL, count=array.offset + n)
    raw = raw[array.offset :]
    children = [
        pa.array(raw["months"], pa.int32()),
        pa.array(raw["days"], pa.int32()),
        pa.array(raw["nanos"] // 1000, pa.int64()),
    ]
    return pa.StructArray.from_arrays(children, fields=list(target), mask=_mask(array))


def conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as ``target`` (see the module doc); values keep their meaning exactly."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    source = array.type
    if pa.types.is_dictionary(source):
        array = array.cast(source.value_type)
        source = array.type
    if is_variant_type(target):
        return _variant(array, target)
    if pa.types.is_list(target):
        if not (pa.types.is_list(source) or pa.types.is_large_list(source)):
            raise TypeError(f"cannot fit a {source} column into {target}")
        values = conform(array.values, target.value_type)
        return pa.ListArray.from_arrays(
            array.offsets.cast(pa.int32()), values, type=target, mask=_mask(array)
        )
    if pa.types.is_struct(target):
        if source == pa.month_day_nano_interval():
            return _interval(array, target)
        if not pa.types.is_struct(source):
            raise TypeError(f"cannot fit a {source} column into {target}")
        children = []
        for field in target:
            index = source.get_field_index(field.name)
            child = array.field(index) if index >= 0 else null_array(field.type, len(array))
            children.append(conform(child, field.type))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_mask(array))
    if pa.types.is_timestamp(source) or pa.types.is_date32(source):
        array = _finite(array)
    if source == target:
        return array
    if pa.types.is_time64(source) and pa.types.is_string(target):
        return _time_text(array)
    return array.cast(target)


#: Spark's date and timestamp range (0001-01-01 .. 9999-12-31 23:59:59.999999), in days and
#: microseconds since the Unix epoch; PostgreSQL's -infinity/infinity are clamped to it.
_DAY_MIN, _DAY_MAX = -719_162, 2_932_896
_MICROS_MIN, _MICROS_MAX = _DAY_MIN * 86_400_000_000, (_DAY_MAX + 1) * 86_400_000_000 - 1


def _finite(array: pa.Array) -> pa.Array:
    """The codec reads ±infinity as the storage type's extremes; Spark (and Python) cannot take
    those: clamp exactly them to Spark's first and last representable instant or day."""
    storage_type = pa.int32() if pa.types.is_date32(array.type) else pa.int64()
    info = np.iinfo(np.int32 if storage_type == pa.int32() else np.int64)
    low, high = (_DAY_MIN, _DAY_MAX) if storage_type == pa.int32() else (_MICROS_MIN, _MICROS_MAX)
    storage = array.view(storage_type)
    bounds = pc.min_max(storage)
    if bounds["min"].as_py() != info.min and bounds["max"].as_py() != info.max:
        return array
    clamped = pc.if_else(
        pc.equal(storage, info.max),
        high,
        pc.if_else(pc.equal(storage, info.min), low, storage),
    )
    return clamped.cast(storage_type).view(array.type)


def _time_text(array: pa.Array) -> pa.Array:
    """time64 as PostgreSQL prints it: ``HH:MM:SS``, with the fraction's trailing zeros cut."""
    text = pc.cast(array.cast(pa.time64("us")), pa.string())
    text = pc.replace_substring_regex(text, pattern=r"(\.\d*?)0+$", replacement=r"\1")
    return pc.replace_substring_regex(text, pattern=r"\.$", replacement="")
