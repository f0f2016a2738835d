"""The context suite's summary: what the property tests exercised (examples per feature)."""

from __future__ import annotations

import pytest

from tests.context.strategies import EXAMPLES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not EXAMPLES:
        return
    terminalreporter.section("context properties: examples run")
    for name, count in sorted(EXAMPLES.items()):
        terminalreporter.write_line(f"property {name}: {count}")
