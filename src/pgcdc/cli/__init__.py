"""The ``pgcdc`` command: one subcommand per module in this package.

Every subcommand exits 0 on success, 1 on a runtime error (with a message naming the cause and
the fix, never a password) and 2 on bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from pgcdc import __version__

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]


#: Subcommand modules, in the order `pgcdc --help` lists them; each has ``register(sub)``.
COMMANDS = ("tail", "run", "demo")


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(
        prog="pgcdc",
        description="Change data capture from PostgreSQL logical replication (pgoutput).",
    )
    parser.add_argument("--version", action="version", version=f"pgcdc {__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level for messages on stderr (default: WARNING)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    handlers: dict[str, Handler] = {}
    for command in COMMANDS:
        module = importlib.import_module(f"pgcdc.cli.{command}")
        name, handler = module.register(sub)
        handlers[name] = handler
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    parser, handlers = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`pgcdc tail | head`): stop quietly
        sys.stderr.close()
        return 0
