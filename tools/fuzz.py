"""Coverage-guided fuzzing (atheris, libFuzzer) of everything that reads pgoutput bytes.

Each input is a protocol version and a stream of messages: byte 0 picks the protocol version
(1 to 4), then each message is a 2-byte big-endian length and that many bytes. A target feeds
the stream to one layer and lets through only that layer's own errors; anything else (an
``IndexError``, ``struct.error``, ``UnicodeDecodeError``, a hang, ...) is a finding, which
libFuzzer reports with the input that caused it (``crash-<sha1>`` in the working directory).

Targets: ``decoder`` (the row ``Decoder``, state kept across the stream), ``columnar`` (the
``ColumnarDecoder`` on the whole stream), ``framer`` (the Spark source's ``Framer``),
``assembler`` (the decoding ``Assembler``: transactions, streaming, two-phase, spilling).

The seed corpus is made of well-formed streams of every message type (``--seeds DIR`` writes
it; the fuzzer starts from it when given the folder). Run::

    .venv/bin/python -m tools.fuzz decoder -runs=200000 -seed=1
    .venv/bin/python -m tools.fuzz assembler -max_total_time=600 corpus/

(``make fuzz`` runs every target for ``FUZZ_SECONDS`` each). Needs atheris, which installs
from binary wheels on Linux x86-64 (a dev dependency there).
"""

from __future__ import annotations

import sys
from pathlib import Path

#: the targets (``tools.fuzz_targets.TARGETS``), named here without importing pgcdc
TARGET_NAMES = ("decoder", "columnar", "framer", "assembler")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--seeds":
        from tools.fuzz_targets import write_seeds

        print(f"{write_seeds(Path(argv[1]))} seed inputs written to {argv[1]}")
        return 0
    if not argv or argv[0] not in TARGET_NAMES:
        print(
            f"usage: python -m tools.fuzz {{{','.join(TARGET_NAMES)}}} [libFuzzer options] [corpus]"
        )
        print("       python -m tools.fuzz --seeds DIR")
        return 2
    import atheris

    # coverage instrumentation of pgcdc's modules only (all of pyspark would take a minute)
    with atheris.instrument_imports(include=["pgcdc", "tools.fuzz_targets"]):
        from tools.fuzz_targets import TARGETS

    atheris.Setup([sys.argv[0], *argv[1:]], TARGETS[argv[0]])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
