"""The ``pgcdc`` command: one subcommand per module in this package.

Every subcommand exits 0 on success, 1 on a runtime error (with a message naming the cause and
the fix, never a password) and 2 on bad usage.

Logs go to stderr at ``--log-level`` (default WARNING), as text or, with ``--log-format json``,
one JSON object per line (``pgcdc.cli.jsonlog``); commands that print progress then log it
instead, Python's warnings are logged (logger ``py.warnings``), and what the Spark driver's JVM
prints is logged too (``pgcdc.spark.console``), so every line the process writes is JSON.
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
COMMANDS = ("tail", "run", "status", "resync", "drop", "demo")

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Libraries whose logs stay at WARNING whatever ``--log-level`` says: py4j logs every command
#: it sends to Spark's JVM at DEBUG, options (a DSN's password) and literals (row values)
#: included, and its callback server's every call at INFO.
QUIET_LOGGERS = ("py4j",)


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
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object per line with fields such as lsn, slot, table, "
        "changes (default: text)",
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
    handler = logging.StreamHandler(sys.stderr)
    if args.log_format == "json":
        from pgcdc.cli.jsonlog import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    level = root.level
    # this command's handler replaces the root's stderr handlers (not others, e.g. pytest's)
    replaced = [
        h
        for h in root.handlers
        if type(h) is logging.StreamHandler and h.stream in (sys.stderr, sys.__stderr__)
    ]
    for old in replaced:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(args.log_level)
    if args.log_format == "json":
        logging.captureWarnings(True)  # a warning's text and source line are not JSON
    quiet = {logger: logger.level for logger in map(logging.getLogger, QUIET_LOGGERS)}
    for logger in quiet:
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`pgcdc tail | head`): stop quietly
        sys.stderr.close()
        return 0
    finally:
        if args.log_format == "json":
            logging.captureWarnings(False)
        root.removeHandler(handler)
        for old in replaced:
            root.addHandler(old)
        root.setLevel(level)
        for logger, previous in quiet.items():
            logger.setLevel(previous)
