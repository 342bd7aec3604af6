"""pipeline.toml: every mistake is reported with the key it concerns, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc.lake.config import ConfigError, load_config, parse_config, split_table_name
from pgcdc.lake.store.tables import LakeLayout, encode_name

GOOD = """
[source]
dsn = "host=localhost dbname=shop"
slot = "pgcdc_shop"
publication = "pgcdc_shop"

[lake]
path = "lake"
history = true
purge_deleted_share = 0.4

[spark]
master = "spark://10.0.0.1:7077"
[spark.conf]
"spark.executor.memory" = "2g"
"spark.speculation" = false

[stream]
max_changes_per_trigger = 5000

[[tables]]
name = "shop.*"

[[tables]]
name = "shop.orders"
row_filter = ["status = 'paid'", "total > 100"]
changelog = true
"""


def test_good_config(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(GOOD)
    config = load_config(path)
    assert config.lake.path == (tmp_path / "lake").resolve()
    assert config.spark.conf == {"spark.executor.memory": "2g", "spark.speculation": "false"}
    assert config.stream.max_changes_per_trigger == 5000
    assert config.lake.maintenance().purge_deleted_share == 0.4
    index, orders = config.table_settings("shop", "orders") or (None, None)
    assert index == 1 and orders is not None
    combined = orders.combined_filter()
    assert combined is not None
    assert combined.text == '(("status" = \'paid\') OR ("total" > 100))'
    assert config.history_for(orders) and config.changelog_for(orders)
    index, items = config.table_settings("shop", "items") or (None, None)
    assert index == 0 and items is not None
    assert config.history_for(items) and not config.changelog_for(items)
    assert config.table_settings("public", "orders") is None


def problems(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return dict(info.value.problems)


BASE: dict[str, object] = {
    "source": {"dsn": "x", "slot": "s", "publication": "p"},
    "lake": {"path": "/tmp/lake"},
}


def test_errors_name_the_key() -> None:
    found = problems(
        {
            "source": {"slot": "Bad-Slot", "publication": "p"},
            "lake": {"path": "gs://bucket/lake", "rows_per_commit": 10, "purge_deleted_share": 2},
            "spark": {"master": "localhost"},
            "stream": {"max_changes_per_trigger": 0},
            "tables": [
                {"name": "a.b.c"},
                {"name": "x", "row_filter": 3},
                {"name": "y", "row_filter": []},
                {"name": "z", "histroy": True},
            ],
            "extra": 1,
        }
    )
    assert "valid slot name" in found["source.slot"]
    assert "or s3://bucket/prefix" in found["lake.path"]
    # a key of the earlier writer: gone, and said why
    assert "no longer used" in found["lake.rows_per_commit"]
    assert "less than or equal to 1" in found["lake.purge_deleted_share"]
    assert "not a Spark master URL" in found["spark.master"]
    assert "greater than 0" in found["stream.max_changes_per_trigger"]
    assert "3 dot-separated parts" in found["tables[0].name"]
    assert "string" in found["tables[1].row_filter"]
    assert "empty list" in found["tables[2].row_filter"]
    assert "unknown key" in found["tables[3].histroy"]
    assert "unknown key" in found["extra"]


def test_dsn_required() -> None:
    found = problems({**BASE, "source": {"slot": "s", "publication": "p"}})
    assert "exactly one of dsn and dsn_env" in found["source"]


def test_missing_sections_and_duplicates() -> None:
    assert problems({"source": BASE["source"]}) == {"lake": "required key is missing"}
    found = problems({**BASE, "tables": [{"name": "a.t"}, {"name": "a.t"}]})
    assert found == {"tables[1].name": "'a.t' is already tables[0]"}


def test_conflicting_patterns() -> None:
    config = parse_config({**BASE, "tables": [{"name": "s.*"}, {"name": "*.t", "history": True}]})
    with pytest.raises(ConfigError) as info:
        config.table_settings("s", "t")
    assert "tables[1].name" in dict(info.value.problems)
    assert config.table_settings("s", "u") is not None


def test_dsn_env() -> None:
    config = parse_config(
        {**BASE, "source": {"dsn_env": "MY_DSN", "slot": "s", "publication": "p"}}
    )
    assert config.source.resolved_dsn({"MY_DSN": "host=h"}) == "host=h"
    with pytest.raises(ConfigError) as info:
        config.source.resolved_dsn({})
    assert "MY_DSN is not set" in str(info.value)
    secret = parse_config(
        {**BASE, "source": {"dsn": "postgresql://u:hunter2@h/db", "slot": "s", "publication": "p"}}
    )
    assert "hunter2" not in secret.describe()


def test_table_names() -> None:
    assert split_table_name("t") == ("public", "t")
    assert split_table_name('"My.Schema"."T ""x"""') == ("My.Schema", 'T "x"')
    for bad in ("a.", '"a', "a.b.c", ""):
        with pytest.raises(ValueError):
            split_table_name(bad)


def test_lake_paths_are_safe() -> None:
    layout = LakeLayout(Path("/lake"))
    assert encode_name("orders") == "orders"
    assert encode_name("注文") == "注文"
    assert encode_name("my table") == "my~20table"
    assert encode_name("_pgcdc") == "~5Fpgcdc"
    assert encode_name("..") == "~2E~2E"
    assert encode_name("a/b%c") == "a~2Fb~25c"
    assert layout.table_path("s", "t").local() == Path("/lake/s/t")
    assert layout.table_path("s", "t", "history").local() == Path("/lake/s/t.history")
    assert layout.table_path("s", "t.history") != layout.table_path("s", "t", "history")


def test_session_conf_defaults_what_spark_conf_leaves_out(tmp_path: Path) -> None:
    """The pipeline's Spark session caches micro-batches in column batches of 1,000 rows (a
    512 MiB driver ran out of heap persisting a 540 MB transaction in Spark's 10,000-row
    batches), its Java serializer streams forget each object after it (a reader of the cached
    batch held 100), and a sort's spill readers do not read ahead (some 80 of them held
    250 MiB of a 512 MiB heap), and jobs are scheduled fairly (a table copied beside the
    stream shares the cores with its batches), unless [spark.conf] says otherwise; [spark]
    driver_host is a default too."""
    from pgcdc.lake.run.pipeline import (
        CACHE_BATCH_ROWS_KEY,
        SCHEDULER_MODE_KEY,
        SPILL_READ_AHEAD_KEY,
        STREAM_RESET_KEY,
        session_conf,
    )

    path = tmp_path / "pipeline.toml"
    path.write_text(GOOD)
    conf = session_conf(load_config(path))
    assert conf[CACHE_BATCH_ROWS_KEY] == "1000"
    assert conf[STREAM_RESET_KEY] == "1"
    assert conf[SPILL_READ_AHEAD_KEY] == "false"
    assert conf[SCHEDULER_MODE_KEY] == "FAIR"
    assert conf["spark.executor.memory"] == "2g"
    assert "spark.driver.host" not in conf
    path.write_text(
        GOOD.replace(
            "[spark.conf]\n",
            f'driver_host = "10.0.0.2"\n[spark.conf]\n"{CACHE_BATCH_ROWS_KEY}" = 5000\n'
            f'"{STREAM_RESET_KEY}" = 100\n',
        )
    )
    conf = session_conf(load_config(path))
    assert conf[CACHE_BATCH_ROWS_KEY] == "5000"
    assert conf[STREAM_RESET_KEY] == "100"
    assert conf["spark.driver.host"] == "10.0.0.2"


def test_maintenance_settings() -> None:
    """[lake]'s maintenance keys default to ``Maintenance``'s defaults and reach it as set."""
    from pgcdc.lake.write.maintenance import Maintenance

    assert parse_config(BASE).lake.maintenance() == Maintenance()
    lake = {
        "path": "/tmp/lake",
        "checkpoint_commits": 10,
        "compact_files": 0,
        "target_file_size": "32MB",
        "vacuum": False,
        "vacuum_retention_hours": 2,
        "vacuum_interval": 60,
    }
    assert parse_config({**BASE, "lake": lake}).lake.maintenance() == Maintenance(
        checkpoint_commits=10,
        compact_files=0,
        target_file_size=32 << 20,
        vacuum=False,
        vacuum_retention_hours=2,
        vacuum_interval=60.0,
    )
    # past half the tables' own fallback interval, Delta would checkpoint in the committing
    # thread before maintenance: refused, naming the key and the bound
    with pytest.raises(ConfigError) as raised:
        parse_config({**BASE, "lake": {**lake, "checkpoint_commits": 501}})
    assert "checkpoint_commits" in str(raised.value) and "500" in str(raised.value)
    assert parse_config({**BASE, "lake": {**lake, "checkpoint_commits": 500}})


@pytest.mark.parametrize("where", ["the file", "under the file"])
@pytest.mark.parametrize("command", ["run", "status", "drop"])
def test_lake_path_at_a_file_names_the_key_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, where: str
) -> None:
    """A lake.path that is (or lies under) a file fails as a configuration error, exit 2, in
    every command that reads the lake, before any connection is tried."""
    from pgcdc.cli import main

    (tmp_path / "lake").write_text("not a folder\n")
    path = "lake" if where == "the file" else "lake/inner"
    config = tmp_path / "pipeline.toml"
    config.write_text(GOOD.replace('path = "lake"', f'path = "{path}"'))
    extra = {"run": ["--check"], "status": [], "drop": ["--yes"]}[command]
    code = main([command, "--config", str(config), *extra])
    out = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert code == 2, out
    assert "lake.path:" in out and f"{tmp_path / 'lake'}" in out, out
    assert "is a file, not a folder" in out, out
    assert "point lake.path at a folder" in out, out
    assert "state.json" not in out and "Not a directory" not in out, out


def test_spark_connect_is_refused_for_a_pipeline() -> None:
    found = problems({**BASE, "spark": {"master": "sc://localhost:15002"}})
    assert "Spark Connect" in found["spark.master"] and "local[*]" in found["spark.master"]


def test_every_key_takes_its_toml_type_and_nothing_else() -> None:
    """Issue 41: `history = "yes"` was taken as true, "10" and 5.0 as whole numbers, a dotted
    key in [spark.conf] as a setting named "spark" holding a Python dict's text. Each key takes
    its TOML type only; the error names the key, the [[tables]] entry, what it got and the fix."""
    found = problems(
        {
            "source": {
                **BASE["source"],  # type: ignore[dict-item]
                "via_partition_root": 1,
                "connect_timeout": "10",
                "heartbeat": "msg",
                "retained_wal_warning": 1.5,
            },
            "lake": {"path": "/tmp/lake", "vacuum": "off", "compact_files": 5.0, "history": 0},
            "metrics": {"port": "9100", "addr": 127},
            "stream": {"max_changes_per_trigger": 5000.5},
            "spark": {"conf": {"spark.jars": ["a.jar"]}},
            "tables": [
                {"name": "shop.*"},
                {"name": "shop.orders", "history": "yes", "text_columns": "price"},
            ],
        }
    )
    assert found["tables[1].history"] == (
        'must be true or false, got the string "yes" ([[tables]] entry "shop.orders"): '
        "write history = true or history = false, without quotes"
    )
    assert "got the number 1:" in found["source.via_partition_root"]
    assert "got the number 0:" in found["lake.history"]
    assert 'got the string "off"' in found["lake.vacuum"]
    assert "must be a number" in found["source.connect_timeout"]
    assert "write connect_timeout = 10, without quotes" in found["source.connect_timeout"]
    assert found["source.heartbeat"] == (
        'must be "message" or "table", got the string "msg": write heartbeat = "message"'
    )
    assert 'a size such as "512MB", got the number 1.5' in found["source.retained_wal_warning"]
    assert "must be a whole number, got the number 5.0" in found["lake.compact_files"]
    assert "write port = 9100, without quotes" in found["metrics.port"]
    assert 'put it in quotes: addr = "127"' in found["metrics.addr"]
    assert "max_changes_per_trigger = 5000" in found["stream.max_changes_per_trigger"]
    assert "spark.jars: a Spark setting is a string" in found["spark.conf"]
    assert 'must be a list, got the string "price"' in found["tables[1].text_columns"]
    assert (
        "must be a list, got a table: start each entry with [[tables]]"
        in problems({**BASE, "tables": {"name": "x"}})["tables"]
    )
    # what the documentation promises stays: sizes as strings, seconds as whole numbers
    config = parse_config(
        {
            **BASE,
            "source": {**BASE["source"], "retained_wal_warning": "5GB", "connect_timeout": 3},  # type: ignore[dict-item]
            "spark": {"conf": {"spark": {"sql": {"shuffle": {"partitions": 4}}}, "x.y": True}},
        }
    )
    assert config.source.retained_wal_warning == 5 << 30
    assert config.source.connect_timeout == 3.0
    assert config.spark.conf == {"spark.sql.shuffle.partitions": "4", "x.y": "true"}


def test_a_wrong_type_is_printed_by_the_cli_as_one_line_per_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgcdc.cli import main

    config = tmp_path / "pipeline.toml"
    config.write_text(GOOD.replace("changelog = true", 'changelog = "yes"'))
    code = main(["run", "--config", str(config), "--check"])
    err = capsys.readouterr().err
    assert code == 2, err
    # the console wraps long lines wherever they reach its width, a path's middle included
    text = "".join(err.split())
    for said in (
        f"invalid pipeline configuration in {config}:",
        'tables[1].changelog: must be true or false, got the string "yes"',
    ):
        assert "".join(said.split()) in text, err
    assert "Traceback" not in err and "pydantic" not in err and "validation error" not in err


def test_lake_write_is_indexed_or_merge() -> None:
    """``[lake] write`` chooses the batch's write; anything else names the choices."""
    assert parse_config(BASE).lake.write == "indexed"
    merge = parse_config({**BASE, "lake": {"path": "/tmp/lake", "write": "merge"}})
    assert merge.lake.write == "merge"
    found = problems({**BASE, "lake": {"path": "/tmp/lake", "write": "upsert"}})
    assert 'must be "indexed" or "merge"' in found["lake.write"]
