"""``pgcdc run`` without the rest of the command line: the same handler (``pgcdc.cli.run``),
with the CLI's logging. The benchmarks fall back to it when ``python -m pgcdc`` cannot start
(another command of the CLI mid-edit), so a run measures the same code a user runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pgcdc.cli import run as run_command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.runner")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    _, handler = run_command.register(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
