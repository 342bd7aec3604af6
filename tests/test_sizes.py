"""One rule for sizes (``pgcdc.sizes``): ``pipeline.toml``, the Spark source's options and
``pgcdc tail --memory-limit`` read the same forms to the same bytes."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from pgcdc.lake.config import Size, StreamSettings
from pgcdc.sizes import parse_size
from pgcdc.spark.errors import OptionError
from pgcdc.spark.options import parse_size as option_size

FORMS = {
    "1073741824": 1 << 30,
    "64m": 64 << 20,
    "64MB": 64 << 20,
    "64 MiB": 64 << 20,
    "1.5GB": 3 << 29,
    "2kb": 2048,
    "1t": 1 << 40,
    "512B": 512,
}


@pytest.mark.parametrize(("text", "expected"), FORMS.items())
def test_the_config_and_the_spark_options_read_a_size_alike(text: str, expected: int) -> None:
    assert parse_size(text) == expected
    assert TypeAdapter(Size).validate_python(text) == expected
    assert option_size("maxBytesPerTrigger", text) == expected


@pytest.mark.parametrize("text", ["lots", "5 parsecs", "-1MB", "", "1e6"])
def test_what_is_not_a_size_is_refused_by_both_with_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size: write bytes"):
        parse_size(text)
    with pytest.raises(OptionError, match=r"maxBytesPerTrigger=.* is not a size"):
        option_size("maxBytesPerTrigger", text)


def test_a_spark_option_size_is_positive() -> None:
    with pytest.raises(OptionError, match="positive"):
        option_size("maxBytesPerTrigger", "0")


def test_max_bytes_per_trigger_takes_a_size_in_the_config_as_the_option_does() -> None:
    """``[stream] max_bytes_per_trigger = "512MB"`` was refused (an int field) while the Spark
    option of the same name took it."""
    assert StreamSettings(max_bytes_per_trigger="512MB").max_bytes_per_trigger == 512 << 20  # type: ignore[arg-type]
    assert StreamSettings(max_bytes_per_trigger=1000).max_bytes_per_trigger == 1000
    with pytest.raises(ValueError, match="greater than 0"):
        StreamSettings(max_bytes_per_trigger=0)


def test_tail_memory_limit_takes_a_size_and_refuses_a_negative_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 41: ``--memory-limit`` took only a number of bytes, and a negative one was refused
    by the spill pool only after tail had connected to the server."""
    from pgcdc.cli import _parser, main

    tail = ["tail", "--dsn", "host=127.0.0.1 port=1", "--slot", "s", "--publication", "p"]
    for text, expected in FORMS.items():
        args = _parser()[0].parse_args([*tail, "--memory-limit", text])
        assert args.memory_limit == expected
    with pytest.raises(SystemExit) as exit_info:
        main([*tail, "--memory-limit", "-5"])
    assert exit_info.value.code == 2
    assert "'-5' is not a size: write bytes" in capsys.readouterr().err
