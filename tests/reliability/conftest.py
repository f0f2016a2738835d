"""The reliability suite's summary: await points per sweep and examples per property."""

from __future__ import annotations

import pytest

from tests.reliability.harness import EXAMPLES, RECORDS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RECORDS and not EXAMPLES:
        return
    terminalreporter.section("reliability: await points enumerated and examples run")
    for line in RECORDS:
        terminalreporter.write_line(line)
    for name, count in sorted(EXAMPLES.items()):
        terminalreporter.write_line(f"property {name}: {count} examples")
