"""The thinking suite's fixtures: the module's log warnings silenced (compactions at small
budgets warn about the floor), and one anyio backend (the replays await nothing
concurrently; the store on both backends is the stateful model's and the sweeps' job)."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
