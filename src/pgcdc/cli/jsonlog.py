"""Log records as JSON lines (``pgcdc --log-format json``), for log shippers and scripts.

Each record is one JSON object on one line: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
``message``, then every ``extra`` field the call passed (``lsn``, ``slot``, ``table``,
``changes``, ``batch``, ...), and ``exception`` (the formatted traceback) if there is one.
Every string goes through ``scrub_secrets``, so a connection string's password never appears
even if one slipped into a message; pgcdc never logs row values.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from pgcdc.replication import scrub_secrets

__all__ = ["STANDARD_ATTRIBUTES", "JsonFormatter"]

#: Attributes every LogRecord has: anything else on a record came from ``extra``.
STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return scrub_secrets(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    return scrub_secrets(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": scrub_secrets(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in STANDARD_ATTRIBUTES and key not in out and not key.startswith("_"):
                out[key] = _clean(value)
        if record.exc_info:
            out["exception"] = scrub_secrets(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exception"] = scrub_secrets(record.exc_text)
        return json.dumps(out, ensure_ascii=False, default=str)
