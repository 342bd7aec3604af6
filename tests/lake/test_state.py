"""The pipeline's state file: a lake an earlier pgcdc wrote with delta-rs is refused, with the
fix, rather than written by a second Delta implementation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgcdc.lake.state import STATE_FORMAT, PipelineState, StateError, load_state, save_state
from pgcdc.lake.tables import LakeLayout


def test_a_state_round_trips(tmp_path: Path) -> None:
    layout = LakeLayout(tmp_path / "lake")
    state = PipelineState.new(
        system_identifier="1", database="db", slot="s", publication="p", tables=("public.t",)
    )
    save_state(layout, state)
    assert load_state(layout) == state
    assert json.loads(layout.state_file.read_text())["format"] == STATE_FORMAT == 2


def test_a_lake_of_the_delta_rs_writer_is_refused_with_the_fix(tmp_path: Path) -> None:
    layout = LakeLayout(tmp_path / "lake")
    state = PipelineState.new(
        system_identifier="1", database="db", slot="s", publication="p", tables=("public.t",)
    )
    save_state(layout, state)
    data = json.loads(layout.state_file.read_text())
    data["format"] = 1
    layout.state_file.write_text(json.dumps(data))
    with pytest.raises(StateError, match=r"earlier pgcdc .*Move the lake away"):
        load_state(layout)
