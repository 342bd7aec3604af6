"""`make bench` / ``python -m tools.bench``: every benchmark, then the report.

Runs decode, catch-up, snapshot, memory, latency, scale, wide and lifecycle one after another
(each in its own process, with its own throwaway servers and Spark), then
``tools.bench.report``. A benchmark
that fails is reported and the others still run; the exit code is 0 either way (benchmarks
never fail CI). ``--only`` picks some; ``--scale`` (or ``BENCH_SCALE``) is passed to all but
decode, whose recorded stream has a fixed size; ``--scale-for name=factor`` overrides the scale
of one benchmark (a full run of what fits, a smaller scale for the rest).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from tools.bench.harness import ROOT, add_common_arguments

ORDER = ("decode", "catchup", "snapshot", "memory", "latency", "scale", "wide", "lifecycle")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__)
    add_common_arguments(parser)
    parser.add_argument("--only", nargs="*", choices=ORDER, default=list(ORDER))
    parser.add_argument(
        "--scale-for",
        action="append",
        default=[],
        metavar="NAME=FACTOR",
        help="the scale of one benchmark, e.g. catchup=0.25 (repeatable)",
    )
    args = parser.parse_args(argv)
    scales = {name: args.scale for name in ORDER}
    for item in args.scale_for:
        name, _, factor = item.partition("=")
        if name not in scales:
            parser.error(f"--scale-for {item!r}: unknown benchmark {name!r}")
        scales[name] = float(factor)
    failed = []
    for name in ORDER:
        if name not in args.only:
            continue
        command = [sys.executable, "-m", f"tools.bench.{name}"]
        if name != "decode":
            command += ["--scale", f"{scales[name]:g}"]
        print(f"\n=== {' '.join(command[1:])}", flush=True)
        started = time.perf_counter()
        code = subprocess.call(command, cwd=ROOT, env=dict(os.environ))
        print(f"=== {name}: exit {code} after {time.perf_counter() - started:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    subprocess.call([sys.executable, "-m", "tools.bench.report"], cwd=ROOT)
    if failed:
        print(f"benchmarks that failed (see above): {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
