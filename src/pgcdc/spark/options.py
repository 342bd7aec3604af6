"""The data source's options, parsed and checked once, with errors that name the fix.

Spark hands options over as a case-insensitive mapping of strings. A boolean option is
``true`` or ``false`` in any case, as Spark's own sources read theirs (PySpark's
``.option("jsonAsVariant", True)`` passes ``"true"``); ``yes``, ``1``, ``on`` and the like are
refused rather than guessed. Sizes follow ``pgcdc.sizes`` (``64m``, ``512MB``), seconds may
carry an ``s``. Stream options (``spark.readStream.format("pgcdc")``):

=======================  ========================================================================
``dsn``                  PostgreSQL connection string (required)
``slot``                 logical replication slot (pgoutput; required for streams)
``publications``         publication names, comma-separated or a JSON list (required for streams)
``startLsn``             initial offset of a new query: stream transactions committing at or
                         after this LSN (default: the slot's confirmed position; after an initial
                         snapshot, its consistent point, which is the same thing)
``maxChangesPerTrigger`` at most this many rows per micro-batch (ReadMaxRows; whole transactions,
                         at least one)
``maxBytesPerTrigger``   at most this many pgoutput bytes per micro-batch (ReadMaxBytes; ``64m``)
``minChangesPerTrigger`` wait for at least this many rows (ReadMinRows) ...
``maxTriggerDelay``      ... but no longer than this many seconds (default 300)
``jsonAsVariant``        json/jsonb columns as VARIANT instead of strings (default false)
``textColumns``          a JSON object of table -> columns read as the text their type's output
                         function prints, whatever the type (``{"public.t": ["price"]}``): for
                         values no typed column holds (NaN in numeric(p,s), arrays of more
                         dimensions than declared, ``24:00:00`` with ``timeAsTime``)
``renamedColumns``       a JSON object of table -> {former name: name} (``pgcdc run`` passes the
                         column renames it followed): a Relation that still names a column by
                         its former name (changes from before the rename) fills the column
``skipTables``           published tables whose changes the query leaves out, as the option
                         ``tables`` names them (``pgcdc run`` passes its parked tables): not in
                         the schema, their values read as text and dropped, their DDL ignored
``timeAsTime``           time columns as TIME(6) instead of strings (default false; Spark needs
                         ``spark.sql.timeType.enabled=true``)
``binary``               ``auto`` (default: binary values unless a column's type is unknown to the
                         codec), ``true`` or ``false``
``driverHost``           address executors reach the driver at (default: SPARK_LOCAL_IP or the
                         address of the host name; ``read_stream`` passes spark.driver.host)
``endpointBindHost``     address the data endpoint listens on (default 0.0.0.0)
``endpointPort``         its port (default 0: any free port)
``spoolDir``             where the driver-side spool lives (default: the temporary directory)
``spoolSegmentBytes``    spool segment file size (default 64m)
``partitionBytes``       pgoutput bytes per input partition (default 64m; a transaction is never
                         split)
``minPartitions``        split a micro-batch into at least this many input partitions when its
                         transactions allow it and each gets at least 1m (default 1;
                         ``read_stream`` passes the session's default parallelism)
``decodeChunkBytes``     bytes an executor decodes at a time (default 16m)
``slotBusyTimeout``      seconds to wait for a previous reader to release the slot (default 60)
``replayTimeout``        seconds to wait for a planned batch's transactions (default 300)
``availableNowTimeout``  seconds to wait for the stream to reach Trigger.AvailableNow's target
                         (default 600)
``pauseFile``            a path: while a file exists there, no new micro-batch is planned (for a
                         stop between batches: create it, wait until no trigger is active, stop
                         the query); the batch in progress finishes and is confirmed
=======================  ========================================================================

Snapshot options (``spark.read.format("pgcdc")``): ``dsn``; ``publications`` or ``tables``
(comma-separated ``schema.table`` names, double-quote a part with commas, dots or upper case, or
a JSON list); ``snapshot`` (exported snapshot name); ``consistentPoint`` (its LSN) or ``slot``
(whose confirmed position is read instead); ``rowFilter.<schema.table>`` (an SQL expression;
or the option ``rowFilters`` as a JSON object of table -> expression or list of expressions),
OR-combined with the publications' filters; ``partitionsPerTable`` or ``targetPartitionBytes``
(default 128m); ``jsonAsVariant``, ``timeAsTime``, ``textColumns``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pgcdc import sizes
from pgcdc.lsn import Lsn
from pgcdc.spark.errors import OptionError
from pgcdc.spark.schema import TypeChoices

__all__ = [
    "SnapshotSettings",
    "StreamSettings",
    "parse_qualified_names",
    "parse_size",
    "renamed_columns",
    "snapshot_settings",
    "stream_settings",
    "text_columns",
    "type_choices",
]


def type_choices(options: Mapping[str, str]) -> TypeChoices:
    """The options that change column types (both readers): jsonAsVariant, timeAsTime."""
    kwargs = {}
    for key, attr in (("jsonAsVariant", "json_as_variant"), ("timeAsTime", "time_as_time")):
        text = _get(options, key)
        if text:
            kwargs[attr] = _bool(key, text)
    return TypeChoices(**kwargs)


def parse_size(name: str, text: str) -> int:
    """The option ``name``'s size (``pgcdc.sizes``: ``"64m"`` -> 67108864), positive."""
    try:
        value = sizes.parse_size(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(
            f"option {name}={text!r} is not a size",
            f"write a positive number of bytes, or a number and a unit: {name}=64MB",
        )
    return value


def _int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(f"option {name}={text!r} is not a positive integer", f"set {name}=1000")
    return value


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text.strip().removesuffix("s"))
    except ValueError:
        value = -1.0
    if not value > 0:
        raise OptionError(f"option {name}={text!r} is not a number of seconds", f"set {name}=60")
    return value


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise OptionError(
        f"option {name}={text!r} is not true or false",
        f"set {name}=true or {name}=false (Spark's spelling of booleans)",
    )


def _names(name: str, text: str) -> tuple[str, ...]:
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except ValueError:
            value = None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise OptionError(
                f"option {name} is not a JSON list of names", f'write {name}=["a", "b"]'
            )
        return tuple(value)
    names = tuple(part.strip() for part in stripped.split(",") if part.strip())
    if not names:
        raise OptionError(f"option {name} is empty", f"name at least one: {name}=mypub")
    return names


def _split_identifier(text: str) -> list[str]:
    """``schema.table`` into its parts; double-quoted parts keep dots, commas and case."""
    parts: list[str] = []
    i = 0
    current = ""
    while i < len(text):
        ch = text[i]
        if ch == '"':
            end = i + 1
            value = ""
            while True:
                stop = text.find('"', end)
                if stop < 0:
                    raise OptionError(f"unterminated quoted name in {text!r}", 'write "My.Name"')
                value += text[end:stop]
                if text[stop + 1 : stop + 2] == '"':
                    value += '"'
                    end = stop + 2
                    continue
                i = stop + 1
                break
            current += value
            continue
        if ch == ".":
            parts.append(current)
            current = ""
        else:
            current += ch
        i += 1
    parts.append(current)
    return parts


def parse_qualified_names(name: str, text: str) -> tuple[tuple[str, str], ...]:
    """``'public.a, "Odd Schema"."T,1"'`` (or a JSON list of such names, or of
    ``[schema, table]`` pairs) -> ``(("public", "a"), ("Odd Schema", "T,1"))``."""
    stripped = text.strip()
    items: list[object]
    if stripped.startswith("["):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            parsed = None
        if not isinstance(parsed, list):
            raise OptionError(f"option {name} is not a JSON list", f'write {name}=["public.t"]')
        items = parsed
    else:
        items = []
        current = ""
        quoted = False
        for ch in stripped:
            if ch == '"':
                quoted = not quoted
            if ch == "," and not quoted:
                items.append(current.strip())
                current = ""
            else:
                current += ch
        items.append(current.strip())
    result: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(p, str) for p in item):
            result.append((item[0], item[1]))
            continue
        if not isinstance(item, str) or not item:
            continue
        parts = _split_identifier(item)
        if len(parts) == 1:
            parts = ["public", parts[0]]
        if len(parts) != 2 or not all(parts):
            raise OptionError(
                f"option {name}: {item!r} is not a table name",
                'write schema.table, double-quoting parts with dots: "my.schema".t',
            )
        result.append((parts[0], parts[1]))
    if not result:
        raise OptionError(f"option {name} names no table", f"set {name}=public.mytable")
    return tuple(result)


def _get(options: Mapping[str, str], key: str) -> str | None:
    value = options.get(key.lower())
    if value is None:
        value = options.get(key)
    return None if value is None else str(value)


def _required(options: Mapping[str, str], key: str, example: str) -> str:
    value = _get(options, key)
    if not value:
        raise OptionError(
            f"the pgcdc source needs the option {key!r}", f'.option("{key}", {example})'
        )
    return value


def _lsn(name: str, text: str) -> Lsn:
    try:
        return Lsn.parse(text)
    except ValueError as exc:
        raise OptionError(f"option {name}: {exc}", f"set {name}=0/16B3748") from None


@dataclass(frozen=True, slots=True)
class StreamSettings:
    dsn: str
    slot: str
    publications: tuple[str, ...]
    start_lsn: Lsn | None = None
    max_rows: int | None = None
    max_bytes: int | None = None
    min_rows: int | None = None
    max_trigger_delay: float = 300.0
    binary: Literal["auto", "true", "false"] = "auto"
    driver_host: str | None = None
    bind_host: str = "0.0.0.0"  # executors on other hosts connect
    port: int = 0
    spool_dir: str | None = None
    segment_bytes: int = 64 << 20
    partition_bytes: int = 64 << 20
    min_partitions: int = 1
    chunk_bytes: int = 16 << 20
    slot_wait: float = 60.0
    replay_timeout: float = 300.0
    available_now_timeout: float = 600.0
    receive_timeout: float = 60.0
    idle_wait: float = 0.5
    pause_file: str | None = None


def stream_settings(options: Mapping[str, str]) -> StreamSettings:
    """Parse and check the stream options."""
    dsn = _required(options, "dsn", '"host=... dbname=... user=..."')
    slot = _required(options, "slot", '"pgcdc_slot"')
    publications = _names("publications", _required(options, "publications", '"mypub"'))
    kwargs: dict[str, object] = {}
    text = _get(options, "startLsn")
    if text:
        kwargs["start_lsn"] = _lsn("startLsn", text)
    for key, attr in (
        ("maxChangesPerTrigger", "max_rows"),
        ("minChangesPerTrigger", "min_rows"),
        ("minPartitions", "min_partitions"),
    ):
        text = _get(options, key)
        if text:
            kwargs[attr] = _int(key, text)
    for key, attr in (
        ("maxBytesPerTrigger", "max_bytes"),
        ("spoolSegmentBytes", "segment_bytes"),
        ("partitionBytes", "partition_bytes"),
        ("decodeChunkBytes", "chunk_bytes"),
    ):
        text = _get(options, key)
        if text:
            kwargs[attr] = parse_size(key, text)
    for key, attr in (
        ("maxTriggerDelay", "max_trigger_delay"),
        ("slotBusyTimeout", "slot_wait"),
        ("replayTimeout", "replay_timeout"),
        ("availableNowTimeout", "available_now_timeout"),
        ("receiveTimeout", "receive_timeout"),
    ):
        text = _get(options, key)
        if text:
            kwargs[attr] = _seconds(key, text)
    text = _get(options, "binary")
    if text:
        lowered = text.strip().lower()
        if lowered == "auto":
            kwargs["binary"] = "auto"
        else:
            kwargs["binary"] = "true" if _bool("binary", text) else "false"
    for key, attr in (
        ("driverHost", "driver_host"),
        ("endpointBindHost", "bind_host"),
        ("spoolDir", "spool_dir"),
        ("pauseFile", "pause_file"),
    ):
        text = _get(options, key)
        if text:
            kwargs[attr] = text.strip()
    text = _get(options, "endpointPort")
    if text:
        try:
            port = int(text)
        except ValueError:
            port = -1
        if not 0 <= port <= 65535:
            raise OptionError(f"option endpointPort={text!r} is not a port", "set endpointPort=0")
        kwargs["port"] = port
    settings = StreamSettings(dsn, slot, publications, **kwargs)  # type: ignore[arg-type]
    if settings.min_rows and settings.max_rows and settings.min_rows > settings.max_rows:
        raise OptionError(
            "minChangesPerTrigger is larger than maxChangesPerTrigger",
            "make the minimum at most the maximum",
        )
    return settings


@dataclass(frozen=True, slots=True)
class SnapshotSettings:
    dsn: str
    publications: tuple[str, ...] = ()
    tables: tuple[tuple[str, str], ...] = ()
    snapshot: str | None = None
    consistent_point: Lsn | None = None
    slot: str | None = None
    row_filters: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    partitions_per_table: int | None = None
    target_partition_bytes: int = 128 << 20


def _row_filters(options: Mapping[str, str]) -> dict[tuple[str, str], list[str]]:
    filters: dict[tuple[str, str], list[str]] = {}
    for key, value in options.items():
        lowered = key.lower()
        if lowered.startswith("rowfilter.") and value:
            (table,) = parse_qualified_names(key, key[len("rowFilter.") :])
            filters.setdefault(table, []).append(str(value))
    text = _get(options, "rowFilters")
    if text:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise OptionError(
                "option rowFilters is not a JSON object",
                'write rowFilters={"public.t": "a > 5"}',
            )
        for name, spec in parsed.items():
            (table,) = parse_qualified_names("rowFilters", name)
            specs = spec if isinstance(spec, list) else [spec]
            if not all(isinstance(s, str) and s.strip() for s in specs):
                raise OptionError(
                    f"rowFilters: the filter of {name!r} is not an SQL expression",
                    'write rowFilters={"public.t": "a > 5"}',
                )
            filters.setdefault(table, []).extend(specs)
    return filters


def _per_table(
    options: Mapping[str, str], option: str, example: str
) -> list[tuple[str, tuple[str, str], Any]]:
    """Option ``option``'s JSON object of table name -> value, as (the name as written, the
    table, the value) in the object's order (a table named twice, say with and without its
    schema, comes twice)."""
    text = _get(options, option)
    if not text:
        return []
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise OptionError(f"option {option} is not a JSON object", example)
    pairs = []
    for name, value in parsed.items():
        (table,) = parse_qualified_names(option, name)
        pairs.append((name, table, value))
    return pairs


def text_columns(options: Mapping[str, str]) -> dict[tuple[str, str], frozenset[str]]:
    """The option ``textColumns`` (both readers): a JSON object of table -> the column names
    read as the text their type's output function prints."""
    example = 'write textColumns={"public.t": ["price", "matrix"]}'
    result: dict[tuple[str, str], frozenset[str]] = {}
    for name, table, columns in _per_table(options, "textColumns", example):
        if not isinstance(columns, list) or not all(isinstance(c, str) and c for c in columns):
            raise OptionError(
                f"textColumns: the columns of {name!r} are not a list of column names",
                example,
            )
        result[table] = result.get(table, frozenset()) | frozenset(columns)
    return result


def renamed_columns(options: Mapping[str, str]) -> dict[tuple[str, str], dict[str, str]]:
    """The option ``renamedColumns`` (streams): a JSON object of table -> {former column
    name: its name now}, in the order the renames happened."""
    example = 'write renamedColumns={"public.t": {"old_name": "new_name"}}'
    result: dict[tuple[str, str], dict[str, str]] = {}
    for name, table, renames in _per_table(options, "renamedColumns", example):
        if not isinstance(renames, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in renames.items()
        ):
            raise OptionError(
                f"renamedColumns: the renames of {name!r} are not an object of column names",
                example,
            )
        result.setdefault(table, {}).update(renames)
    return result


def snapshot_settings(options: Mapping[str, str]) -> SnapshotSettings:
    """Parse and check the snapshot (batch read) options."""
    dsn = _required(options, "dsn", '"host=... dbname=... user=..."')
    kwargs: dict[str, object] = {}
    text = _get(options, "publications")
    if text:
        kwargs["publications"] = _names("publications", text)
    text = _get(options, "tables")
    if text:
        kwargs["tables"] = parse_qualified_names("tables", text)
    if not kwargs:
        raise OptionError(
            "the pgcdc snapshot reader needs the tables to copy",
            'set .option("publications", "mypub") or .option("tables", "public.t1,public.t2")',
        )
    text = _get(options, "snapshot")
    if text:
        kwargs["snapshot"] = text.strip()
    text = _get(options, "consistentPoint")
    if text:
        kwargs["consistent_point"] = _lsn("consistentPoint", text)
    text = _get(options, "slot")
    if text:
        kwargs["slot"] = text.strip()
    text = _get(options, "partitionsPerTable")
    if text:
        kwargs["partitions_per_table"] = _int("partitionsPerTable", text)
    text = _get(options, "targetPartitionBytes")
    if text:
        kwargs["target_partition_bytes"] = parse_size("targetPartitionBytes", text)
    kwargs["row_filters"] = _row_filters(options)
    settings = SnapshotSettings(dsn, **kwargs)  # type: ignore[arg-type]
    if settings.snapshot and settings.consistent_point is None and settings.slot is None:
        raise OptionError(
            "the snapshot option needs the LSN it was exported at",
            "set consistentPoint (ExportedSnapshot.consistent_point), or slot (its confirmed "
            "position is read instead); pgcdc.spark.read_snapshot sets both",
        )
    return settings
