"""Idle-aware compaction, on a real ``SimpleContextManager`` with a fake clock.

After a gap longer than ``cache_lifetime`` since the previous view was returned, the
provider's prompt cache is gone and the request writes its whole view anyway; so a view at
or above ``idle_compact_at`` x the trigger compacts now (``Limits.reached_idle``,
``RequestPolicy.compaction_due``) instead of a few requests later, on a warm cache. The
meter stats say whether the request followed such a gap (``cache_expired``).

Each test makes two requests on the same history: the first at time 0 (it returns the
view, whose estimate is the one the second request compares), the second after the gap.
The budget is chosen from that estimate (``budget_at``) so that the view sits where the
test needs it, relative to the idle trigger.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.config import ContextConfig
from amplifier_module_context_simple.context.policy.plan import Limits
from amplifier_module_context_simple.context.store import COMPACTION_EVENT
from amplifier_module_context_simple.testing import RecordingHooks
from tests.context.strategies import calls, results
from tests.context.test_sticky import LOG, human

LIFETIME = 300.0
"""The default ``cache_lifetime``: 5 minutes."""
LONG_GAP = LIFETIME + 1.0
SHORT_GAP = LIFETIME - 1.0


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)


class FakeClock:
    """A settable clock: returns ``now`` (seconds)."""

    def __init__(self, now: Any = 0.0) -> None:
        self.now: Any = now

    def __call__(self) -> Any:
        return self.now


def history(turns: int = 8) -> list[dict[str, Any]]:
    """A prompt, then tool rounds with sizeable results (reducible by the ladder)."""
    messages: list[dict[str, Any]] = [human("build the project and report the errors")]
    for index in range(turns):
        messages.append(calls("openai", [f"t{index}"]))
        messages += results("openai", {f"t{index}": LOG * 40})
    return messages


def idle_fraction(config: ContextConfig) -> float:
    """The idle trigger, as a fraction of the policy budget."""
    return config.compact_threshold * config.idle_compact_at


def budget_at(estimated: int, fraction: float, config: ContextConfig) -> int:
    """The largest budget B whose policy budget ``estimated`` tokens fill to at least
    ``fraction`` (B + 1 leaves them just under it)."""
    budget = max(1, math.floor(estimated / fraction))
    while estimated / Limits.of(budget + 1, config).policy_budget >= fraction:
        budget += 1
    while estimated / Limits.of(budget, config).policy_budget < fraction:
        budget -= 1
    return budget


async def estimate(messages: list[dict[str, Any]]) -> int:
    """The module's estimate of the view of ``messages`` with room to spare (no compaction)."""
    probe = SimpleContextManager(clock=FakeClock())
    await probe.set_messages(messages)
    await probe.get_messages_for_request(token_budget=10_000_000)
    stats = probe.last_token_meter_stats
    assert stats is not None
    tokens: int = stats["estimated_tokens"]
    return tokens


class Session:
    """A manager on ``history()`` with a fake clock, requesting with a budget that puts
    its view at the idle trigger (``budget_at``; with ``below``, one token of budget more:
    just under it), well under the trigger."""

    def __init__(self, budget: int, clock: FakeClock, hooks: RecordingHooks, **config: Any):
        self.budget = budget
        self.clock = clock
        self.hooks = hooks
        self.manager = SimpleContextManager(hooks=hooks, clock=clock, **config)

    @classmethod
    async def made(
        cls, *, below: bool = False, clock: FakeClock | None = None, **config: Any
    ) -> Session:
        messages = history()
        settings = ContextConfig(**config)
        budget = budget_at(await estimate(messages), idle_fraction(settings), settings)
        session = cls(budget + below, clock or FakeClock(), RecordingHooks(), **config)
        await session.manager.set_messages(messages)
        return session

    async def request(self, at: float | None = None) -> list[dict[str, Any]]:
        if at is not None:
            self.clock.now = at
        return await self.manager.get_messages_for_request(token_budget=self.budget)

    def compactions(self) -> int:
        return sum(event == COMPACTION_EVENT for event, _ in self.hooks.events)

    def expired(self) -> bool:
        stats = self.manager.last_token_meter_stats
        assert stats is not None
        expired: bool = stats["cache_expired"]
        return expired


async def after_gap(gap: float, *, below: bool = False, **config: Any) -> Session:
    """A session's first request at 0 and its second ``gap`` seconds later."""
    session = await Session.made(below=below, **config)
    await session.request(at=0.0)
    await session.request(at=gap)
    return session


# -- the rule ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_first_request_at_the_idle_trigger_does_not_compact() -> None:
    """The premise of the tests below: the view is over the idle trigger and under the
    trigger, so a warm first request leaves it alone."""
    session = await Session.made()
    await session.request(at=0.0)
    assert session.compactions() == 0


@pytest.mark.anyio
async def test_after_a_long_gap_a_view_at_the_idle_trigger_compacts() -> None:
    session = await after_gap(LONG_GAP)
    assert session.compactions() == 1


@pytest.mark.anyio
async def test_after_a_long_gap_the_meter_stats_say_the_cache_expired() -> None:
    session = await after_gap(LONG_GAP)
    assert session.expired() is True


@pytest.mark.anyio
async def test_without_a_gap_the_same_view_does_not_compact() -> None:
    session = await after_gap(0.0)
    assert session.compactions() == 0


@pytest.mark.anyio
async def test_without_a_gap_the_meter_stats_say_the_cache_is_warm() -> None:
    session = await after_gap(0.0)
    assert session.expired() is False


@pytest.mark.anyio
async def test_a_gap_of_the_lifetime_exactly_does_not_compact() -> None:
    session = await after_gap(LIFETIME)
    assert session.compactions() == 0


@pytest.mark.anyio
async def test_a_gap_shorter_than_the_lifetime_does_not_compact() -> None:
    session = await after_gap(SHORT_GAP)
    assert session.compactions() == 0


@pytest.mark.anyio
async def test_below_the_idle_trigger_a_long_gap_does_not_compact() -> None:
    session = await after_gap(LONG_GAP, below=True)
    assert session.compactions() == 0


@pytest.mark.anyio
async def test_below_the_idle_trigger_the_cache_still_expired() -> None:
    session = await after_gap(LONG_GAP, below=True)
    assert session.expired() is True


@pytest.mark.anyio
async def test_a_zero_cache_lifetime_disables_the_rule() -> None:
    session = await after_gap(LONG_GAP, cache_lifetime=0)
    assert session.compactions() == 0


@pytest.mark.anyio
async def test_a_zero_cache_lifetime_never_reports_an_expired_cache() -> None:
    session = await after_gap(LONG_GAP, cache_lifetime=0)
    assert session.expired() is False


@pytest.mark.anyio
async def test_a_longer_cache_lifetime_outlives_the_gap() -> None:
    session = await after_gap(LONG_GAP, cache_lifetime=3600.0)
    assert session.compactions() == 0


@pytest.mark.anyio
async def test_the_first_request_of_a_session_is_never_idle() -> None:
    """However late the first request is made, nothing was cached before it."""
    session = await Session.made(clock=FakeClock(1e9))
    await session.request()
    assert session.compactions() == 0


@pytest.mark.anyio
async def test_the_first_request_of_a_session_reports_a_warm_cache() -> None:
    session = await Session.made(clock=FakeClock(1e9))
    await session.request()
    assert session.expired() is False


# -- what forgets the last time ----------------------------------------------------------------


@pytest.mark.anyio
async def test_set_messages_with_another_history_forgets_the_last_view() -> None:
    """A replaced history is a new session: its first request is not idle."""
    session = await Session.made()
    await session.request(at=0.0)
    await session.manager.set_messages(history())  # equal content: an extension
    await session.manager.set_messages([human("another task"), *history()[1:]])
    await session.request(at=LONG_GAP)
    assert session.expired() is False


@pytest.mark.anyio
async def test_set_messages_extending_the_history_keeps_the_last_view() -> None:
    session = await Session.made()
    await session.request(at=0.0)
    await session.manager.set_messages(history())  # the same list: nothing new, same session
    await session.request(at=LONG_GAP)
    assert session.compactions() == 1


@pytest.mark.anyio
async def test_clear_forgets_the_last_view() -> None:
    session = await Session.made()
    await session.request(at=0.0)
    await session.manager.clear()
    await session.manager.set_messages(history())
    await session.request(at=LONG_GAP)
    assert session.compactions() == 0


# -- the clock ------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("garbage", ["later", math.nan, math.inf, None, True])
async def test_a_clock_returning_garbage_raises_type_error_naming_the_clock(
    garbage: object,
) -> None:
    session = await Session.made()
    await session.request(at=0.0)
    session.clock.now = garbage
    with pytest.raises(TypeError, match="clock"):
        await session.request()


@pytest.mark.anyio
@pytest.mark.parametrize("garbage", ["later", math.nan])
async def test_a_clock_returning_garbage_leaves_the_store_unchanged(garbage: object) -> None:
    session = await Session.made()
    await session.request(at=0.0)
    before = session.manager.observable_state()
    session.clock.now = garbage
    with pytest.raises(TypeError):
        await session.request()
    assert session.manager.observable_state() == before


@pytest.mark.anyio
async def test_a_clock_returning_garbage_emits_nothing() -> None:
    session = await Session.made()
    await session.request(at=0.0)
    emitted = len(session.hooks.emitted)
    session.clock.now = "later"
    with pytest.raises(TypeError):
        await session.request()
    assert len(session.hooks.emitted) == emitted


@pytest.mark.parametrize("clock", [None, 0.0, "monotonic"])
def test_a_clock_that_is_not_callable_raises_type_error_at_construction(clock: object) -> None:
    with pytest.raises(TypeError, match="clock must be a callable"):
        SimpleContextManager(clock=clock)  # type: ignore[arg-type]
