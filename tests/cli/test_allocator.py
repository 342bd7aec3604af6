"""The ``pgcdc`` command configures delta-rs's allocator before deltalake is imported."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = "import os, pgcdc.cli, deltalake; print(os.environ.get('_RJEM_MALLOC_CONF'))"


def _probe(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_freed_pages_are_returned_at_once() -> None:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    assert _probe(env) == "dirty_decay_ms:0,muzzy_decay_ms:0"


def test_the_users_setting_wins() -> None:
    env = dict(os.environ, _RJEM_MALLOC_CONF="narenas:2")
    assert _probe(env) == "narenas:2"
