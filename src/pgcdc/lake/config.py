"""``pipeline.toml``: the configuration of ``pgcdc run``, as pydantic models with clear errors.

Every problem is reported as ``ConfigError`` naming the key (``source.slot``,
``tables[2].row_filter``) and what is wrong with it, before anything is created on the server or
in the lake. Row filters are parsed here (``pgcdc.filters``): a filter that is not exactly one
SQL expression is refused before any connection, and only its parse tree, printed back, is ever
sent to the server. Relative paths (``lake.path``) are relative to the configuration file's
directory.

Every key has one type, taken as TOML writes it and never converted: a boolean is ``true`` or
``false`` (not ``"yes"``, not ``1``), a whole number is written without quotes or fraction, a
number of seconds may have a fraction, a name or path is a quoted string; a size is a whole
number of bytes or a string such as ``"512MB"``. A value of another type is an error naming
the key (and the ``[[tables]]`` entry), what it got and how to write it.

Reference (defaults in brackets):

``[source]``
    ``dsn`` or ``dsn_env`` (one of them): the libpq connection string, or the name of an
    environment variable holding it; ``slot``: the pipeline's logical slot (created on the
    first start); ``publication`` (lower-case letters, digits and ``_``, like the slot): created
    on the first start with the ``[[tables]]`` and their row filters, or an existing one (then
    ``[[tables]]`` must match it, or be empty to take it as it is); ``via_partition_root``
    [false]: publish partitions' changes as their root's; ``connect_timeout`` [10] seconds;
    ``heartbeat_interval`` [60] seconds between heartbeats (small WAL records in the source
    database, so the slot keeps advancing when nothing it publishes changes; 0 turns them
    off); ``heartbeat`` ["message"]: ``"message"`` writes
    ``pg_logical_emit_message(false, 'pgcdc_heartbeat', ...)`` (no table needed), ``"table"``
    updates the one-row table ``heartbeat_table`` ["public.pgcdc_heartbeat"] (created if
    missing; leave it out of the publication); ``retained_wal_warning`` ["1GB"]: bytes, or a
    size such as ``"512MB"`` / ``"5GB"`` (1024-based; B, kB, MB, GB, TB, KiB, MiB, GiB, TiB),
    of WAL the slot may hold back before ``run`` logs a warning; ``health_check_interval`` [10]
    seconds between the running pipeline's checks of its slot (retained WAL, invalidation);
    ``table_discovery_interval`` [300] seconds between a running pipeline's checks for tables
    created on the source that a ``[[tables]]`` pattern matches (found, they join: the stream
    stops between two batches, they are copied, it resumes; 0: checked at a start only).
``[lake]``
    ``path``: the lake folder (local, a shared filesystem mounted at the same path on every
    Spark machine, or an S3 prefix); ``history`` [false] and ``changelog`` [false]: defaults
    for every table; ``write`` ["indexed"]: "indexed" or "merge" (``pgcdc.lake.write.indexed``);
    ``on_table_failure`` ["park"]: a table whose DDL the lake cannot follow, or whose stream
    holds a value no lake column can, is parked (no longer written or read while the others
    stream on, until ``pgcdc resync``), or "stop" stops the pipeline, or "resync" copies it
    anew at once;
    ``checkpoint_commits`` [50], ``compact_files`` [100], ``target_file_size`` ["16MB"],
    ``purge_deleted_share`` [0.25], ``vacuum`` [true], ``vacuum_retention_hours`` [168] and
    ``vacuum_interval`` [3600]: checkpoints of each Delta table's log, compaction of its small
    files, purging of the rows its deletion vectors mark and removal of replaced files, between
    batches (``pgcdc.lake.write.maintenance``). ``path`` may be ``s3://bucket/prefix``:
    ``[lake.s3]`` then says how to reach the store (``endpoint``, ``region`` ["us-east-1"],
    ``path_style`` [false]); credentials come from the environment.
``[spark]``
    ``master`` ["local[*]"]: ``local[N]``, ``spark://host:port``, ``yarn`` or ``k8s://...``
    (not Spark Connect: the lake is written through Delta's Spark connector in the driver's
    JVM); ``app_name`` ["pgcdc"]; ``driver_host``: the address executors reach this process
    at; ``[spark.conf]``: any Spark settings (strings, numbers, booleans; a key quoted or not:
    TOML's dotted keys are joined back into Spark's names).
``[stream]``
    ``trigger_interval`` [5] seconds between micro-batches when running continuously;
    ``max_changes_per_trigger`` [250000] and ``max_bytes_per_trigger`` [none]: batch size
    limits (whole transactions, at least one per batch); ``snapshot_partitions_per_table``
    [by size]: ctid ranges each table's initial copy is split into.
``[metrics]``
    ``port`` [0: off]: serve Prometheus metrics at ``http://<addr>:<port>/metrics`` while
    ``run`` runs; ``addr`` ["127.0.0.1"]: the address to listen on (``"0.0.0.0"`` lets a
    Prometheus on another machine scrape it).
``[catalog]`` (absent: none)
    register every lake table in the Spark session's catalog (``pgcdc.lake.store.metastore``):
    ``database`` ["{schema}"] and ``table`` ["{table}"], the mirror's name as patterns of the
    source's ``{schema}`` and ``{table}``; ``history_suffix`` ["_history"] and
    ``changelog_suffix`` ["_changelog"]; ``[catalog.names]``: ``"schema.table" =
    "database.table"`` for single tables. Which catalog is ``[spark.conf]``'s (by default an
    embedded metastore under the lake's ``_pgcdc/``; a local lake only).
``[[tables]]`` (one entry per table or pattern)
    ``name``: ``schema.table`` (``public`` if unqualified; ``*`` and ``?`` match within a part;
    double-quote parts with dots or upper case); ``row_filter``: an SQL expression, or a list
    of them (OR-combined, as PostgreSQL combines several publications' filters), which may only
    use replica identity columns (one expression each: no ``;``, no second statement; pgcdc
    sends its own rendering of the parsed expression, never the text); ``history`` /
    ``changelog``: override the ``[lake]`` defaults. A table matched by several entries takes
    the exact-name entry, else the patterns must agree. A partition takes its root's entry when
    it has none of its own.

Example::

    [source]
    dsn = "host=db.internal dbname=shop user=pgcdc"   # or dsn_env = "SHOP_DSN"
    slot = "pgcdc_shop"
    publication = "pgcdc_shop"

    [lake]
    path = "lake"

    [spark]
    master = "local[*]"

    [[tables]]
    name = "shop.*"

    [[tables]]
    name = "shop.orders"
    row_filter = "tenant_id = 42"   # part of the primary key (replica identity)
    history = true
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import string
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pgcdc.errors import PgcdcError
from pgcdc.filters import RowFilter, RowFilterError
from pgcdc.lake.store.delta import CHECKPOINT_FALLBACK
from pgcdc.lake.store.metastore import embedded_metastore
from pgcdc.lake.store.storage import LakeLocation, S3Settings, is_s3_uri
from pgcdc.lake.write.maintenance import Maintenance
from pgcdc.protocol.filter_sql import RowFilterSQL
from pgcdc.replication import check_publication_name, scrub_secrets
from pgcdc.sizes import parse_size

__all__ = [
    "CatalogSettings",
    "ConfigError",
    "LakeSettings",
    "MetricsSettings",
    "PipelineConfig",
    "SourceSettings",
    "SparkSettings",
    "StreamSettings",
    "TableSettings",
    "load_config",
    "parse_config",
    "split_table_name",
]

_SLOT = re.compile(r"[a-z0-9_]{1,63}")
#: ``[source] retained_wal_warning`` by default: 1 GiB
DEFAULT_RETAINED_WAL_WARNING = 1 << 30


def _size(value: object) -> object:
    if isinstance(value, str):
        return parse_size(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f'must be a whole number of bytes or a size such as "512MB", got {_got(value)}'
        )
    return value


#: bytes, or a size such as "512MB" in pipeline.toml
Size = Annotated[int, BeforeValidator(_size)]

#: S3's rules for bucket names (3-63 characters; S3-compatible stores follow them)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_LOCAL_MASTER = re.compile(r"local(\[(\*|[1-9][0-9]*)(,\s*[1-9][0-9]*)?\])?")


class ConfigError(PgcdcError, ValueError):
    """A wrong pipeline configuration: ``problems`` lists ``(key, what is wrong)`` pairs."""

    def __init__(self, problems: Sequence[tuple[str, str]], *, source: str | None = None) -> None:
        self.problems = tuple(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"invalid pipeline configuration{where}:"]
        lines += [f"  {key}: {problem}" for key, problem in self.problems]
        super().__init__("\n".join(lines))


def split_table_name(text: str) -> tuple[str, str]:
    """``"schema.table"`` -> ``("schema", "table")``; a part may be double-quoted (``"a.b".c``),
    with ``""`` for a quote inside; an unqualified name means schema ``public``."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            j = i + 1
            buf: list[str] = []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ValueError(f"unterminated quoted name in {text!r}")
                buf.append(text[j:k])
                if k + 1 < n and text[k + 1] == '"':
                    buf.append('"')
                    j = k + 2
                    continue
                i = k + 1
                break
            parts.append("".join(buf))
        else:
            k = text.find(".", i)
            part = text[i:] if k < 0 else text[i:k]
            if '"' in part:
                raise ValueError(f"misplaced double quote in {text!r}")
            parts.append(part)
            i = n if k < 0 else k
        if i >= n:
            break
        if text[i] != ".":
            raise ValueError(f"expected '.' after a quoted name in {text!r}")
        i += 1
        if i >= n:
            raise ValueError(f"{text!r} ends with '.'")
    if any(not p for p in parts):
        raise ValueError(f"empty name part in {text!r}")
    if len(parts) == 1:
        return "public", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(
        f"{text!r} has {len(parts)} dot-separated parts: write schema.table (double-quote a "
        "name that contains a dot)"
    )


class _Model(BaseModel):
    # strict: "yes" is no boolean, "5" and 5.0 are no whole numbers, 5 is no string
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, strict=True)


class SourceSettings(_Model):
    """``[source]``: the PostgreSQL database, its slot and its publication."""

    dsn: str | None = Field(default=None, description="libpq connection string or URI")
    dsn_env: str | None = Field(
        default=None, description="name of an environment variable holding the DSN"
    )
    slot: str = Field(description="logical replication slot (pgoutput) the pipeline owns")
    publication: str = Field(description="publication the pipeline reads (created if missing)")
    via_partition_root: bool = Field(
        default=False,
        description="publish partitions' changes as their partitioned root table's",
    )
    connect_timeout: float = Field(default=10.0, gt=0)
    heartbeat_interval: float = Field(
        default=60.0, ge=0, description="seconds between heartbeats (0: no heartbeats)"
    )
    heartbeat: Literal["message", "table"] = Field(
        default="message",
        description="message: pg_logical_emit_message; table: update heartbeat_table",
    )
    heartbeat_table: str = Field(
        default="public.pgcdc_heartbeat", description="schema.table of heartbeat = 'table'"
    )
    retained_wal_warning: Size = Field(
        default=DEFAULT_RETAINED_WAL_WARNING,
        gt=0,
        description="bytes of WAL the slot may retain before a warning (or '5GB')",
    )
    health_check_interval: float = Field(
        default=10.0, gt=0, description="seconds between checks of the slot while running"
    )
    table_discovery_interval: float = Field(
        default=300.0,
        ge=0,
        description="seconds between checks, while run streams, for tables created on the "
        "source that a [[tables]] pattern matches (0: only when a run starts)",
    )

    @field_validator("heartbeat_table")
    @classmethod
    def _heartbeat_table(cls, value: str) -> str:
        split_table_name(value)  # raises ValueError with the reason
        if any(ch in value for ch in "*?["):
            raise ValueError(f"{value!r}: name one table, without wildcards")
        return value

    @property
    def heartbeat_schema_table(self) -> tuple[str, str]:
        return split_table_name(self.heartbeat_table)

    @field_validator("slot")
    @classmethod
    def _slot(cls, value: str) -> str:
        if not _SLOT.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a valid slot name: 1 to 63 lower-case letters, digits and "
                "underscores"
            )
        return value

    @field_validator("publication")
    @classmethod
    def _publication(cls, value: str) -> str:
        return check_publication_name(value)  # the slot names' rule; ValueError says why

    @model_validator(mode="after")
    def _one_dsn(self) -> SourceSettings:
        if (self.dsn is None) == (self.dsn_env is None):
            raise ValueError("give exactly one of dsn and dsn_env")
        return self

    def resolved_dsn(self, environ: Mapping[str, str] | None = None) -> str:
        """The connection string (read from ``dsn_env`` if that is how it is given)."""
        if self.dsn is not None:
            return self.dsn
        env = os.environ if environ is None else environ
        assert self.dsn_env is not None
        value = env.get(self.dsn_env)
        if not value:
            raise ConfigError(
                [("source.dsn_env", f"environment variable {self.dsn_env} is not set or empty")]
            )
        return value


#: the placeholders of ``[catalog] database`` and ``table``
_CATALOG_FIELDS = ("schema", "table")


def _catalog_pattern(value: object) -> object:
    """A ``[catalog]`` name pattern: text with ``{schema}`` / ``{table}`` (``{{`` and ``}}``
    for braces), nothing else between braces."""
    if not isinstance(value, str):
        return value  # the type error names what it must be
    try:
        parts = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise ValueError(f"{value!r}: {exc}; write {{{{ and }}}} for a brace") from None
    for _text, field, spec, conversion in parts:
        if field is not None and (field not in _CATALOG_FIELDS or spec or conversion):
            raise ValueError(
                f"{value!r}: only {{schema}} and {{table}} can be filled in (the source "
                "table's schema and name); write {{ and }} for a brace"
            )
    return value


class CatalogSettings(_Model):
    """``[catalog]``: register the lake's tables in the Spark session's catalog by name."""

    database: Annotated[str, Field(min_length=1), BeforeValidator(_catalog_pattern)] = Field(
        default="{schema}",
        description="the database of a table's names: a pattern of {schema} and {table}",
    )
    table: Annotated[str, Field(min_length=1), BeforeValidator(_catalog_pattern)] = Field(
        default="{table}", description="the mirror's name: a pattern of {schema} and {table}"
    )
    history_suffix: str = Field(
        default="_history", min_length=1, description="the history's name: the mirror's + this"
    )
    changelog_suffix: str = Field(
        default="_changelog",
        min_length=1,
        description="the changelog's name: the mirror's + this",
    )
    names: dict[str, str] = Field(
        default_factory=dict,
        description='per source table ("schema.table"), its mirror\'s "database.table"',
    )

    @field_validator("names")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for source, name in value.items():
            try:
                split_table_name(source)
            except ValueError as exc:
                raise ValueError(f"{source!r}: {exc}") from None
            if any(ch in source for ch in "*?["):
                raise ValueError(f"{source!r}: name one table, without wildcards")
            database, dot, table = name.partition(".")
            if not dot or not database or not table or "." in table:
                raise ValueError(
                    f'{source!r} = {name!r}: write the name as "database.table" (one dot)'
                )
        return value

    def name(self, schema: str, table: str) -> tuple[str, str]:
        """The (database, table) of a source table's mirror."""
        for source, name in self.names.items():
            if split_table_name(source) == (schema, table):
                database, _, mirror = name.partition(".")
                return database, mirror
        fields = {"schema": schema, "table": table}
        return self.database.format_map(fields), self.table.format_map(fields)


class MetricsSettings(_Model):
    """``[metrics]``: the Prometheus endpoint of a running pipeline."""

    port: int = Field(default=0, ge=0, le=65535, description="HTTP port (0: no endpoint)")
    addr: str = Field(default="127.0.0.1", min_length=1, description="address to listen on")


#: the maintenance defaults (written once, in ``Maintenance``)
_MAINTENANCE = Maintenance()


class S3Section(_Model):
    """``[lake.s3]``: how to reach the S3-compatible store of an ``s3://`` lake. Credentials are
    never set here: pgcdc, Spark and delta-rs take them from the environment
    (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``) or the standard AWS chain."""

    endpoint: str | None = Field(
        default=None,
        description="the store's URL, e.g. http://127.0.0.1:9000 (default: AWS S3 itself)",
    )
    region: str = Field(default="us-east-1", min_length=1, description="the bucket's region")
    path_style: bool = Field(
        default=False,
        description="bucket in the URL's path, not its host name (most self-hosted stores)",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(
                f"{value!r}: write the endpoint as a URL, https://host[:port] (or http:// for "
                "a store without TLS)"
            )
        return value.rstrip("/") if value else value

    def settings(self) -> S3Settings:
        return S3Settings(self.endpoint, self.region, self.path_style)


class LakeSettings(_Model):
    """``[lake]``: where the Delta tables live and which kinds every table gets by default."""

    path: Path | str = Field(
        description=(
            "lake folder (local or shared filesystem), or s3://bucket/prefix (with [lake.s3])"
        )
    )
    s3: S3Section | None = Field(default=None, description="the store of an s3:// lake")
    history: bool = Field(default=False, description="SCD type 2 history table per table")
    changelog: bool = Field(default=False, description="append-only change log per table")
    write: Literal["indexed", "merge"] = Field(
        default="indexed",
        description=(
            "how a batch changes a table with a key: 'indexed' (new files, deletion vectors "
            "from the key index, one commit; no scan of the table) or 'merge' (Delta's MERGE)"
        ),
    )
    on_table_failure: Literal["park", "stop", "resync"] = Field(
        default="park",
        description=(
            "a table whose DDL the lake cannot follow, or whose stream holds a value no lake "
            "column can: 'park' it (the others stream on; pgcdc resync brings it back), "
            "'stop' the pipeline, or 'resync' it (copied anew at once)"
        ),
    )
    checkpoint_commits: int = Field(
        default=_MAINTENANCE.checkpoint_commits,
        ge=1,
        # Delta's own fallback on the tables checkpoints in the committing thread (a batch's
        # time again): maintenance must always come first
        le=CHECKPOINT_FALLBACK // 2,
        description=(
            "write a checkpoint of a Delta table's log once this many commits followed its last "
            "one, less up to half by the table's path (a reader replays at most this many "
            "commit files; a checkpoint is a few Spark jobs, and a batch over many tables "
            "commits each); at most half the tables' own delta.checkpointInterval "
            f"({CHECKPOINT_FALLBACK})"
        ),
    )
    compact_files: int = Field(
        default=_MAINTENANCE.compact_files,
        ge=0,
        description=(
            "compact a Delta table once it holds this many files smaller than a quarter of "
            "target_file_size (every batch adds files); 0: never"
        ),
    )
    target_file_size: Size = Field(
        default=_MAINTENANCE.target_file_size,
        ge=1 << 20,
        description=(
            "the size compaction rewrites small files into (or '16MB'); every compaction "
            "rewrites the files below it again, so it bounds a compaction's work"
        ),
    )
    purge_deleted_share: float = Field(
        default=_MAINTENANCE.purge_deleted_share,
        ge=0,
        le=1,
        description=(
            "rewrite a Delta table's files without the rows its deletion vectors mark deleted "
            "once those are more than this share of its rows (checked every vacuum_interval); "
            "1: never"
        ),
    )
    vacuum: bool = Field(
        default=_MAINTENANCE.vacuum,
        description=(
            "delete, at most every vacuum_interval seconds, the files no version of the last "
            "vacuum_retention_hours uses (replaced by compaction and MERGEs)"
        ),
    )
    vacuum_retention_hours: int = Field(
        default=_MAINTENANCE.vacuum_retention_hours,
        ge=0,
        description=(
            "how long replaced files stay for readers of older versions (Delta: 168); files "
            "no version used are removed once that old, and only with 1 hour or more"
        ),
    )
    vacuum_interval: float = Field(
        default=_MAINTENANCE.vacuum_interval,
        ge=0,
        description="seconds between two vacuums of a Delta table (each lists its folder)",
    )

    def location(self) -> LakeLocation:
        """Where the lake is and how to reach it."""
        s3 = self.s3.settings() if self.s3 is not None else None
        return LakeLocation.parse(self.path, s3).register()

    def maintenance(self) -> Maintenance:
        """When to checkpoint, compact, purge and vacuum the Delta tables, as these settings
        say."""
        return Maintenance(
            checkpoint_commits=self.checkpoint_commits,
            compact_files=self.compact_files,
            target_file_size=self.target_file_size,
            purge_deleted_share=self.purge_deleted_share,
            vacuum=self.vacuum,
            vacuum_retention_hours=self.vacuum_retention_hours,
            vacuum_interval=self.vacuum_interval,
        )

    @field_validator("path", mode="before")
    @classmethod
    def _path(cls, value: object) -> object:
        if not isinstance(value, str | Path):
            raise ValueError(
                f'must be a string, got {_got(value)}: write path = "lake" (a folder) or '
                'path = "s3://bucket/prefix"'
            )
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("the lake path is empty")
            if is_s3_uri(value):
                bucket = value.split("://", 1)[1].split("/", 1)[0]
                if not _BUCKET.fullmatch(bucket):
                    raise ValueError(
                        f"{value!r}: {bucket!r} is not an S3 bucket name (3-63 lower-case "
                        "letters, digits, dots and hyphens): write s3://bucket/prefix"
                    )
                prefix = value.split("://", 1)[1].split("/", 1)[1:]
                parts = prefix[0].rstrip("/").split("/") if prefix and prefix[0].strip("/") else []
                if any(p in ("", ".", "..") for p in parts) or any(c in value for c in "?#"):
                    # Spark (Hadoop's Path) reads s3a://b/x//lake as s3a://b/x/lake, boto3 and
                    # pyarrow do not: the lock and state would not be beside the tables
                    raise ValueError(
                        f"{value!r}: write the prefix without empty, '.' or '..' parts and "
                        "without '?' or '#': s3://bucket/prefix"
                    )
                return value
            if "://" in value and not value.startswith("file://"):
                raise ValueError(
                    f"{value!r}: lake.path is a local or mounted folder, or s3://bucket/prefix"
                )
            if value.startswith("file://"):
                return Path(value[len("file://") :])
            return Path(value)
        return value

    @model_validator(mode="after")
    def _s3(self) -> LakeSettings:
        if self.s3 is not None and not isinstance(self.path, str):
            raise ValueError(
                "[lake.s3] is set but lake.path is a local folder: write lake.path as "
                "s3://bucket/prefix, or remove [lake.s3]"
            )
        return self


class SparkSettings(_Model):
    """``[spark]``: where the Spark work runs."""

    master: str = Field(
        default="local[*]",
        description="Spark master URL (local[*], spark://host:7077, yarn, k8s://...)",
    )
    app_name: str = "pgcdc"
    driver_host: str | None = Field(
        default=None,
        description="address executors use to reach this process (spark.driver.host)",
    )
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark settings")

    @field_validator("master")
    @classmethod
    def _master(cls, value: str) -> str:
        if value.startswith("sc://"):
            raise ValueError(
                f"{value!r} is a Spark Connect URL: pgcdc run writes the lake through Delta's "
                "Spark connector in the driver's JVM, which Spark Connect does not give; use "
                "local[*], spark://host:port, yarn or k8s://..."
            )
        ok = (
            _LOCAL_MASTER.fullmatch(value) is not None
            or value.startswith(("spark://", "k8s://", "mesos://"))
            or value == "yarn"
        )
        if not ok:
            raise ValueError(
                f"{value!r} is not a Spark master URL: use local[*], local[N], spark://host:port, "
                "yarn or k8s://..."
            )
        return value

    @field_validator("conf", mode="before")
    @classmethod
    def _conf(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value  # the type error names what [spark.conf] must be
        settings: dict[str, str] = {}
        for name, text in _spark_settings(value):
            if name in settings:
                raise ValueError(f"{name} is set twice (once as a quoted key): keep one")
            settings[name] = text
        return settings


def _spark_settings(table: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``[spark.conf]`` as Spark's settings, names and values as strings: in TOML an unquoted
    dotted key (``spark.sql.shuffle.partitions = 4``) is a table in a table, joined back here."""
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _spark_settings(value, f"{name}.")
        elif isinstance(value, bool):
            yield name, "true" if value else "false"  # as Spark writes booleans
        elif isinstance(value, str | int | float):
            yield name, str(value)
        else:
            raise ValueError(
                f"{name}: a Spark setting is a string, a number or a boolean, got {_got(value)}"
            )


class StreamSettings(_Model):
    """``[stream]``: how changes are batched."""

    trigger_interval: float = Field(
        default=5.0, ge=0, description="seconds between micro-batches when running continuously"
    )
    max_changes_per_trigger: int | None = Field(default=250_000, gt=0)
    max_bytes_per_trigger: Size | None = Field(default=None, gt=0)
    snapshot_partitions_per_table: int | None = Field(
        default=None, gt=0, description="ctid ranges each table's snapshot is split into"
    )


RowFilterText = Annotated[str, Field(min_length=1)]


class TableSettings(_Model):
    """One ``[[tables]]`` entry: tables matched by ``name`` and what they get."""

    name: str = Field(description="schema.table; * and ? are wildcards within a part")
    row_filter: RowFilterText | list[RowFilterText] | None = Field(
        default=None,
        description="row filter (SQL expression over the table's columns); several are "
        "OR-combined, as PostgreSQL combines several publications' filters",
    )
    history: bool | None = None
    changelog: bool | None = None
    text_columns: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="columns mirrored as the text their type's output function prints: for "
        "values no typed column holds (NaN in numeric(p,s), arrays of more dimensions than "
        "declared); a column must be in at least one table the entry names",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        split_table_name(value)  # raises ValueError with the reason
        return value

    @field_validator("row_filter")
    @classmethod
    def _filters(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and not value:
            raise ValueError("an empty list: omit row_filter instead")
        texts = [value] if isinstance(value, str) else value or []
        for i, text in enumerate(texts):
            if not text.strip():
                raise ValueError("an empty row filter: omit it instead")
            # parsed and printed back now: what is not exactly one expression (a second
            # statement, a comment hiding the rest, unbalanced parentheses) never gets further
            try:
                RowFilter.parse(text).sql()
            except RowFilterError as exc:
                which = f"filter {i} of the list" if isinstance(value, list) else "the filter"
                lines = str(exc).splitlines()
                raise ValueError(
                    f"{which} is not one SQL expression pgcdc accepts: " + "\n    ".join(lines)
                ) from None
        return value

    @property
    def schema_pattern(self) -> str:
        return split_table_name(self.name)[0]

    @property
    def table_pattern(self) -> str:
        return split_table_name(self.name)[1]

    @property
    def is_pattern(self) -> bool:
        return any(ch in self.name for ch in "*?[")

    def matches(self, schema: str, table: str) -> bool:
        return fnmatch.fnmatchcase(schema, self.schema_pattern) and fnmatch.fnmatchcase(
            table, self.table_pattern
        )

    @property
    def filters(self) -> tuple[str, ...]:
        if self.row_filter is None:
            return ()
        if isinstance(self.row_filter, str):
            return (self.row_filter,)
        return tuple(self.row_filter)

    def combined_filter(self) -> RowFilterSQL | None:
        """The filters as one SQL expression (OR of them) printed from their parse trees, or
        None for every row."""
        filters = self.filters
        if not filters:
            return None
        return RowFilter.any_of_sql([RowFilter.parse(f) for f in filters])


class PipelineConfig(_Model):
    """The whole ``pipeline.toml``."""

    source: SourceSettings
    lake: LakeSettings
    spark: SparkSettings = Field(default_factory=SparkSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    catalog: CatalogSettings | None = Field(
        default=None, description="register the lake's tables in the Spark session's catalog"
    )
    tables: list[TableSettings] = Field(
        default_factory=list,
        description="tables to mirror; empty: every table of an existing publication",
    )

    def table_settings(self, schema: str, table: str) -> tuple[int, TableSettings] | None:
        """The entry (index, settings) that applies to a table, or None if none matches.

        An exact name wins over patterns; a table matched by several patterns (and no exact
        name) takes the first of them only if all agree, else ConfigError names both entries.
        """
        matching = [(i, t) for i, t in enumerate(self.tables) if t.matches(schema, table)]
        if not matching:
            return None
        exact = [(i, t) for i, t in matching if not t.is_pattern]
        if len(exact) > 1:
            raise ConfigError(
                [
                    (
                        f"tables[{exact[1][0]}].name",
                        f"names {schema}.{table} again (already tables[{exact[0][0]}])",
                    )
                ]
            )
        if exact:
            return exact[0]
        first = matching[0]
        for other in matching[1:]:
            if other[1].model_dump(exclude={"name"}) != first[1].model_dump(exclude={"name"}):
                raise ConfigError(
                    [
                        (
                            f"tables[{other[0]}].name",
                            f"pattern {other[1].name!r} matches {schema}.{table} like "
                            f"tables[{first[0]}] ({first[1].name!r}) but with other settings: "
                            "add an entry with the exact table name to decide",
                        )
                    ]
                )
        return first

    def history_for(self, settings: TableSettings | None) -> bool:
        if settings is not None and settings.history is not None:
            return settings.history
        return self.lake.history

    def changelog_for(self, settings: TableSettings | None) -> bool:
        if settings is not None and settings.changelog is not None:
            return settings.changelog
        return self.lake.changelog

    def describe(self) -> str:
        """A one-line summary safe for logs (no password)."""
        dsn = self.source.dsn if self.source.dsn is not None else f"${self.source.dsn_env}"
        return (
            f"source {scrub_secrets(dsn)} slot {self.source.slot} publication "
            f"{self.source.publication}, lake {self.lake.path}, spark {self.spark.master}"
        )


_TYPE_LABELS = frozenset(("str", "int", "float", "bool", "list", "dict"))


def _is_label(part: int | str) -> bool:
    """Whether a part of an error's location is a union branch's label pydantic adds."""
    return isinstance(part, str) and (part in _TYPE_LABELS or any(ch in part for ch in "[(-"))


def _key(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_label(part):
            out += f".{part}" if out else part
    return out or "(top level)"


def _toml(value: object) -> str:
    """A string, number or boolean as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def _got(value: object) -> str:
    """What a key was given, in TOML's words."""
    if isinstance(value, str):
        return f"the string {_toml(value)}"
    if isinstance(value, bool):
        return f"the boolean {_toml(value)}"
    if isinstance(value, int | float):
        return f"the number {_toml(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # TOML's dates and times


#: what a key of each type takes, in TOML's words, by pydantic's type error
_EXPECTED = {
    "bool_type": "true or false",
    "int_type": "a whole number",
    "float_type": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
}


def _is_number(text: str, kind: type[int] | type[float]) -> bool:
    try:
        kind(text.strip())
    except ValueError:
        return False
    return True


def _how(error: str, loc: tuple[int | str, ...], value: object) -> str:
    """How to write a value the key of a type error takes."""
    name = next((p for p in reversed(loc) if isinstance(p, str)), "")
    item = isinstance(loc[-1], int)  # an item of a list
    lhs = "" if item or not name else f"{name} = "
    if error == "bool_type":
        return f"write {name} = true or {name} = false, without quotes"
    if error in ("int_type", "float_type"):
        kind = int if error == "int_type" else float
        if isinstance(value, str) and _is_number(value, kind):
            return f"write {lhs}{value.strip()}, without quotes"
        if isinstance(value, float) and error == "int_type":
            return f"write a whole number, without a fraction: {lhs}{int(value)}"
        example = "10" if error == "int_type" else "2.5"
        return f"write a number without quotes, such as {lhs}{example}"
    if error == "string_type":
        if isinstance(value, bool | int | float):
            return f"put it in quotes: {lhs}{json.dumps(_toml(value))}"
        return f'write {lhs}"..."'
    if error == "list_type":
        if loc == ("tables",) and isinstance(value, dict):
            return "start each entry with [[tables]], in double brackets"
        return f'write {lhs}["...", "..."]'
    if loc and loc[0] == "tables" and len(loc) == 2:
        return 'write each entry as [[tables]] and its keys below it (name = "schema.table")'
    return f"write it as a table: [{_key(loc)}] with its keys below it"


def _entry(data: Mapping[str, Any], loc: tuple[int | str, ...]) -> str:
    """`` ([[tables]] entry "shop.orders")`` for a key of a named ``[[tables]]`` entry."""
    tables = data.get("tables")
    if len(loc) < 3 or loc[0] != "tables" or not isinstance(loc[1], int) or loc[2] == "name":
        return ""
    if (
        not isinstance(tables, list)
        or loc[1] >= len(tables)
        or not isinstance(tables[loc[1]], dict)
    ):
        return ""
    name = tables[loc[1]].get("name")
    return f" ([[tables]] entry {_toml(name)})" if isinstance(name, str) else ""


#: keys earlier versions had, and why they are gone
_REMOVED = {
    key: (
        "no longer used: a micro-batch is now written by Delta's Spark connector on the "
        "executors, one commit per Delta table whatever its size, and never collected on the "
        "driver; remove this key"
    )
    for key in ("lake.rows_per_commit", "lake.bytes_per_commit")
}


def _problems(exc: ValidationError, data: Mapping[str, Any]) -> list[tuple[str, str]]:
    types: dict[str, list[str]] = {}  # a union's branches each report a type error
    typed: dict[str, tuple[str, tuple[int | str, ...], object]] = {}
    seen: dict[str, str] = {}
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not _is_label(p))
        key = _key(loc)
        kind = err["type"]
        if kind in _EXPECTED:
            expected = types.setdefault(key, [])
            if _EXPECTED[kind] not in expected:
                expected.append(_EXPECTED[kind])
            typed.setdefault(key, (kind, loc, err["input"]))
            seen.setdefault(key, "")
            continue
        msg = str(err["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        msg = msg.replace("Input should be", "should be")
        if kind == "extra_forbidden" and key in _REMOVED:
            msg = _REMOVED[key]
        elif kind == "extra_forbidden":
            msg = f"unknown key{_entry(data, loc)}: check its spelling and section"
        elif kind == "missing":
            msg = "required key is missing"
        elif kind == "literal_error":
            # pydantic lists the choices in Python's quotes: 'message' or 'table'
            choices = str(err.get("ctx", {}).get("expected", "")).replace("'", '"')
            msg = (
                f"must be {choices}, got {_got(err['input'])}{_entry(data, loc)}: "
                f"write {loc[-1]} = {choices.split(' or ')[0].split(', ')[0]}"
            )
        elif kind != "value_error":
            msg = f"{msg}, got {_got(err['input'])}{_entry(data, loc)}"
        if not seen.get(key):
            seen[key] = msg
        elif msg not in seen[key]:
            seen[key] = f"{seen[key]}; or {msg}"
    for key, expected in types.items():
        kind, loc, value = typed[key]
        what = f"must be {' or '.join(expected)}, got {_got(value)}{_entry(data, loc)}"
        how = _how(kind, loc, value)
        seen[key] = f"{what}: {how}" + (f"; or {seen[key]}" if seen[key] else "")
    return list(seen.items())


def _not_a_folder(path: Path) -> Path | None:
    """The nearest existing part of ``path`` (itself or an ancestor) when it is not a folder:
    the lake's state and tables are folders under it, which could then never be created."""
    for part in (path, *path.parents):
        if part.exists() or part.is_symlink():
            return None if part.is_dir() else part
    return None


def parse_config(
    data: Mapping[str, Any], *, base_dir: Path | None = None, source: str | None = None
) -> PipelineConfig:
    """Validate a configuration mapping; relative lake paths are taken from ``base_dir``."""
    try:
        config = PipelineConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(_problems(exc, data), source=source) from None
    path = config.lake.path
    if base_dir is not None and isinstance(path, Path) and not path.is_absolute():
        lake = config.lake.model_copy(update={"path": (base_dir / path).resolve()})
        config = config.model_copy(update={"lake": lake})
    problems: list[tuple[str, str]] = []
    path = config.lake.path
    blocked = _not_a_folder(path) if isinstance(path, Path) else None
    if blocked is not None:
        what = "is" if blocked == config.lake.path else f"is under {blocked}, which is"
        problems.append(
            (
                "lake.path",
                f"{config.lake.path} {what} a file, not a folder: point lake.path at a folder "
                "(created on the first start if missing), or move that file away",
            )
        )
    embedded = config.catalog is not None and embedded_metastore(config.spark.conf)
    if embedded and isinstance(path, Path) and ";" in str(path):
        problems.append(
            (
                "catalog",
                f"the embedded metastore cannot live under {path} (a ';' ends its database "
                "name): move the lake to a path without ';', or give [spark.conf] a metastore "
                "service (spark.hadoop.hive.metastore.uris); see docs/catalog.md",
            )
        )
    if embedded and isinstance(path, str):
        problems.append(
            (
                "catalog",
                "an s3:// lake cannot hold the embedded metastore pgcdc sets up by default: "
                "give [spark.conf] a metastore service (spark.hadoop.hive.metastore.uris), AWS "
                "Glue's client factory or a catalog plugin (spark.sql.defaultCatalog); see "
                "docs/catalog.md",
            )
        )
    seen: dict[str, int] = {}
    for i, table in enumerate(config.tables):
        if table.name in seen:
            problems.append(
                (f"tables[{i}].name", f"{table.name!r} is already tables[{seen[table.name]}]")
            )
        seen.setdefault(table.name, i)
    if problems:
        raise ConfigError(problems, source=source)
    return config


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a ``pipeline.toml``."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([("(file)", f"cannot read {file}: {exc.strerror}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([("(syntax)", str(exc))], source=str(file)) from None
    return parse_config(data, base_dir=file.resolve().parent, source=str(file))
