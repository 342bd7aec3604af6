"""Plugin validation: the required / optional callback rules of PostgreSQL's output plugins."""

from __future__ import annotations

import re

import pytest

from pgcdc.decoding import Assembler, OutputPlugin, PluginError, capabilities
from pgcdc.decoding.plugin import CALLBACKS
from tests.decoding.wire import (
    FullRecorder,
    Recorder,
    StreamRecorder,
    StreamTwoPhaseRecorder,
    TwoPhaseRecorder,
)


def _noop(self: object, *args: object) -> None:
    return None


def _plugin(*callbacks: str, base: type = OutputPlugin) -> object:
    cls = type("Custom", (base,), {name: _noop for name in callbacks})
    return cls()


BASIC = ("begin", "change", "commit")
STREAM = ("stream_start", "stream_stop", "stream_abort", "stream_commit", "stream_change")
TWO_PHASE = ("begin_prepare", "prepare", "commit_prepared", "rollback_prepared")


def test_required_callbacks() -> None:
    with pytest.raises(
        PluginError,
        match=re.escape(
            "output plugin Custom is missing callbacks: change, commit (required of every "
            "output plugin). Implement them"
        ),
    ):
        capabilities(_plugin("begin"))
    with pytest.raises(PluginError, match="missing callbacks: begin, change, commit"):
        Assembler(OutputPlugin())


def test_streaming_family_all_or_nothing() -> None:
    with pytest.raises(
        PluginError,
        match=re.escape(
            "stream_stop, stream_abort, stream_commit (required because it implements "
            "streaming callbacks: stream_change, stream_start)"
        ),
    ):
        capabilities(_plugin(*BASIC, "stream_start", "stream_change"))
    # stream_message and stream_truncate alone also mean "a streaming plugin"
    with pytest.raises(PluginError, match="stream_start, stream_stop, stream_abort"):
        capabilities(_plugin(*BASIC, "stream_truncate"))
    caps = capabilities(_plugin(*BASIC, *STREAM))
    assert caps.streaming and not caps.two_phase


def test_two_phase_family_all_or_nothing() -> None:
    with pytest.raises(
        PluginError,
        match=re.escape(
            "begin_prepare, commit_prepared, rollback_prepared (required because it "
            "implements two-phase callbacks: prepare)"
        ),
    ):
        capabilities(_plugin(*BASIC, "prepare"))
    with pytest.raises(PluginError, match="begin_prepare, prepare, commit_prepared"):
        capabilities(_plugin(*BASIC, "filter_prepare"))
    caps = capabilities(_plugin(*BASIC, *TWO_PHASE, "filter_prepare"))
    assert caps.two_phase and not caps.streaming and caps.has("filter_prepare")


def test_stream_prepare_needed_by_streaming_two_phase_plugins() -> None:
    with pytest.raises(
        PluginError, match=r"stream_prepare \(required of a plugin that streams and is two-phase"
    ):
        capabilities(_plugin(*BASIC, *STREAM, *TWO_PHASE))
    # stream_prepare is a streaming and a two-phase callback at once
    with pytest.raises(PluginError, match="begin_prepare, prepare, commit_prepared"):
        capabilities(_plugin(*BASIC, *STREAM, "stream_prepare"))
    caps = capabilities(_plugin(*BASIC, *STREAM, *TWO_PHASE, "stream_prepare"))
    assert caps.streaming and caps.two_phase


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(PluginError) as info:
        capabilities(_plugin("stream_start", "prepare"))
    text = str(info.value)
    assert "begin, change, commit (required of every" in text
    assert "stream_stop" in text and "rollback_prepared" in text


def test_optional_callbacks_and_recorders() -> None:
    assert capabilities(Recorder()).implemented == {"begin", "change", "commit", "schema_change"}
    full = capabilities(FullRecorder())
    assert {"truncate", "message", "filter_by_origin"} <= full.implemented
    assert not full.streaming and not full.two_phase
    assert capabilities(StreamRecorder()).streaming
    assert capabilities(TwoPhaseRecorder()).two_phase
    both = capabilities(StreamTwoPhaseRecorder())
    assert both.streaming and both.two_phase


def test_plain_objects_and_instance_attributes() -> None:
    class Duck:
        def begin(self, *a: object) -> None: ...

        def change(self, *a: object) -> None: ...

    with pytest.raises(PluginError, match="Duck is missing callbacks: commit"):
        capabilities(Duck())
    duck = Duck()
    duck.commit = lambda *a: None  # type: ignore[attr-defined]
    assert capabilities(duck).implemented == {"begin", "change", "commit"}
    base = OutputPlugin()
    for name in BASIC:
        setattr(base, name, lambda *a: None)
    assert capabilities(base).implemented == set(BASIC)
    assert len(CALLBACKS) == 22


def test_auto_confirm_must_be_a_bool() -> None:
    plugin = _plugin(*BASIC)
    plugin.auto_confirm = "yes"  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match="auto_confirm must be True or False, not 'yes'"):
        capabilities(plugin)
    plugin.auto_confirm = False  # type: ignore[attr-defined]
    assert capabilities(plugin).auto_confirm is False
