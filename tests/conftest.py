"""Shared test configuration: anyio backends, hypothesis profiles, the deep tier switch.

Our own async tests use anyio's pytest plugin (``@pytest.mark.anyio``); amplifier-core's
inherited suites use pytest-asyncio in strict mode. Both plugins coexist.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep",
    max_examples=2000,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-deep", action="store_true", default=False, help="run the deep (slow) tier"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-deep"):
        return
    # Deselected rather than skipped, so `-rs` shows only skips that mean something.
    deep = [item for item in items if "deep" in item.keywords]
    if deep:
        config.hook.pytest_deselected(items=deep)
        items[:] = [item for item in items if "deep" not in item.keywords]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Our async tests run on both anyio backends (Amplifier itself runs asyncio)."""
    return str(request.param)
