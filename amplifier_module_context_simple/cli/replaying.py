"""Replaying a transcript through the module: ``replay`` admits the messages in order into
a fresh ``SimpleContextManager`` and makes a request right before each assistant message
and once at the end, against a ``WindowProvider`` stub, recording the module's events
(``EventLog``); ``tallied_warnings`` collects the module's log warnings meanwhile.
``request_times`` gives each request its time, for the cache's lifetime (``bill``)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..context.config import ContextConfig
from ..context.counting.estimate import estimate_message
from ..context.history.ingress import cap_tool_result
from ..context.store import BUDGET_EVENT, COMPACTION_EVENT
from ..manager import SimpleContextManager
from ..testing.thinking_oracle import PrefixLedger
from .bill import DEFAULT_PRICES, Measure, Prices, cache_use, expired_requests, keyed_view
from .runs import RequestRecord, Run, new_record
from .transcript import Transcript

__all__ = (
    "EventLog",
    "ProviderInfo",
    "ReplayedRequest",
    "WarningTally",
    "WindowProvider",
    "replay",
    "request_times",
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


@dataclass(frozen=True, slots=True)
class ReplayedRequest:
    """One request of a ``replay``, as its ``on_request`` callback sees it."""

    record: RequestRecord
    view: list[dict[str, Any]]
    """The view ``get_messages_for_request`` returned."""
    keyed: list[tuple[str, int]]
    """The view as ``(message_key, tokens)`` pairs, counted by the replay's measure."""
    seconds: float
    """The wall time of the ``get_messages_for_request`` call alone (``time.perf_counter``)."""


def request_times(transcript: Transcript, stamps: Sequence[datetime.datetime]) -> list[float]:
    """Each of ``replay``'s requests' time, in POSIX seconds: the timestamp of the message
    it is made before (an assistant message), and for the last request, made once every
    message is in, the last message's. ``stamps[i]`` is the time of the transcript's line
    (or array item) ``i + 1``; a naive timestamp is read as UTC.

    Raises:
        ValueError: a replayed line has no timestamp, or a request's time is earlier than
            the one before it.
    """

    def at(number: int) -> float:
        if number > len(stamps):
            raise ValueError(
                f"no timestamp for {transcript.unit} {number} ({len(stamps)} timestamps)"
            )
        stamp = stamps[number - 1]
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.UTC)
        return stamp.timestamp()

    numbers = [n for n, message in transcript.messages if message.get("role") == "assistant"]
    numbers += [transcript.messages[-1][0]] if transcript.messages else []
    times = [at(number) for number in numbers]
    for index in range(1, len(times)):
        if times[index] < times[index - 1]:
            raise ValueError(
                f"the timestamp of {transcript.unit} {numbers[index]} is earlier than that "
                f"of {transcript.unit} {numbers[index - 1]}"
            )
    return times


async def replay(
    transcript: Transcript,
    config: ContextConfig,
    provider: WindowProvider | None,
    *,
    name: str,
    overrides: dict[str, Any],
    prices: Prices = DEFAULT_PRICES,
    measure: Measure = estimate_message,
    times: Sequence[float] | None = None,
    on_request: Callable[[ReplayedRequest], object] | None = None,
) -> Run:
    """Replay ``transcript`` through a fresh manager configured with ``config``.

    A request is made right before each assistant message is admitted and once at the
    end. The manager's events are recorded through an ``EventLog`` hooks object. Each
    view goes through the simulated prompt cache (``cache_use``). ``measure`` counts the
    records' tokens (views and history); the module's own decisions use its estimator.
    ``times`` (``request_times``: one per request, in seconds) lets the cache expire
    after ``prices.lifetime``: a request made longer than that after the previous one
    finds it cold (``expired_requests``); without them nothing expires. The manager's
    clock (``clock=``) is the time of the request being made, so its idle-aware rule
    (``cache_lifetime``, ``idle_compact_at``) sees the transcript's gaps; without
    ``times`` the clock is constant and the module sees no gap. ``config.cache_lifetime``
    is taken as given (the CLI makes it ``--cache-ttl``'s: ``CacheLifetime.module_seconds``,
    unless ``--set`` gives it). ``on_request``
    is called after each request with what it returned and how long the call took.

    Raises:
        ValueError: ``times`` does not hold one time per request, or goes back in time.
    """
    requests = 1 + sum(message.get("role") == "assistant" for _, message in transcript.messages)
    if times is not None and len(times) != requests:
        raise ValueError(f"{len(times)} request times for {requests} requests")
    cold = expired_requests(times, prices.lifetime)
    log = EventLog()
    records: list[RequestRecord] = []

    def clock() -> float:
        """The module's clock: the time of the request being made (the manager reads it
        when it plans one), or a constant without ``times`` (no idle gap, ever)."""
        if times is None:
            return 0.0
        return times[min(len(records), len(times) - 1)]

    manager = SimpleContextManager(**dataclasses.asdict(config), hooks=log, clock=clock)
    admitted = history_tokens = 0
    previous: list[tuple[str, int]] | None = None

    ledger = PrefixLedger()

    async def request() -> list[dict[str, Any]]:
        nonlocal previous
        seen = len(log.events)
        started = time.perf_counter()
        view = await manager.get_messages_for_request(provider=provider)
        seconds = time.perf_counter() - started
        compaction = next((d for e, d in log.events[seen:] if e == COMPACTION_EVENT), None)
        keyed = keyed_view(view, measure)
        verdict = ledger.check(view)
        record = new_record(
            len(records) + 1, admitted, history_tokens, keyed, compaction, previous, verdict
        )
        if cold and cold[len(records)]:
            record = dataclasses.replace(record, cache=cache_use(previous, keyed, expired=True))
        records.append(record)
        if on_request is not None:
            on_request(ReplayedRequest(record, view, keyed, seconds))
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
