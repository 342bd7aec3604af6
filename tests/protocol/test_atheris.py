"""Coverage-guided fuzzing with atheris (``tools/fuzz.py``), shortened for the suite.

Each target (row decoder, columnar decoder, the Spark source's framer, the decoding assembler)
runs a fixed number of libFuzzer iterations with a fixed seed from the seed corpus of every
message type; a finding (any exception other than the layer's own errors) makes the fuzzer
exit non-zero with the input it found. ``make fuzz`` runs the targets for longer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tools.fuzz import TARGET_NAMES
from tools.fuzz_targets import TARGETS, write_seeds

ROOT = Path(__file__).resolve().parents[2]
RUNS = 5000


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_fuzz_target(target: str, tmp_path: Path) -> None:
    assert set(TARGETS) == set(TARGET_NAMES)
    corpus = tmp_path / "corpus"
    assert write_seeds(corpus) >= 10
    result = subprocess.run(
        [sys.executable, "-m", "tools.fuzz", target, f"-runs={RUNS}", "-seed=1", str(corpus)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f"Done {RUNS} runs" in output
    assert "no interesting inputs" not in output  # the code under test is instrumented
    assert not list(tmp_path.glob("crash-*"))
