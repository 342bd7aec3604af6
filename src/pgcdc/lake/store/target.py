"""A lake's Delta table as delta-rs reads it: its version, its application transactions, its
commits' metadata and its rows, outside Spark.

pgcdc writes every table with Delta's Spark connector (``pgcdc.lake.store.delta``); ``pgcdc
status``, ``--verify``, the demo and the tests read them back with delta-rs, the way a Polars or
DuckDB user would. Rows are read through delta-rs's query engine (``QueryBuilder``), which applies
the tables' deletion vectors. Whatever Arrow layout a reader hands back (``string``,
``large_string`` or ``string_view``; the binary and list ones likewise), ``read`` returns the
canonical one (``canonical_type``), so no caller depends on a library's choice.

``applied(app_id, version)`` tells whether a commit of that application transaction (or a later
version of it) is in the table: a micro-batch replayed after a crash skips the tables that
already have it.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError

from pgcdc.lake.store.storage import LakePath

__all__ = ["DeltaTarget", "canonical_schema", "canonical_type", "commit_metadata"]

log = logging.getLogger("pgcdc.lake")


def canonical_type(t: pa.DataType) -> pa.DataType:
    """``t`` in the layouts pgcdc works with: ``string``, ``binary``, ``list`` (not their large
    or view variants), timestamps with a time zone in UTC, every nested field nullable."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, canonical_type(f.type), True) for f in t])
    if (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        return pa.list_(pa.field("element", canonical_type(t.value_type), True))
    if pa.types.is_map(t):
        return pa.map_(canonical_type(t.key_type), canonical_type(t.item_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t) and t.tz is not None and t.tz != "UTC":
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    return t


def canonical_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, canonical_type(f.type), True) for f in schema])


def _canonical(table: pa.Table) -> pa.Table:
    schema = canonical_schema(table.schema)
    if schema.equals(table.schema.remove_metadata(), check_metadata=False):
        return table
    columns = [
        column if column.type == f.type else column.cast(f.type)
        for column, f in zip(table.columns, schema, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _identifier(name: str) -> str:
    """A column name quoted for delta-rs's SQL (DataFusion): double quotes, doubled inside."""
    return '"' + name.replace('"', '""') + '"'


def commit_metadata(commit: dict[str, Any]) -> dict[str, Any] | None:
    """pgcdc's metadata of a commit (from ``DeltaTable.history``): ``{"pgcdc": ...}`` in its
    ``userMetadata`` (a JSON text); None for other commits."""
    text = commit.get("userMetadata")
    if not isinstance(text, str):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    meta = data.get("pgcdc") if isinstance(data, dict) else None
    return meta if isinstance(meta, dict) else None


#: Loaded Delta tables by path, with the identity of the table they were loaded from (see
#: ``_identity``), kept across ``DeltaTarget`` objects: a micro-batch's targets are new objects,
#: and loading a table replays its log where ``update_incremental`` reads only the commits
#: since. Per thread, so that no DeltaTable is ever used by two threads at once.
class _Loaded(threading.local):
    def __init__(self) -> None:
        self.tables: dict[str, tuple[DeltaTable, str]] = {}


_LOADED = _Loaded()


class DeltaTarget:
    """One Delta table at ``path`` (which need not exist yet), read with delta-rs: a lake path
    (local or on S3), or a local folder."""

    __slots__ = ("_table", "_txn", "path")

    def __init__(self, path: LakePath | Path | str) -> None:
        self.path = path if isinstance(path, LakePath) else LakePath.parse(path)
        self._table: DeltaTable | None = None
        #: application transaction versions read at one table version: (version, {app id: v})
        self._txn: tuple[int, dict[str, int | None]] = (-1, {})

    @property
    def uri(self) -> str:
        return str(self.path)

    def _identity(self) -> str | None:
        """What tells a table from another one created at the same path later: its first
        commit file's version tag (None once log clean-up removed it; then the table is loaded
        afresh every time)."""
        return (self.path / "_delta_log" / "00000000000000000000.json").tag()

    def table(self, *, refresh: bool = True) -> DeltaTable | None:
        """The Delta table, or None if there is none at the path yet; with ``refresh``, at its
        latest version (brought up to date incrementally when it was loaded before)."""
        if self._table is not None and not refresh:
            return self._table
        if not (self.path / "_delta_log").is_dir():
            self._table = None
            return None
        table = self._load()
        if table is not self._table:  # another table object: its transactions are unread
            self._txn = (-1, {})
        self._table = table
        return table

    def _load(self) -> DeltaTable | None:
        identity = self._identity()
        cache = _LOADED.tables
        loaded = cache.get(self.uri)
        if loaded is not None and identity is not None and loaded[1] == identity:
            try:
                loaded[0].update_incremental()
            except Exception as exc:  # the log changed under it: load it afresh
                log.debug("%s: reloading the Delta table (%s)", self.uri, type(exc).__name__)
            else:
                return loaded[0]
        cache.pop(self.uri, None)
        try:
            table = DeltaTable(self.uri, storage_options=self.path.location.delta_rs_options())
        except TableNotFoundError:
            return None
        if identity is not None:
            cache[self.uri] = (table, identity)
        return table

    def exists(self) -> bool:
        return self.table() is not None

    def version(self) -> int | None:
        table = self.table()
        return None if table is None else int(table.version())

    def transaction_version(self, app_id: str) -> int | None:
        """The latest version of application transaction ``app_id`` in the table (read once per
        table version: it scans the log's transactions)."""
        table = self.table()
        if table is None:
            return None
        version = int(table.version())
        if self._txn[0] != version:
            self._txn = (version, {})
        known = self._txn[1]
        if app_id not in known:
            done = table.transaction_version(app_id)
            known[app_id] = None if done is None else int(done)
        return known[app_id]

    def applied(self, app_id: str, version: int) -> bool:
        """Whether a commit of ``app_id`` with this or a later version is in the table."""
        done = self.transaction_version(app_id)
        return done is not None and done >= version

    def version_before(self, app_id: str, version: int) -> int | None:
        """The table's version just before the commit that recorded application transaction
        ``(app_id, version)``: what the table held before that write. None when the table or
        that commit's log entry is not there (log clean-up keeps 30 days of them)."""
        latest = self.version()
        if latest is None:
            return None
        log_dir = self.path / "_delta_log"
        for v in range(latest, -1, -1):
            text = (log_dir / f"{v:020d}.json").read_text()
            if text is None:
                return None
            for line in text.splitlines():
                txn = json.loads(line).get("txn") if '"txn"' in line else None
                if txn and txn.get("appId") == app_id and txn.get("version") == version:
                    return v - 1
        return None

    def arrow_schema(self) -> pa.Schema | None:
        """The table's logical schema in canonical Arrow types (``canonical_type``)."""
        table = self.table()
        if table is None:
            return None
        return canonical_schema(pa.schema(table.schema().to_arrow()))

    def files(self) -> pa.Table:
        """The table's data files as the log lists them (``path``, ``size_bytes``,
        ``num_records``, and ``min.<column>`` / ``max.<column>`` / ``null_count.<column>`` for
        the columns with statistics, named by the columns' names, not column mapping's
        physical ones). ``num_records`` counts rows a deletion vector marks deleted too."""
        table = self.table()
        if table is None:
            return pa.table({"path": pa.array([], pa.string())})
        actions = pa.table(table.get_add_actions(flatten=True))
        logical = {}
        for f in json.loads(table.schema().to_json())["fields"]:
            physical = f.get("metadata", {}).get("delta.columnMapping.physicalName")
            if physical:
                logical[physical] = f["name"]
        names = []
        for name in actions.column_names:
            prefix, _, column = name.partition(".")
            names.append(f"{prefix}.{logical[column]}" if column in logical else name)
        return actions.rename_columns(names)

    def commits(self, limit: int | None = None) -> list[tuple[int, str, dict[str, Any] | None]]:
        """The latest commits, newest first: (version, operation, pgcdc's metadata or None)."""
        table = self.table()
        if table is None:
            return []
        return [
            (int(c.get("version", -1)), str(c.get("operation", "")), commit_metadata(c))
            for c in table.history(limit)
        ]

    def read(
        self, columns: list[str] | None = None, filter: pc.Expression | None = None
    ) -> pa.Table:
        """The table's current rows (deletion vectors applied), all columns of its current schema
        unless ``columns``, in canonical Arrow types; ``filter`` keeps the rows it holds for."""
        table = self.table()
        if table is None:
            raise FileNotFoundError(f"no Delta table at {self.path}")
        schema = self.arrow_schema()
        assert schema is not None
        names = list(schema.names) if columns is None else list(columns)
        wanted = names
        if filter is not None:  # the filter's columns are read too, then dropped
            wanted = list(schema.names)
        if not wanted:
            count = self._count(table)
            return pa.table({"__n": pa.nulls(count, pa.int8())}).drop_columns(["__n"])
        # every column name quoted as a DataFusion identifier: no text of it is read as SQL
        select = ", ".join(_identifier(n) for n in wanted)
        query = f"SELECT {select} FROM t"  # noqa: S608
        result = QueryBuilder().register("t", table).execute(query).read_all()
        rows = _canonical(pa.table(result))
        if filter is not None:
            rows = rows.filter(filter).select(names)
        return rows

    def _count(self, table: DeltaTable) -> int:
        result = QueryBuilder().register("t", table).execute("SELECT count(*) AS n FROM t")
        return int(pa.table(result.read_all()).column(0)[0].as_py())

    def count(self) -> int:
        table = self.table()
        return 0 if table is None else self._count(table)
