"""``python -m amplifier_module_context_simple.cli``: the package's ``__main__`` runs the
console script's ``main`` (docs/replay.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from amplifier_module_context_simple.cli import main

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample-transcript.jsonl"
ARGV = ["replay", str(SAMPLE), "--window", "32000", "--max-output", "4000", "--json"]


def test_python_dash_m_prints_the_report_main_prints(capsys: pytest.CaptureFixture[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "amplifier_module_context_simple.cli", *ARGV],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert main(ARGV) == 0
    assert (result.returncode, json.loads(result.stdout)) == (
        0,
        json.loads(capsys.readouterr().out),
    )
