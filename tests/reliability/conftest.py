"""The reliability suite's diagnostics: await points per sweep and examples per property
(printed with ``--diagnostics``, see ``tests/conftest.py``)."""

from __future__ import annotations

from typing import Any

from tests.reliability.harness import EXAMPLES, RECORDS


def pytest_diagnostics() -> dict[str, Any] | None:
    if not RECORDS and not EXAMPLES:
        return None
    return {
        "title": "reliability: await points enumerated and examples run",
        "lines": list(RECORDS),
        "counts": dict(EXAMPLES),
        "count_suffix": " examples",
    }
