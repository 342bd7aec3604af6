"""``pgcdc run`` and ``pgcdc run --check`` (as a user runs them, in a subprocess) against a real
server, with row filters that try to run SQL of their own (issue 24, item 2): every one exits 2
and the server's catalog and tables are exactly as before. ``--check`` creates nothing at all,
whether the configuration is refused or fine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.catalog_snapshot import Snapshot, catalog_snapshot, changes
from tests.filters.injections import HARMLESS, ISSUE, REFUSED_BY_PARSER, REFUSED_BY_SERVER
from tests.fix_pg import PgDatabase

SETUP = """
CREATE SCHEMA rel;
CREATE TABLE rel.items (id int PRIMARY KEY);
CREATE TABLE public.items (id int PRIMARY KEY, qty int);
INSERT INTO rel.items VALUES (1), (2), (3);
INSERT INTO public.items VALUES (1, 5), (2, 6);
"""


def _toml(value: str) -> str:
    # a JSON string is a TOML basic string (escapes \\ \" \n \uXXXX)
    return json.dumps(value)


def _write_config(tmp_path: Path, pg: PgDatabase, filters: list[str]) -> Path:
    lines = [
        "[source]",
        f"dsn = {_toml(pg.dsn())}",
        'slot = "inj_slot"',
        'publication = "inj_pub"',
        "[lake]",
        'path = "lake"',
        "[spark]",
        'master = "local[1]"',
    ]
    for text in filters:
        lines += ["[[tables]]", 'name = "public.items"', f"row_filter = {_toml(text)}"]
    path = tmp_path / "pipeline.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgcdc", "run", "--config", str(config), *extra],
        cwd=config.parent,
        env=dict(os.environ, COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _snapshot(pg: PgDatabase) -> Snapshot:
    with pg.connect() as conn:
        return catalog_snapshot(conn)


def _unchanged(pg: PgDatabase, before: Snapshot, tmp_path: Path) -> None:
    assert changes(before, _snapshot(pg)) == {}
    assert pg.execute("SELECT to_regclass('public.pwned')") == [(None,)]
    assert pg.execute("SELECT count(*) FROM rel.items") == [(3,)]
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize("text", ISSUE)
@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_the_issues_filters_exit_2_and_change_nothing(
    pg: PgDatabase, tmp_path: Path, text: str, check: bool
) -> None:
    pg.execute(SETUP)
    before = _snapshot(pg)
    config = _write_config(tmp_path, pg, [text])
    done = _run(config, *(["--check"] if check else ["--until-caught-up"]))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "tables[0].row_filter" in done.stderr
    assert "not one SQL expression" in done.stderr
    _unchanged(pg, before, tmp_path)


@pytest.mark.parametrize("check", [True, False], ids=["check", "run"])
def test_every_injection_is_refused_under_its_key(
    pg: PgDatabase, tmp_path: Path, check: bool
) -> None:
    """All the texts at once, one [[tables]] entry each: the error names every entry's key
    (so each one is refused on its own), before anything connects."""
    pg.execute(SETUP)
    before = _snapshot(pg)
    config = _write_config(tmp_path, pg, REFUSED_BY_PARSER)
    done = _run(config, *(["--check"] if check else ["--until-caught-up"]))
    assert done.returncode == 2, done.stderr[-3000:]
    for i in range(len(REFUSED_BY_PARSER)):
        assert f"tables[{i}].row_filter:" in done.stderr, (i, done.stderr[-3000:])
    _unchanged(pg, before, tmp_path)


@pytest.mark.parametrize("text", REFUSED_BY_SERVER)
def test_sql_inside_a_constant_is_refused_by_the_server_and_changes_nothing(
    pg: PgDatabase, tmp_path: Path, text: str
) -> None:
    """One expression, so pgcdc sends its rendering (the would-be SQL is a string constant or a
    quoted name): the server refuses it in the dry run, which leaves nothing behind."""
    pg.execute(SETUP)
    before = _snapshot(pg)
    done = _run(_write_config(tmp_path, pg, [text]), "--check")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "tables[0].row_filter" in done.stderr
    assert "PostgreSQL refuses the filter for public.items" in done.stderr
    _unchanged(pg, before, tmp_path)


def test_check_creates_nothing_for_a_good_configuration(pg: PgDatabase, tmp_path: Path) -> None:
    """--check of a configuration that would work: exit 0, and still no publication, slot,
    table or lake. A publication an older pgcdc's --check left behind (pgcdc_filter_check) is
    no obstacle: the dry runs take names of their own."""
    pg.execute(SETUP)
    pg.execute("CREATE PUBLICATION pgcdc_filter_check FOR TABLE rel.items")
    before = _snapshot(pg)
    done = _run(_write_config(tmp_path, pg, [HARMLESS]), "--check")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "configuration OK: 1 tables (public.items), first start" in done.stderr
    _unchanged(pg, before, tmp_path)
