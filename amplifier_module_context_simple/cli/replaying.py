"""Replaying a transcript through the module: ``replay`` admits the messages in order into
a fresh ``SimpleContextManager`` and makes a request right before each assistant message
and once at the end, against a ``WindowProvider`` stub, recording the module's events
(``EventLog``); ``tallied_warnings`` collects the module's log warnings meanwhile."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..context.config import ContextConfig
from ..context.counting.estimate import estimate_message
from ..context.history.ingress import cap_tool_result
from ..context.store import BUDGET_EVENT, COMPACTION_EVENT
from ..manager import SimpleContextManager
from ..testing.thinking_oracle import PrefixLedger
from .bill import DEFAULT_PRICES, Measure, Prices, keyed_view
from .runs import RequestRecord, Run, new_record
from .transcript import Transcript

__all__ = (
    "EventLog",
    "ProviderInfo",
    "WarningTally",
    "WindowProvider",
    "replay",
    "tallied_warnings",
)

PACKAGE_LOGGER = __name__.split(".")[0]
"""The package's logger (the module logs under it), whose warnings a replay tallies."""


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    """What ``get_info()`` returns: only ``defaults`` is read by the module."""

    defaults: dict[str, int]


@dataclass(frozen=True, slots=True)
class WindowProvider:
    """A provider stub that publishes a context window and a max output."""

    context_window: int
    max_output_tokens: int

    def get_info(self) -> ProviderInfo:
        return ProviderInfo(
            {"context_window": self.context_window, "max_output_tokens": self.max_output_tokens}
        )


@dataclass(slots=True)
class EventLog:
    """A hooks object: records every event the module emits, in order."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def emit(self, event: str, data: dict[str, Any]) -> None:  # noqa: ASYNC910 - records only
        self.events.append((event, dict(data)))


async def replay(
    transcript: Transcript,
    config: ContextConfig,
    provider: WindowProvider | None,
    *,
    name: str,
    overrides: dict[str, Any],
    prices: Prices = DEFAULT_PRICES,
    measure: Measure = estimate_message,
) -> Run:
    """Replay ``transcript`` through a fresh manager configured with ``config``.

    A request is made right before each assistant message is admitted and once at the
    end. The manager's events are recorded through an ``EventLog`` hooks object. Each
    view goes through the simulated prompt cache (``cache_use``). ``measure`` counts the
    records' tokens (views and history); the module's own decisions use its estimator.
    """
    log = EventLog()
    manager = SimpleContextManager(**dataclasses.asdict(config), hooks=log)
    records: list[RequestRecord] = []
    admitted = history_tokens = 0
    previous: list[tuple[str, int]] | None = None

    ledger = PrefixLedger()

    async def request() -> list[dict[str, Any]]:
        nonlocal previous
        seen = len(log.events)
        view = await manager.get_messages_for_request(provider=provider)
        compaction = next((d for e, d in log.events[seen:] if e == COMPACTION_EVENT), None)
        keyed = keyed_view(view, measure)
        verdict = ledger.check(view)
        records.append(
            new_record(
                len(records) + 1, admitted, history_tokens, keyed, compaction, previous, verdict
            )
        )
        previous = keyed
        return view

    for _, message in transcript.messages:
        if message.get("role") == "assistant":
            # the answer to the view just built (its thinking is bound to that view)
            ledger.answered(await request(), message)
        await manager.add_message(message)
        admitted += 1
        # As admitted: the same ingress cap add_message applies (metadata, where the
        # module keeps its bookkeeping, is not estimated).
        capped, _ = cap_tool_result(message, config.max_tool_result_bytes)
        history_tokens += measure(capped)
    await request()
    budgets = [d for e, d in log.events if e == BUDGET_EVENT]
    return Run(name, overrides, config, budgets[-1], records, prices, measure=measure)


class WarningTally(logging.Handler):
    """Collects the module's log warnings: message template -> (count, first message)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.tally: dict[str, tuple[int, str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        count, first = self.tally.get(str(record.msg), (0, record.getMessage()))
        self.tally[str(record.msg)] = (count + 1, first)


@contextlib.contextmanager
def tallied_warnings() -> Iterator[WarningTally]:
    """Route the package's log records to a ``WarningTally`` instead of stderr, so a
    warning repeated on every request (e.g. the protected floor) is reported once."""
    logger = logging.getLogger(PACKAGE_LOGGER)
    handler, propagate = WarningTally(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
