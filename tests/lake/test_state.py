"""The pipeline's state file: a lake an earlier pgcdc wrote with delta-rs is refused, with the
fix, rather than written by a second Delta implementation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest

from pgcdc.lake.store.state import (
    STATE_FORMAT,
    PipelineState,
    StateError,
    TablePhase,
    TablePhaseName,
    load_state,
    save_state,
)
from pgcdc.lake.store.tables import LakeLayout
from pgcdc.metrics import TABLE_PHASES, PipelineMetrics


def test_a_state_round_trips(tmp_path: Path) -> None:
    layout = LakeLayout(tmp_path / "lake")
    state = PipelineState.new(
        system_identifier="1", database="db", slot="s", publication="p", tables=("public.t",)
    )
    save_state(layout, state)
    assert load_state(layout) == state
    assert json.loads(layout.state_file.local().read_text())["format"] == STATE_FORMAT == 5


def test_a_state_of_the_previous_format_loads_and_keeps_its_phases(tmp_path: Path) -> None:
    """Format 2 (before tables could join or leave a pipeline) reads as a state without
    phases, and is written as the current format (which an older pgcdc refuses by name); the
    phases of added and removed tables round-trip."""
    layout = LakeLayout(tmp_path / "lake")
    state = PipelineState.new(
        system_identifier="1", database="db", slot="s", publication="p", tables=("public.t",)
    )
    save_state(layout, state)
    data = json.loads(layout.state_file.local().read_text())
    del data["phases"]
    data["format"] = 2
    layout.state_file.local().write_text(json.dumps(data))
    old = load_state(layout)
    assert old is not None and old.phases == {} and old.format == STATE_FORMAT
    added = old.evolve(
        tables=("public.t", "public.u"),
        phases={
            "public.u": TablePhase(
                "streaming", "public", "u", attempt=2, copied_at="0/1A2B3C4", rows=7
            ),
            "x.y.z": TablePhase("removed", "x.y", "z"),
        },
    )
    save_state(layout, added)
    again = load_state(layout)
    assert again == added
    assert again.copied_at() == {"public.u": "0/1A2B3C4"}
    assert json.loads(layout.state_file.local().read_text())["format"] == 5


def test_every_table_has_one_phase_and_the_metrics_show_it() -> None:
    """A table of the initial copy is copying until the snapshot is done, then streaming; a
    table that joined, left or was parked has its recorded phase; ``pgcdc_table_state`` is 1
    for that phase only, ``pgcdc_table_parked`` 1 for a parked table."""
    state = PipelineState.new(
        system_identifier="1", database="db", slot="s", publication="p", tables=("public.t",)
    )
    assert state.table_phases() == {"public.t": "copying"}
    state = state.evolve(
        snapshot_done=True,
        tables=("public.t", "public.u"),
        phases={
            "public.u": TablePhase("streaming", "public", "u", copied_at="0/10"),
            "public.v": TablePhase("catching-up", "public", "v"),
            "public.w": TablePhase("parked", "public", "w", reason="why"),
            "public.x": TablePhase("removed", "public", "x"),
        },
    )
    phases = state.table_phases()
    assert phases == {
        "public.t": "streaming",
        "public.u": "streaming",
        "public.v": "catching-up",
        "public.w": "parked",
        "public.x": "removed",
    }
    # the metrics name the phases themselves (they sit below the lake): the same ones
    assert sorted(TABLE_PHASES) == sorted(get_args(TablePhaseName))
    metrics = PipelineMetrics("s")
    metrics.record_tables(phases)
    for table, phase in phases.items():
        for name in TABLE_PHASES:
            labels = {"slot": "s", "table": table, "state": name}
            shown = metrics.registry.get_sample_value("pgcdc_table_state", labels)
            assert shown == (1 if name == phase else 0), (table, name)
        parked = metrics.registry.get_sample_value(
            "pgcdc_table_parked", {"slot": "s", "table": table}
        )
        assert parked == (1 if phase == "parked" else 0), table


def test_a_lake_of_the_delta_rs_writer_is_refused_with_the_fix(tmp_path: Path) -> None:
    layout = LakeLayout(tmp_path / "lake")
    state = PipelineState.new(
        system_identifier="1", database="db", slot="s", publication="p", tables=("public.t",)
    )
    save_state(layout, state)
    data = json.loads(layout.state_file.local().read_text())
    data["format"] = 1
    layout.state_file.local().write_text(json.dumps(data))
    with pytest.raises(StateError, match=r"earlier pgcdc .*Move the lake away"):
        load_state(layout)


def test_torn_checkpoint_writes_are_removed(tmp_path: Path) -> None:
    """A kill -9 while Spark renamed the first offset file left ``offsets/.0.<uuid>.tmp``:
    Spark then refused the checkpoint on every start (it must be empty at batch 0). The
    temporary files go; the logs' own files stay."""
    from pgcdc.lake.store.state import remove_torn_writes
    from pgcdc.lake.store.storage import LakePath

    offsets = tmp_path / "offsets"
    commits = tmp_path / "commits"
    offsets.mkdir()
    commits.mkdir()
    (offsets / ".0.51c21851.tmp").write_text("v1")
    (offsets / "..0.51c21851.tmp.crc").write_text("x")
    (offsets / "1").write_text("v1")
    (offsets / ".1.crc").write_text("x")
    (commits / ".1.aa.tmp").write_text("v1")
    removed = remove_torn_writes(LakePath.parse(tmp_path))
    assert sorted(removed) == [
        "commits/.1.aa.tmp",
        "offsets/..0.51c21851.tmp.crc",
        "offsets/.0.51c21851.tmp",
    ]
    assert sorted(p.name for p in offsets.iterdir()) == [".1.crc", "1"]
    assert remove_torn_writes(LakePath.parse(tmp_path / "missing")) == []
