"""Guard: the inherited conformance suites must really run (never skip silently)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_conformance_suites_ran() -> None:
    """Run the inherited suites in a subprocess; every test must pass, none may skip."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/test_conformance.py",
            "-q",
            "-rs",
            "-p",
            "no:randomly",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "skipped" not in output, output
    assert " passed" in output, output
    passed = int(output.split(" passed")[0].split()[-1])
    assert passed >= 11, output


def test_cli_validator_passes() -> None:
    """`amplifier-core validate context <package dir>` accepts the package."""
    cli = Path(sys.executable).parent / "amplifier-core"
    result = subprocess.run(
        [str(cli), "validate", "context", str(ROOT / "amplifier_module_context_simple")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASSED" in result.stdout, result.stdout
