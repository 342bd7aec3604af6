"""``python -m tools.bench.profile <file>...``: where a ``BENCH_PROFILE`` recording spent its
time. Reads py-spy's collapsed stacks (``--format raw``: ``frame;frame;... count`` per line) and
prints, per process, the functions with the most samples on top of the stack (self time) and
anywhere in it (total time), leaving out idle waits when ``--busy`` is given.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

_IDLE = re.compile(r"\b(wait|select|poll|epoll|sleep|accept|recv_into|readinto|acquire)\b")


def _short(process: str) -> str:
    """``process 123:"python -m pyspark.daemon pyspark.worker"`` -> ``pyspark.worker (123)``."""
    match = re.match(r'process (\d+):"(.*)"', process)
    if match is None:
        return process
    words = match.group(2).split() or ["?"]
    name = words[words.index("-m") + 1] if "-m" in words[:-1] else words[0]
    if name == "pyspark.daemon" and len(words) > 3:
        name = words[3]
    return f"{name} ({match.group(1)})"


def summarize(path: Path, top: int, busy: bool) -> str:
    own: dict[str, Counter[str]] = {}
    total: dict[str, Counter[str]] = {}
    samples: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        # with --subprocesses, the stack starts with the process and its ancestors
        first = max(i for i, f in enumerate(frames) if i == 0 or f.startswith("process "))
        process = _short(frames[first])
        frames = frames[first:]
        leaf = frames[-1]
        if busy and _IDLE.search(leaf):
            continue
        n = int(count)
        samples[process] += n
        own.setdefault(process, Counter())[leaf] += n
        seen = set()
        for frame in frames[1:]:
            if frame not in seen:
                total.setdefault(process, Counter())[frame] += n
                seen.add(frame)
    out = [f"== {path.name}"]
    for process, n in samples.most_common():
        out.append(f"\n{process}: {n} samples")
        out.append("  self:")
        out += [f"    {c:>7} {f}" for f, c in own[process].most_common(top)]
        out.append("  total:")
        out += [f"    {c:>7} {f}" for f, c in total[process].most_common(top)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.profile", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--busy", action="store_true", help="leave out idle waits")
    args = parser.parse_args(argv)
    for path in args.files:
        print(summarize(path, args.top, args.busy))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
