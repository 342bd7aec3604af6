"""The lake's tables in the Spark session's catalog (``[catalog]``): by name, at their location.

With ``[catalog]``, every Delta table of the lake is registered in the catalog of pgcdc's Spark
session as an external Delta table at its location: the mirror of ``schema.table`` as
``<database>.<table>`` (``[catalog] database`` and ``table``, patterns of ``{schema}`` and
``{table}``: by default the source's schema and name; ``[catalog.names]`` for single tables),
its history and changelog under that name plus ``history_suffix`` / ``changelog_suffix``. A
reader then needs no path (``SELECT * FROM shop.orders``); Delta reads a registered table's
schema and versions from its log, so a column the stream adds shows in ``DESCRIBE TABLE`` at
once, and ``DESCRIBE HISTORY`` and ``VERSION AS OF`` work by name.

Which catalog is Spark's business (``[spark.conf]``). When ``[spark.conf]`` names none,
``catalog_conf`` gives the session Spark's built-in Hive support with an embedded metastore
(Apache Derby, in pyspark's jars) under ``<lake>/_pgcdc/metastore``: the default for one
machine. An embedded metastore is open in one process at a time, so a reader opens it once
``pgcdc run`` has stopped; readers while it runs need a metastore service
(``spark.hadoop.hive.metastore.uris``), AWS Glue or a catalog plugin such as Unity Catalog's
(docs/catalog.md).

Names are quoted (``delta.quote_name``), never pasted into SQL, and a location reaches Spark as
a value (``Catalog.createTable``'s path), never as SQL text. Spark's session catalog (the Hive
metastore, Glue) takes names of ASCII letters, digits and ``_`` only, without regard to case:
``name_problems`` refuses other names, and two tables under one name, before anything is
created.

Registration (``Registrar``) is idempotent: a name already registered at the table's location
is left as it is; one registered at another location is an error naming both, and nothing is
overwritten. It runs when a run starts, for the tables the lake has, and where a table is
created (``delta.on_create``: the initial copy, a table the stream creates later). Each name
pgcdc registers, and each database it creates, is recorded in ``<lake>/_pgcdc/catalog.json``
before it is created; ``unregister`` (``pgcdc drop --catalog``) removes those and nothing else:
a name pointing elsewhere by then, or one that was there before pgcdc, stays.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgcdc.errors import PgcdcError
from pgcdc.lake.store.delta import CATALOG, on_create, quote_name
from pgcdc.lake.store.storage import LakePath, StorageError
from pgcdc.lake.store.tables import LakeLayout, LakeTable, TableKind

if TYPE_CHECKING:
    import contextlib

    from pgcdc.lake.config import CatalogSettings

__all__ = [
    "CatalogError",
    "CatalogName",
    "Registrar",
    "Registration",
    "catalog_conf",
    "embedded_metastore",
    "name_problems",
    "registrations",
    "uses_session_catalog",
]

log = logging.getLogger("pgcdc.lake")

IMPLEMENTATION = "spark.sql.catalogImplementation"
DEFAULT_CATALOG = "spark.sql.defaultCatalog"
SESSION_CATALOG = "spark.sql.catalog.spark_catalog"
METASTORE_URIS = "spark.hadoop.hive.metastore.uris"
CONNECTION_URL = "spark.hadoop.javax.jdo.option.ConnectionURL"
CLIENT_FACTORY = "spark.hadoop.hive.metastore.client.factory.class"
WAREHOUSE = "spark.sql.warehouse.dir"
#: under the lake's ``_pgcdc/``: the embedded metastore's database, its warehouse (the folders
#: of the databases it creates; every table is external, so they stay empty) and Derby's log
METASTORE_DIR = "metastore"
WAREHOUSE_DIR = "warehouse"
DERBY_LOG = "derby.log"
#: what pgcdc registered, under ``_pgcdc/``
RECORD = "catalog.json"

#: the names Spark's session catalog takes (``SessionCatalog.validateName``)
SESSION_NAME = re.compile(r"[A-Za-z0-9_]+")


class CatalogError(PgcdcError, RuntimeError):
    """A lake table cannot be registered in (or removed from) the catalog."""


# -- the catalog's settings ----------------------------------------------------------------


def uses_session_catalog(conf: Mapping[str, str]) -> bool:
    """Whether names resolve in Spark's session catalog (``spark_catalog``: the Hive
    metastore, Glue, or an in-memory one), not a catalog plugin made the default."""
    return conf.get(DEFAULT_CATALOG, "spark_catalog").strip() in ("", "spark_catalog")


def embedded_metastore(conf: Mapping[str, str]) -> bool:
    """Whether ``[spark.conf]`` (``conf``) names no catalog of its own, so that a pipeline with
    ``[catalog]`` gets the embedded metastore under its lake."""
    if not uses_session_catalog(conf):
        return False
    if conf.get(SESSION_CATALOG, CATALOG) != CATALOG:  # another session catalog plugin
        return False
    if conf.get(IMPLEMENTATION, "hive") != "hive":
        return False
    return not any(conf.get(key) for key in (METASTORE_URIS, CONNECTION_URL, CLIENT_FACTORY))


def catalog_conf(conf: dict[str, str], layout: LakeLayout) -> None:
    """Add to a pipeline's session settings ``conf`` what ``[catalog]`` needs unless a catalog
    plugin is the default: Spark's Hive support, the folder of the databases it creates (under
    the lake's ``_pgcdc/``), and, when ``conf`` names no metastore, the embedded one there."""
    if not uses_session_catalog(conf):
        return
    embedded = embedded_metastore(conf)
    conf.setdefault(IMPLEMENTATION, "hive")
    state = layout.state_dir
    if embedded and not layout.location.is_s3:
        conf[CONNECTION_URL] = f"jdbc:derby:;databaseName={state / METASTORE_DIR};create=true"
    # where the databases pgcdc creates are placed (else the working folder's spark-warehouse)
    conf.setdefault(WAREHOUSE, str(state / WAREHOUSE_DIR))


# -- names ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatalogName:
    """A table's name in the catalog: its database and its name there."""

    database: str
    table: str

    def __str__(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def sql(self) -> str:
        """As Spark SQL reads it: each part quoted."""
        return f"{quote_name(self.database)}.{quote_name(self.table)}"

    @property
    def key(self) -> tuple[str, str]:
        """What the catalog tells names apart by (case does not count)."""
        return self.database.lower(), self.table.lower()


@dataclass(frozen=True, slots=True)
class Registration:
    """A lake table and the name it is registered under."""

    table_id: str  # the source table, schema.table
    kind: TableKind
    name: CatalogName
    location: str  # the Delta table's path (``LakeTable.path``)


def registrations(
    settings: CatalogSettings, layout: LakeLayout, tables: Iterable[LakeTable]
) -> list[Registration]:
    """The names of ``tables``' Delta tables (every kind each has)."""
    found = []
    for table in tables:
        database, mirror = settings.name(table.schema, table.name)
        suffixes = {"mirror": "", "history": settings.history_suffix}
        suffixes["changelog"] = settings.changelog_suffix
        for kind in table.kinds():
            name = CatalogName(database, mirror + suffixes[kind])
            found.append(Registration(table.table_id, kind, name, str(table.path(layout, kind))))
    return found


def name_problems(found: Sequence[Registration], *, session_catalog: bool) -> list[tuple[str, str]]:
    """What in ``found`` the catalog cannot hold: two tables under one name, and (in Spark's
    session catalog) names of other characters than letters, digits and ``_``."""
    problems: list[tuple[str, str]] = []
    fix = (
        'give it a name under [catalog.names] ("schema.table" = "database.table"), or '
        "change [catalog] database / table"
    )
    if session_catalog:
        for reg in found:
            bad = [
                part
                for part in (reg.name.database, reg.name.table)
                if not SESSION_NAME.fullmatch(part)
            ]
            if bad:
                problems.append(
                    (
                        "catalog",
                        f"{reg.table_id}'s {reg.kind} would be registered as {reg.name.sql}, "
                        f"but Spark's session catalog (Hive metastore, Glue) takes names of "
                        f"ASCII letters, digits and _ only ({quote_name(bad[0])}): {fix}",
                    )
                )
    seen: dict[tuple[str, str], Registration] = {}
    for reg in found:
        other = seen.setdefault(reg.name.key, reg)
        if other is not reg:
            problems.append(
                (
                    "catalog",
                    f"{other.table_id}'s {other.kind} and {reg.table_id}'s {reg.kind} would "
                    f"both be registered as {reg.name} (the catalog ignores case): {fix}",
                )
            )
    return problems


# -- registration --------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]


def _normal(location: str) -> str:
    """A location as the catalog and pgcdc both write it: ``file:/x`` and ``/x`` alike, ``s3``
    and ``s3a`` alike, no trailing ``/``."""
    text = location.strip()
    if text.startswith("file:"):
        text = "/" + text[len("file:") :].lstrip("/")
    for scheme in ("s3://", "s3n://"):
        if text.startswith(scheme):
            text = "s3a://" + text[len(scheme) :]
    return text.rstrip("/") or "/"


def _rows(spark: Any, statement: str) -> list[Any]:
    return list(spark.sql(statement).collect())


def _locked(exc: BaseException) -> bool:
    """Whether ``exc`` is the embedded metastore held by another process (Derby's words, in
    the error or any cause, or the JVM's stack trace pyspark keeps)."""
    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(texts) < 20:
        texts += [str(seen), str(getattr(seen, "_stackTrace", "") or "")]
        seen = seen.__cause__ or getattr(seen, "_cause", None)
    return any("Another instance of Derby may have already booted" in t for t in texts)


class Registrar:
    """Registers a pipeline's lake tables (``found``) in ``spark``'s catalog: at ``start`` the
    ones the lake has, then each one ``delta.create_table`` creates, until ``close``."""

    def __init__(self, layout: LakeLayout, found: Sequence[Registration]) -> None:
        self.layout = layout
        self.found = tuple(found)
        self._by_location = {_normal(r.location): r for r in found}
        self._lock = threading.Lock()
        self._listening: contextlib.AbstractContextManager[None] | None = None
        self._present: set[tuple[str, str]] = set()

    # the record of what pgcdc registered (``_pgcdc/catalog.json``)

    def _record(self) -> dict[str, Any]:
        try:
            text = (self.layout.state_dir / RECORD).read_text()
        except StorageError as exc:
            raise CatalogError(f"cannot read {self.layout.state_dir / RECORD}: {exc}") from None
        data = json.loads(text) if text else {}
        return {
            "databases": list(data.get("databases", [])),
            "tables": list(data.get("tables", [])),
        }

    def _save(self, record: Mapping[str, Any]) -> None:
        text = json.dumps({"format": 1, **record}, indent=2, sort_keys=True) + "\n"
        path = self.layout.state_dir / RECORD
        path.location.store().write(path.key, text.encode("utf-8"))

    def recorded(self) -> list[Registration]:
        """The tables pgcdc registered in this lake's catalog, as recorded."""
        return [
            Registration(
                t["source"], t["kind"], CatalogName(t["database"], t["table"]), t["location"]
            )
            for t in self._record()["tables"]
        ]

    def _note(self, *, database: str | None = None, reg: Registration | None = None) -> None:
        record = self._record()
        if database is not None and database not in record["databases"]:
            record["databases"].append(database)
        if reg is not None:
            entry = {
                "database": reg.name.database,
                "table": reg.name.table,
                "location": reg.location,
                "source": reg.table_id,
                "kind": reg.kind,
            }
            if entry not in record["tables"]:
                record["tables"].append(entry)
        self._save(record)

    # the catalog

    def location(self, spark: Any, name: CatalogName) -> str | None:
        """Where ``name`` is registered (None: it is not)."""
        if not spark.catalog.tableExists(name.sql):
            return None
        rows = _rows(spark, f"DESCRIBE TABLE EXTENDED {name.sql}")
        found = [str(r[1]) for r in rows if str(r[0]).strip() == "Location" and r[1]]
        return found[0] if found else ""

    def start(self, spark: Any) -> None:
        """Create the databases the names need, register the tables the lake has, and
        register each table created from now on."""
        self._derby_log(spark)
        try:
            with self._lock:
                have = {str(r[0]).lower() for r in _rows(spark, "SHOW DATABASES")}
                for database in dict.fromkeys(r.name.database for r in self.found):
                    if database.lower() not in have:
                        self._note(database=database)
                        spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote_name(database)}")
                        log.info("created database %s in the catalog", database)
                    tables = _rows(spark, f"SHOW TABLES IN {quote_name(database)}")
                    self._present |= {(database.lower(), str(r.tableName).lower()) for r in tables}
        except CatalogError:
            raise
        except Exception as exc:
            raise self._failure(exc, "open the catalog") from exc
        recorded = {r.name.key for r in self.recorded()}
        for reg in self.found:
            if not (LakePath.parse(reg.location) / "_delta_log").is_dir():
                continue  # created later: registered then (``_created``)
            if reg.name.key in self._present and reg.name.key in recorded:
                continue  # registered by an earlier run (a restart)
            self.register(spark, reg)
        self._listening = on_create(self._created)
        self._listening.__enter__()

    def _derby_log(self, spark: Any) -> None:
        """An embedded metastore's log beside it (Derby writes it to the working folder unless
        told otherwise when it starts: at the session's first use of the catalog)."""
        url = spark.sparkContext.getConf().get(CONNECTION_URL, "") or ""
        if url.startswith("jdbc:derby:") and not self.layout.location.is_s3:
            system = spark.sparkContext._jvm.java.lang.System
            if system.getProperty("derby.stream.error.file") is None:
                self.layout.state_dir.local().mkdir(parents=True, exist_ok=True)
                system.setProperty(
                    "derby.stream.error.file", str(self.layout.state_dir / DERBY_LOG)
                )

    def close(self) -> None:
        """Stop registering tables as they are created."""
        if self._listening is not None:
            self._listening.__exit__(None, None, None)
            self._listening = None

    def _created(self, spark: Any, path: str) -> None:
        reg = self._by_location.get(_normal(path))
        if reg is not None:
            self.register(spark, reg)

    def register(self, spark: Any, reg: Registration) -> bool:
        """Register ``reg``'s table under its name unless it is registered there already;
        whether it was registered now. A name taken by another location is an error."""
        with self._lock:
            try:
                where = self.location(spark, reg.name)
                if where is not None:
                    if _normal(where) != _normal(reg.location):
                        raise CatalogError(
                            f"cannot register {reg.table_id}'s {reg.kind} ({reg.location}) as "
                            f"{reg.name}: the catalog has {reg.name} at {where}, which is not "
                            "this lake's table. Nothing was changed. Fix: drop or rename that "
                            "table in the catalog, or give this one another name ([catalog] "
                            "database / table, or [catalog.names])"
                        )
                    return False
                self._note(reg=reg)  # first: a run killed now still knows the name is its own
                spark.catalog.createTable(reg.name.sql, path=reg.location, source="delta")
            except CatalogError:
                raise
            except Exception as exc:
                raise self._failure(
                    exc, f"register {reg.table_id}'s {reg.kind} as {reg.name}"
                ) from exc
            self._present.add(reg.name.key)
        log.info("registered %s's %s as %s", reg.table_id, reg.kind, reg.name)
        return True

    def _failure(self, exc: BaseException, what: str) -> CatalogError:
        if _locked(exc):
            return CatalogError(
                f"cannot {what}: the embedded metastore {self.layout.state_dir / METASTORE_DIR} "
                "is open in another process (a Spark session reading the lake's tables?), and "
                "an embedded metastore takes one process at a time. Fix: stop that session and "
                "run again; to read while pgcdc runs, use a metastore service "
                "(spark.hadoop.hive.metastore.uris, docs/catalog.md)"
            )
        return CatalogError(f"cannot {what}: {_first_line(exc)}")

    def unregister(self, spark: Any, *, tables: Sequence[str] | None = None) -> list[str]:
        """Remove from the catalog the tables pgcdc registered (those still at their lake
        table's location) and the databases it created (those left empty); what was done, a
        line each. The tables' files stay. ``tables``: only the registrations of these source
        tables (schema.table), and no database."""
        self._derby_log(spark)
        done: list[str] = []
        record = self._record()
        try:
            for reg in self.recorded():
                if tables is not None and reg.table_id not in tables:
                    continue
                where = self.location(spark, reg.name)
                if where is None:
                    done.append(f"{reg.name}: not in the catalog (nothing to remove)")
                elif _normal(where) != _normal(reg.location):
                    done.append(f"{reg.name}: kept (it is registered at {where} now)")
                else:
                    spark.sql(f"DROP TABLE IF EXISTS {reg.name.sql}")
                    done.append(f"{reg.name}: removed from the catalog")
                    log.info("removed %s from the catalog", reg.name)
            for database in record["databases"] if tables is None else ():
                if database.lower() not in {
                    str(r[0]).lower() for r in _rows(spark, "SHOW DATABASES")
                }:
                    continue
                if _rows(spark, f"SHOW TABLES IN {quote_name(database)}"):
                    done.append(f"database {database}: kept (it holds other tables)")
                    continue
                spark.sql(f"DROP DATABASE IF EXISTS {quote_name(database)}")
                done.append(f"database {database}: removed from the catalog")
        except Exception as exc:
            raise self._failure(exc, "remove the lake's tables from the catalog") from exc
        if tables is None:
            self._save({"databases": [], "tables": []})
        else:
            kept = [t for t in record["tables"] if t["source"] not in tables]
            self._save({"databases": record["databases"], "tables": kept})
        return done
