"""Shared test configuration: anyio backends, hypothesis profiles, the deep tier switch,
and the diagnostics sections printed with ``--diagnostics``.

Our own async tests use anyio's pytest plugin (``@pytest.mark.anyio``); amplifier-core's
inherited suites use pytest-asyncio in strict mode. Both plugins coexist.

Diagnostics (await points per fault sweep, examples per property) are tallied by the
suites that run them and returned by their conftests' ``pytest_diagnostics`` hook. They are
printed at the end of the run only with ``--diagnostics`` (``make test DIAGNOSTICS=1``).
Under pytest-xdist each worker sends its tallies to the controller at the end of its
session (``workeroutput``), and the controller prints them merged: the same lines as a
serial run (each worker's lines in its order, counts summed).
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

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


class Section(TypedDict):
    """One diagnostics section: its title, its lines, and counts printed one a line as
    ``property {name}: {count}{count_suffix}``, summed over xdist workers."""

    title: str
    lines: list[str]
    counts: dict[str, int]
    count_suffix: str


class DiagnosticsSpec:
    """The hook a conftest implements to contribute a diagnostics section."""

    @staticmethod
    @pytest.hookspec
    def pytest_diagnostics() -> Section | None:
        """This process's tallies so far (``None`` when there is nothing to report)."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(DiagnosticsSpec)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-deep", action="store_true", default=False, help="run the deep (slow) tier"
    )
    parser.addoption(
        "--diagnostics",
        action="store_true",
        default=False,
        help="print the fault-sweep and property diagnostics at the end of the run",
    )


DIAGNOSTICS = pytest.StashKey[dict[str, Section]]()
"""The controller's (or a serial run's) sections, merged, by title."""


def _merge(config: pytest.Config, sections: list[Section]) -> None:
    merged = config.stash.setdefault(DIAGNOSTICS, {})
    for section in sections:
        into = merged.setdefault(
            section["title"],
            Section(
                title=section["title"],
                lines=[],
                counts={},
                count_suffix=section["count_suffix"],
            ),
        )
        into["lines"].extend(section["lines"])
        for name, count in section["counts"].items():
            into["counts"][name] = into["counts"].get(name, 0) + count


def _own_sections(config: pytest.Config) -> list[Section]:
    results: list[Section | None] = config.hook.pytest_diagnostics()
    return [section for section in results if section]


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if not config.getoption("--diagnostics"):
        return
    workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints
        workeroutput["diagnostics"] = _own_sections(config)
    else:  # a serial run (the controller's own hook returns nothing: it runs no test)
        _merge(config, _own_sections(config))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """(xdist, controller) a worker finished: merge the sections it sent."""
    sections: list[Section] = getattr(node, "workeroutput", {}).get("diagnostics", [])
    _merge(node.config, sections)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    if not config.getoption("--diagnostics"):
        return
    for section in config.stash.get(DIAGNOSTICS, {}).values():
        terminalreporter.section(section["title"])
        for line in section["lines"]:
            terminalreporter.write_line(line)
        for name, count in sorted(section["counts"].items()):
            terminalreporter.write_line(f"property {name}: {count}{section['count_suffix']}")


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
