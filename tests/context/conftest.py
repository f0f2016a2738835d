"""The context suite's diagnostics: what the property tests exercised (examples per
feature; printed with ``--diagnostics``, see ``tests/conftest.py``)."""

from __future__ import annotations

from typing import Any

from tests.context.strategies import EXAMPLES


def pytest_diagnostics() -> dict[str, Any] | None:
    if not EXAMPLES:
        return None
    return {
        "title": "context properties: examples run",
        "lines": [],
        "counts": dict(EXAMPLES),
        "count_suffix": "",
    }
