"""The lake's layout: which Delta table lives where, and the metadata columns pgcdc adds.

Per source table ``schema.table`` (names encoded by ``encode_name``):

* ``<lake>/<schema>/<table>``: the mirror (SCD type 1);
* ``<lake>/<schema>/<table>.history``: the history (SCD type 2), if enabled;
* ``<lake>/<schema>/<table>.changelog``: the change log, if enabled;
* ``<lake>/_pgcdc/``: the pipeline's own state (``state.json``, the streaming checkpoint).

``encode_name`` keeps ASCII letters, digits, ``_`` and ``-`` and non-ASCII letters and digits,
and writes every other character (and a leading ``_``) as ``~`` plus the hex digits of its UTF-8
bytes: ``my table`` -> ``my~20table``, ``a.b`` -> ``a~2Eb``, ``_x`` -> ``~5Fx``. So no table path
is ever ``.``/``..``, contains a separator, or collides with ``_pgcdc`` or a ``.history`` /
``.changelog`` suffix, and it needs no ``%`` (which delta-rs would decode as URL escapes).

pgcdc's own columns start with two underscores (the convention Databricks' AUTO CDC uses for
``__START_AT`` / ``__END_AT``); a source column with one of these exact names is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pgcdc.lake.store.storage import LakeLocation, LakePath

__all__ = [
    "CHANGELOG_COLUMNS",
    "HISTORY_COLUMNS",
    "MIRROR_COLUMNS",
    "RESERVED_COLUMNS",
    "RESERVED_PREFIX",
    "ROW_ID",
    "LakeLayout",
    "LakeTable",
    "TableKind",
    "case_clashes",
    "encode_name",
    "reserved_column",
    "text_columns_option",
]

TableKind = Literal["mirror", "history", "changelog"]

# mirror: the commit LSN and time of the change that last wrote the row
COMMIT_LSN = "__commit_lsn"
COMMIT_TIME = "__commit_time"
# mirror and history of a table without a key (REPLICA IDENTITY FULL, no primary key): which
# copy of its values the row is (the source may hold identical rows; ``pgcdc.lake.write.multiset``)
ROW_ID = "__row_id"
MIRROR_COLUMNS = (COMMIT_LSN, COMMIT_TIME, ROW_ID)

# history: a version is valid from its start (inclusive) to its end (exclusive, NULL: current)
START_LSN = "__start_lsn"
START_AT = "__start_at"
END_LSN = "__end_lsn"
END_AT = "__end_at"
IS_CURRENT = "__is_current"
START_OP = "__start_op"
END_OP = "__end_op"
HISTORY_COLUMNS = (START_LSN, START_AT, END_LSN, END_AT, IS_CURRENT, START_OP, END_OP)

# changelog: every change with its metadata
OP = "__op"
CL_COMMIT_LSN = "__commit_lsn"
CL_COMMIT_LSN_TEXT = "__commit_lsn_text"
CL_END_LSN = "__end_lsn"
POSITION = "__position"
XID = "__xid"
CL_COMMIT_TIME = "__commit_time"
OLD = "__old"
OLD_KIND = "__old_kind"
UNCHANGED = "__unchanged"
CHANGELOG_COLUMNS = (
    OP,
    CL_COMMIT_LSN,
    CL_COMMIT_LSN_TEXT,
    CL_END_LSN,
    POSITION,
    XID,
    CL_COMMIT_TIME,
    OLD_KIND,
    OLD,
    UNCHANGED,
)

RESERVED_COLUMNS = frozenset(MIRROR_COLUMNS + HISTORY_COLUMNS + CHANGELOG_COLUMNS)
#: pgcdc's working columns (MERGE sources) start with this; source columns may not
RESERVED_PREFIX = "__pgcdc"


_RESERVED_LOWER = frozenset(name.lower() for name in RESERVED_COLUMNS)


def reserved_column(name: str) -> bool:
    """Whether a source column's name clashes with pgcdc's metadata or working columns, in
    any case: Spark resolves column names without regard to case."""
    lower = name.lower()
    return lower in _RESERVED_LOWER or lower.startswith(RESERVED_PREFIX)


def case_clashes(names: Sequence[str]) -> list[tuple[str, ...]]:
    """The groups of ``names`` that differ only in case (Spark cannot tell them apart)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.lower(), []).append(name)
    return [tuple(group) for group in groups.values() if len(group) > 1]


def _keep(ch: str) -> bool:
    if ch.isascii():
        return ch.isalnum() or ch in "_-"
    return ch.isalnum()


def encode_name(name: str) -> str:
    """A schema or table name as one safe path component (see the module docstring)."""
    if not name:
        raise ValueError("cannot encode an empty name")
    out: list[str] = []
    for i, ch in enumerate(name):
        if _keep(ch) and not (i == 0 and ch == "_"):
            out.append(ch)
        else:
            out.append("".join(f"~{b:02X}" for b in ch.encode("utf-8")))
    return "".join(out)


class LakeLayout:
    """Paths inside one lake (``LakePath``: local, or on S3 with ``location``'s settings)."""

    __slots__ = ("location",)

    def __init__(self, root: LakeLocation | Path | str) -> None:
        self.location = root if isinstance(root, LakeLocation) else LakeLocation.parse(root)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LakeLayout) and other.location == self.location

    def __hash__(self) -> int:
        return hash(self.location)

    def __repr__(self) -> str:
        return f"LakeLayout({self.location.root!r})"

    @property
    def root(self) -> LakePath:
        return self.location.path()

    @property
    def state_dir(self) -> LakePath:
        return self.root / "_pgcdc"

    @property
    def state_file(self) -> LakePath:
        return self.state_dir / "state.json"

    def checkpoint_dir(self, generation: int) -> LakePath:
        return self.state_dir / f"checkpoint-{generation}"

    def split_table_id(self, table_id: str) -> tuple[str, str]:
        """The schema and name of a ``schema.table`` id (the state's), as the lake's folders
        tell: a schema or name may hold dots, so the split whose mirror exists (a Delta log),
        else the first dot (no dot: ``public``)."""
        splits = [i for i, ch in enumerate(table_id) if ch == "."]
        for i in splits:
            schema, name = table_id[:i], table_id[i + 1 :]
            if (self.table_path(schema, name) / "_delta_log").is_dir():
                return schema, name
        if not splits:
            return "public", table_id
        return table_id[: splits[0]], table_id[splits[0] + 1 :]

    def table_path(self, schema: str, table: str, kind: TableKind = "mirror") -> LakePath:
        base = self.root / encode_name(schema) / encode_name(table)
        if kind == "mirror":
            return base
        return base.with_name(f"{base.name}.{kind}")


@dataclass(frozen=True, slots=True)
class LakeTable:
    """One source table as the lake sees it: its key, its row filter and its table kinds."""

    schema: str
    name: str
    keys: tuple[str, ...]  # columns identifying a row (primary key / replica identity)
    replica_identity: str  # 'd', 'i', 'f' (pg_class.relreplident)
    #: no key: REPLICA IDENTITY FULL without a primary key (``keys`` are then every column,
    #: and the source may hold identical rows: the lake tables keep one row per copy)
    multiset: bool = False
    row_filter: str | None = None  # the publication's row filter, as the server prints it
    history: bool = False
    changelog: bool = False
    config_key: str | None = None  # e.g. "tables[2]", for error messages
    relkind: str = "r"  # 'r' table, 'p' partitioned table (published via its root)
    #: columns mirrored as their type's text (``[[tables]] text_columns``)
    text_columns: tuple[str, ...] = ()

    @property
    def table_id(self) -> str:
        """``schema.table`` as the Spark source's ``_table_id`` column carries it."""
        return f"{self.schema}.{self.name}"

    @property
    def row_keys(self) -> tuple[str, ...]:
        """The columns identifying a row of the mirror (and a version's row in the history):
        the key, or ``__row_id`` for a table without one."""
        return (ROW_ID,) if self.multiset else self.keys

    def stats_columns(self, kind: TableKind) -> tuple[str, ...]:
        """The columns whose min/max each file of a Delta table records: what its MERGEs match
        on (Delta skips the files outside a batch's keys), and the changelog's commit LSN (a
        reader's range of changes)."""
        if kind == "mirror":
            return (*self.row_keys, COMMIT_LSN, COMMIT_TIME)
        if kind == "history":
            return (*self.row_keys, START_LSN)
        return (CL_COMMIT_LSN,)

    def path(self, layout: LakeLayout, kind: TableKind = "mirror") -> LakePath:
        return layout.table_path(self.schema, self.name, kind)

    def kinds(self) -> tuple[TableKind, ...]:
        kinds: list[TableKind] = ["mirror"]
        if self.history:
            kinds.append("history")
        if self.changelog:
            kinds.append("changelog")
        return tuple(kinds)


def _quoted_name(table: LakeTable) -> str:
    """``"schema"."table"`` as the Spark source's options name tables (dots and quotes in
    names kept)."""

    def quoted(part: str) -> str:
        return '"' + part.replace('"', '""') + '"'

    return f"{quoted(table.schema)}.{quoted(table.name)}"


def text_columns_option(tables: Iterable[LakeTable]) -> dict[str, list[str]]:
    """The Spark source's ``textColumns`` option for ``tables``: quoted ``schema.table`` names
    -> the columns read as text."""
    return {_quoted_name(t): list(t.text_columns) for t in tables if t.text_columns}


def renamed_columns_option(
    tables: Iterable[tuple[LakeTable, Sequence[Sequence[str]]]],
) -> dict[str, dict[str, str]]:
    """The Spark source's ``renamedColumns`` option for ``tables`` with their renames
    ((former name, name) pairs, oldest first): quoted ``schema.table`` names -> renames."""
    return {_quoted_name(t): {a: b for a, b in pairs} for t, pairs in tables if pairs}
