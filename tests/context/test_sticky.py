"""Sticky decisions and the storm guard (docs/design.md sections 3.4, 7.1 and 7.2).

Decisions are keyed by sequence id, reapplied on every later request, only ever grow, and
change only on a request that delivers ``context:compaction``; so a view's prefix is
byte-stable between compactions. When the protected floor is above the target, the
module says so once instead of re-running the deepest level on every request.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.history.classify import classify
from amplifier_module_context_simple.context.ladder.decisions import Decisions
from amplifier_module_context_simple.context.ladder.ladder import Ladder, LadderParams
from amplifier_module_context_simple.context.ladder.rows import Item, Rows
from amplifier_module_context_simple.context.slices import run_through
from amplifier_module_context_simple.testing import (
    RecordingHooks,
    check_view_invariants,
    snapshot,
    strip_notice,
)
from tests.context.strategies import FORMATS, calls, fill, results
from tests.support import mounted, replaced

PROSE = "The build failed because the linker could not find symbol parse_config. "
LOG = "log line: compiling module ok\n"


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def turn(index: int) -> list[dict[str, Any]]:
    """One conversational turn: a human prompt, a tool round (rotating formats, results of
    varying size) and an answer."""
    fmt = FORMATS[index % 3]
    ids = [f"c{index}_{k}" for k in range(1 + index % 2)]
    sizes = [300, 1500, 4000, 800]
    return [
        human(f"request {index}: " + PROSE * (1 + index % 4)),
        calls(fmt, ids, text=f"checking {index}"),
        *results(
            fmt, {i: f"{i} " + LOG * (sizes[(index + k) % 4] // 30) for k, i in enumerate(ids)}
        ),
        {"role": "assistant", "content": f"answer {index}: " + PROSE * 2},
    ]


class Session:
    """A manager with recording hooks and the messages admitted so far."""

    def __init__(self, **config: Any) -> None:
        self.hooks = RecordingHooks()
        self.manager = SimpleContextManager(hooks=self.hooks, **config)
        self.admitted: list[dict[str, Any]] = []

    async def add(self, *messages: dict[str, Any]) -> None:
        await checkpoint()  # even with no message
        for message in messages:
            self.admitted.append(message)
            await self.manager.add_message(copy.deepcopy(message))

    def compactions(self) -> int:
        return len(self.hooks.named("context:compaction"))

    async def request(self, **kwargs: Any) -> tuple[list[dict[str, Any]], bool]:
        """A checked view and whether this request delivered context:compaction."""
        before = self.compactions()
        view = await self.manager.get_messages_for_request(**kwargs)
        check_view_invariants(self.admitted, view, truncate_chars=self.manager.truncate_chars)
        return view, self.compactions() > before


def is_prefix(shorter: list[Any], longer: list[Any]) -> bool:
    return longer[: len(shorter)] == shorter


@pytest.mark.anyio
async def test_prefix_changes_only_on_compaction_over_30_cycles(anyio_backend: str) -> None:
    """66 (30 cycles): between requests the history grows; a view minus its notice starts
    with the previous view minus its notice unless this request emitted
    context:compaction; and the stats object changes exactly on those requests."""
    session = Session(max_tokens=6_000, protected_tool_results=2)
    await session.add({"role": "system", "content": "You are the build assistant."})
    previous: list[dict[str, Any]] = []
    stats = None
    compacted = stable = 0
    for index in range(30):
        await session.add(*turn(index))
        view, emitted = await session.request()
        body = strip_notice(view)
        new_stats = session.manager.last_compaction_stats
        assert (new_stats is not stats) == emitted
        if emitted:  # the event carries a copy of the committed stats (hooks can't edit them)
            assert session.hooks.named("context:compaction")[-1] == new_stats
        stats = new_stats
        if emitted:
            compacted += 1
        else:
            assert is_prefix(previous, body), f"prefix rewritten without compaction at {index}"
            stable += 1
        previous = body
    assert compacted >= 2 and stable >= 10, (compacted, stable)


@pytest.mark.anyio
async def test_prefix_survives_one_more_turn(anyio_backend: str) -> None:
    """65: compact, add one user+assistant turn, request again: the second view (minus
    notice) starts with the first (minus notice)."""
    session = Session(max_tokens=4_000)
    for index in range(8):
        await session.add(*turn(index))
    first, emitted = await session.request()
    assert emitted
    await session.add(human("one more question"), {"role": "assistant", "content": "sure"})
    second, emitted = await session.request()
    assert not emitted
    assert is_prefix(strip_notice(first), strip_notice(second))
    assert strip_notice(second)[-2:] == session.admitted[-2:]


@pytest.mark.anyio
async def test_decisions_only_grow(anyio_backend: str) -> None:
    """67: removed, truncated-or-removed and touched sets only grow; the level never drops."""
    session = Session(max_tokens=5_000, protected_tool_results=1)
    removed: frozenset[int] = frozenset()
    touched: frozenset[int] = frozenset()
    level = 0
    for index in range(20):
        await session.add(*turn(index))
        await session.request()
        state = snapshot(session.manager)
        assert removed <= state.removed
        assert touched <= state.removed | state.truncated | state.stubbed
        assert state.level >= level
        assert not (state.removed & (state.truncated | state.stubbed))
        removed, level = state.removed, state.level
        touched = state.removed | state.truncated | state.stubbed
    assert removed


@pytest.mark.anyio
async def test_sticky_view_kept_below_threshold(anyio_backend: str) -> None:
    """68 and the 'stable view survives inactive fetches' case: after a compaction, raising
    the threshold (and fetching through the retaining path with nothing retained) still
    returns the reduced view; removed messages stay absent."""
    session = Session(max_tokens=4_000, compaction_notice_enabled=False)
    for index in range(8):
        await session.add(*turn(index))
    view, _ = await session.request()
    assert session.manager.observable_state().removed
    session.manager.compact_threshold = 0.99
    again, emitted = await session.request(token_budget=1_000_000)
    assert again == view and not emitted
    inactive = await session.manager.get_messages_for_request_retaining(retain_contents=[])
    assert inactive == view


@pytest.mark.anyio
async def test_set_messages_and_clear_reset_sticky_state(anyio_backend: str) -> None:
    """14-15: ``set_messages`` with an unrelated history and ``clear`` drop every sticky
    decision and the stats; re-setting the same history keeps them."""
    session = Session(max_tokens=4_000)
    for index in range(8):
        await session.add(*turn(index))
    await session.request()
    manager = session.manager

    def committed() -> dict[str, Any] | None:  # read afresh (mypy keeps a narrowed attribute)
        return manager.last_compaction_stats

    stats = committed()
    assert manager.observable_state().removed and stats is not None
    await manager.set_messages(await manager.get_messages())
    assert committed() is stats and manager.observable_state().removed
    await manager.set_messages(replaced(await manager.get_messages()))
    assert not (
        manager.observable_state().removed
        or manager.observable_state().truncated
        or manager.observable_state().stubbed
    )
    assert manager.observable_state().level == 0 and committed() is None
    await manager.get_messages_for_request()
    assert committed() is not None
    await manager.clear()
    assert await manager.get_messages() == []
    assert manager.observable_state().level == 0 and committed() is None
    assert not manager.observable_state().removed


# -- storms --------------------------------------------------------------------------------------


def storm_history() -> list[dict[str, Any]]:
    """A protected human prompt larger than the target, then reducible tool turns."""
    messages: list[dict[str, Any]] = [human("do this: " + fill("prose", 12_000))]
    for index in range(6):
        fmt = FORMATS[index % 3]
        messages.append(calls(fmt, [f"s{index}"]))
        messages += results(fmt, {f"s{index}": LOG * 60})
    return messages


def storm_budget(messages: list[dict[str, Any]]) -> int:
    """A budget whose target (half of budget - 800) is below the prompt alone, while the
    prompt fits the budget itself."""
    prompt = estimate_message(messages[0])
    return int(prompt * 1.5) + 800


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_storm_without_growth_reports_once(anyio_backend: str) -> None:
    """Storm regression (real coordinator): a protected prompt larger than the target and
    50 identical requests give exactly one context:compaction, carrying the floor."""
    messages = storm_history()
    _, context, recorder = await mounted({"max_tokens": storm_budget(messages)})
    await context.set_messages(copy.deepcopy(messages))
    views = [await context.get_messages_for_request() for _ in range(50)]
    events = recorder.named("context:compaction")
    assert len(events) == 1
    assert events[0]["floor_tokens"] is not None
    assert events[0]["floor_tokens"] > events[0]["target_tokens"]
    assert all(view == views[0] for view in views)
    assert messages[0] in views[0]
    check_view_invariants(messages, views[0], truncate_chars=context.truncate_chars)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("protected_recent", "budget_share"),
    [
        (0.3, 1.5),
        (0.3, 0.5),
        (0.5, 0.5),
    ],
)
async def test_identical_requests_above_the_floor_report_once(
    anyio_backend: str, protected_recent: float, budget_share: float
) -> None:
    """Storm regression, prompt larger than the target (and, for share 0.5, than the
    budget itself): 50 identical requests give exactly one context:compaction and one
    view. (This suite found protected_recent=0.5 emitting two: one climb was not a fixed
    point because the recent window shrinks with the view.)"""
    prompt = human("do this: " + "The quick brown fox jumps over the lazy dog. " * 270)
    messages = [prompt]
    for index in range(10):
        messages.append(calls("openai", [f"c{index}"]))
        messages += results("openai", {f"c{index}": "log line\n" * 200})
        messages.append({"role": "assistant", "content": "ok " * 100})
    session = Session(
        protected_recent=protected_recent,
        protected_tool_results=0,
        compaction_notice_enabled=False,
    )
    await session.add(*messages)
    budget = int(estimate_message(prompt) * budget_share)
    views = [(await session.request(token_budget=budget))[0] for _ in range(50)]
    assert session.compactions() == 1
    assert all(view == views[0] for view in views)
    assert prompt in views[0]


@pytest.mark.anyio
async def test_storm_with_growth_reports_only_changes(anyio_backend: str) -> None:
    """With growth above a floor: a request emits context:compaction exactly when it
    changes the sticky decisions, and far fewer than one per request."""
    messages = storm_history()
    session = Session(max_tokens=storm_budget(messages))
    await session.add(*messages)
    requests = 0
    for index in range(40):
        before = snapshot(session.manager)
        _, emitted = await session.request()
        requests += 1
        after = snapshot(session.manager)
        changed = (before.removed, before.truncated, before.stubbed, before.level) != (
            after.removed,
            after.truncated,
            after.stubbed,
            after.level,
        )
        assert emitted == changed, f"request {index}: emitted={emitted}, changed={changed}"
        if index % 2:
            await session.add(human(f"short follow-up {index}"))
        else:
            fmt = FORMATS[index % 3]
            await session.add(calls(fmt, [f"g{index}"]))
            await session.add(*results(fmt, {f"g{index}": LOG * 20}))
    assert 2 <= session.compactions() < requests // 2, session.compactions()


# -- Decisions -------------------------------------------------------------------------------------


def test_removal_supersedes_reduced_forms() -> None:
    """Merging a ladder that removed a truncated message drops the truncation; the level
    is the maximum; new reduced forms become overrides."""
    from amplifier_module_context_simple.context.stats import CompactionStats

    stats = CompactionStats(*range(17))  # any figures: the merge only carries them over
    message = {"role": "tool", "tool_call_id": "x", "content": "long"}
    reduced = ({**message, "content": "short"}, 1)
    start = Decisions(
        truncated=frozenset({1, 2}),
        level=2,
        overrides={1: reduced[0], 2: reduced[0]},
        override_tokens={1: 1, 2: 1},
        stats=stats,
    )
    info = classify(message)
    ladder = Ladder(
        rows=Rows.of([Item(3, info, reduced[0], 1, 3, "truncated", has_results=True)]),
        total=0,
        target=0,
        protected=frozenset(),
        incomplete_groups=frozenset(),
        params=LadderParams(0.3, 5),
        truncate=lambda seq: None,
        stub=lambda seq: None,
    )
    ladder.removed.add(1)
    ladder.truncated.add(3)
    ladder.level = 1
    merged = run_through(start.merging(ladder))
    assert merged.removed == {1} and merged.truncated == {2, 3}
    assert 1 not in merged.overrides and 1 not in merged.override_tokens
    assert (merged.overrides[3], merged.override_tokens[3]) == reduced
    assert merged.shown() == {1: None, 2: reduced, 3: reduced}
    assert merged.level == 2 and merged.stats is stats
    assert start.truncated == {1, 2}, "merging must not change the original"
