"""``make chaos``: the chaos tests at full size.

Runs tests/chaos with ``PGCDC_CHAOS_KILLS`` kills of ``pgcdc run`` (default 20, or
``CHAOS_KILLS``) on PostgreSQL 15 and 18 (``PGCDC_CHAOS_VERSIONS``), the indexed write killed
at each of its points (``PGCDC_CHAOS_KILL_POINTS``, default all), then the other chaos tests
(network faults, errors, roles). The seed is printed; replay a run with
``PGCDC_CHAOS_SEED=<seed> make chaos``. The suite (``make test``) runs the same tests with 3
kills on PostgreSQL 18, and three of the indexed write's five kill points.

Run: .venv/bin/python -m tools.chaos [extra pytest arguments]
"""

from __future__ import annotations

import os
import random
import subprocess
import sys


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    env.setdefault("PGCDC_CHAOS_KILLS", env.get("CHAOS_KILLS", "20"))
    env.setdefault("PGCDC_CHAOS_VERSIONS", "15,18")
    env.setdefault("PGCDC_CHAOS_KILL_POINTS", "all")  # of the indexed write (test_kill_points)
    env.setdefault("PGCDC_CHAOS_SEED", str(random.SystemRandom().randrange(1 << 31)))
    print(
        f"chaos: {env['PGCDC_CHAOS_KILLS']} kills per version "
        f"({env['PGCDC_CHAOS_VERSIONS']}), seed {env['PGCDC_CHAOS_SEED']} "
        f"(replay: PGCDC_CHAOS_SEED={env['PGCDC_CHAOS_SEED']} make chaos)",
        flush=True,
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/chaos",
        "-s",
        "-o",
        "timeout=7200",
        *argv,
    ]
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
