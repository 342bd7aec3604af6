"""Spark's Python worker daemon in pgcdc's sessions (``spark.python.daemon.module``): pyspark's
own, except that a daemon started with SIGTERM ignored keeps ignoring it, and so do the workers
it forks.

``spark_session`` launches the driver JVM with SIGTERM ignored (``pgcdc.spark.jvm``), and the
processes the JVM starts inherit that. pyspark's daemon would install its own handler (shut down
every worker at once) and restore the default in each worker: a stop signal sent to every
process of a service (systemd's ``KillMode=control-group``) would then fail the tasks of the
batch in progress, which pgcdc is finishing before it stops. Spark does not need the signal
here: it stops a daemon by closing the daemon's standard input too (the daemon then shuts down
its workers), and a single worker with SIGKILL. A daemon started with SIGTERM at its default
behaves exactly as pyspark's.
"""

from __future__ import annotations

import signal
from types import ModuleType
from typing import Any

from pyspark import daemon

__all__ = ["main"]


class _SigtermIgnored:
    """``pyspark.daemon``'s view of the ``signal`` module: handlers for SIGTERM are not
    installed (it stays ignored); everything else is the module's."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def signal(self, signum: int, handler: Any) -> Any:
        if signum == signal.SIGTERM:
            return signal.SIG_IGN
        return self._module.signal(signum, handler)


def main() -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        daemon.signal = _SigtermIgnored(signal)  # type: ignore[attr-defined,assignment]
    daemon.manager()


if __name__ == "__main__":
    main()
