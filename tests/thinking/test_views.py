"""Append-only views under preserved thinking, judged by the independent oracle
(``testing/thinking_oracle.py``) on the real conversations with thinking blocks and on
generated sessions in both block formats, on the ordinary path, with hard-fit retries,
and on the negotiated path (commits and rollbacks).

On every request: no thinking block is shown with another prefix than the request that
produced it (0 invalid), and none is left out that could have been sent validly."""

from __future__ import annotations

from typing import Any

import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import SimpleContextManager
from tests.realdata import conversations
from tests.support import provider_count_envelope
from tests.test_realdata import SOURCE, counted
from tests.thinking.sessions import (
    Tally,
    has_thinking,
    ordinary,
    replay_checked,
    thinking_session,
)

pytestmark = pytest.mark.anyio

BUDGETS = (8_000, 12_000, 16_000, 24_000, 32_000, 48_000, 64_000)
SMALL_BUDGETS = (3_000, 5_000)
"""Below 8k too: the smallest conversation (amplifier_agent_1) compacts only there."""
THINKING = [conv for conv in conversations() if any(map(has_thinking, conv.messages))]


def test_the_real_data_has_thinking_in_both_block_formats() -> None:
    assert {conv.format for conv in THINKING} == {"anthropic", "amplifier"}
    assert len(THINKING) == 5


@pytest.mark.parametrize("conv", THINKING, ids=[conv.name for conv in THINKING])
async def test_real_conversations_keep_every_thinking_block_valid(
    conv: Any, anyio_backend: str
) -> None:
    """Every budget from 8k up (and two below): 0 requests with an invalid block, 0 valid
    blocks left out; every conversation compacts at some of them."""
    await checkpoint()
    compacting = 0
    for budget in SMALL_BUDGETS + BUDGETS:
        tally = await replay_checked(conv.messages, ordinary(budget))
        assert (tally.invalid_requests, tally.left_out) == (0, 0), (budget, tally.first_invalid)
        compacting += tally.compactions > 0
    assert compacting >= 2


@pytest.mark.parametrize("fmt", ["anthropic", "amplifier"])
@pytest.mark.parametrize("seed", range(6))
async def test_generated_sessions_keep_every_thinking_block_valid(
    fmt: str, seed: int, anyio_backend: str
) -> None:
    messages = thinking_session(fmt, 60, seed)
    for budget in (3_000, 6_000, 12_000):
        tally = await replay_checked(messages, ordinary(budget), validate=True)
        assert tally.compactions > 0
        assert tally.shown > 0
        assert (tally.invalid_requests, tally.left_out) == (0, 0), (budget, tally.first_invalid)


def hard_fit_every(every: int, budget: int) -> Any:
    """Ordinary requests, and every ``every``-th one retried as after a provider overflow:
    a hard fit at 70% of the budget (the retry's view is the one answered)."""

    async def request(manager: SimpleContextManager, number: int) -> list[dict[str, Any]]:
        view = await manager.get_messages_for_request(token_budget=budget)
        if number % every == every - 1:
            view = await manager.get_messages_for_request_retaining(
                retain_contents=[], token_budget=int(budget * 0.7), hard_fit=True
            )
        return view

    return request


@pytest.mark.parametrize("fmt", ["anthropic", "amplifier"])
async def test_hard_fit_retries_keep_every_thinking_block_valid(
    fmt: str, anyio_backend: str
) -> None:
    total = Tally()
    for seed in range(4):
        messages = thinking_session(fmt, 50, 100 + seed)
        tally = await replay_checked(messages, hard_fit_every(5, 8_000))
        total.add(tally)
    assert total.compactions > 4 and total.shown > 0
    assert (total.invalid_requests, total.left_out) == (0, 0), total.first_invalid


class Counter:
    """``count_view`` with a real tokenizer (o200k over the provider's request shape)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    async def __call__(self, view: list[dict[str, Any]]) -> dict[str, Any]:
        await checkpoint()  # a provider's count is an await
        return provider_count_envelope(view, counted(view), self.limit, SOURCE)


def negotiated(limit: int, rollback_every: int = 0) -> Any:
    """Negotiated requests that commit; every ``rollback_every``-th one is first rolled
    back (the provider call failed: nothing answered it) and asked again."""

    async def request(manager: SimpleContextManager, number: int) -> list[dict[str, Any]]:
        async def ask() -> dict[str, Any]:
            return await manager.get_measured_request_view(
                provider=None, retain_contents=[], count_view=Counter(limit)
            )

        result = await ask()
        rolls_back = rollback_every and number % rollback_every == rollback_every - 1
        if rolls_back and result["transaction"] is not None:
            result["transaction"].rollback()
            result = await ask()
        if result["transaction"] is not None:
            assert await result["transaction"].commit()
        view: list[dict[str, Any]] = result["base_view"]
        return view

    return request


@pytest.mark.parametrize("conv", THINKING, ids=[conv.name for conv in THINKING])
async def test_negotiated_real_conversations_keep_every_thinking_block_valid(
    conv: Any, anyio_backend: str
) -> None:
    for limit in (12_000, 24_000):
        tally = await replay_checked(
            conv.messages,
            negotiated(limit, rollback_every=4),
            token_meter="actual",
            max_tokens=limit,
        )
        assert (tally.invalid_requests, tally.left_out) == (0, 0), (limit, tally.first_invalid)


@pytest.mark.parametrize("fmt", ["anthropic", "amplifier"])
async def test_negotiated_generated_sessions_keep_every_thinking_block_valid(
    fmt: str, anyio_backend: str
) -> None:
    total = Tally()
    for seed in range(3):
        messages = thinking_session(fmt, 50, 200 + seed)
        tally = await replay_checked(
            messages, negotiated(5_000, rollback_every=3), token_meter="actual", max_tokens=5_000
        )
        total.add(tally)
    assert total.compactions > 3 and total.shown > 0
    assert (total.invalid_requests, total.left_out) == (0, 0), total.first_invalid


def with_system_changes(messages: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """``messages`` with a hook system message admitted before every ``every``-th assistant
    turn (a hook injecting instructions mid-session: the system part changes)."""
    out: list[dict[str, Any]] = []
    turns = 0
    for message in messages:
        if message["role"] == "assistant":
            turns += 1
            if turns % every == 0:
                out.append(
                    {
                        "role": "system",
                        "content": f"Hook instruction {turns}: stay on task.",
                        "metadata": {"source": "hook"},
                    }
                )
        out.append(message)
    return out


@pytest.mark.parametrize("fmt", ["anthropic", "amplifier"])
async def test_a_changed_system_part_leaves_out_all_earlier_thinking(
    fmt: str, anyio_backend: str
) -> None:
    """A system message admitted mid-session changes the prefix of every thinking block
    before it: the views from then on leave them all out (and none that came after), on
    both paths, whether or not a compaction happens."""
    messages = with_system_changes(thinking_session(fmt, 40, 300), every=7)
    for budget in (4_000, 200_000):
        tally = await replay_checked(messages, ordinary(budget), validate=True)
        assert tally.shown > 0
        assert (tally.invalid_requests, tally.left_out) == (0, 0), (budget, tally.first_invalid)
    tally = await replay_checked(
        messages, negotiated(5_000, rollback_every=3), token_meter="actual", max_tokens=5_000
    )
    assert (tally.invalid_requests, tally.left_out) == (0, 0), tally.first_invalid


async def test_a_changed_system_part_keeps_thinking_without_a_prefix_check(
    anyio_backend: str,
) -> None:
    messages = with_system_changes(thinking_session("anthropic", 30, 301), every=5)
    checked = await replay_checked(messages, ordinary(200_000))
    unchecked = await replay_checked(messages, ordinary(200_000), preserved_thinking=False)
    assert unchecked.shown > checked.shown
    assert checked.compactions == unchecked.compactions == 0


REMINDER = (
    "<system-reminder>"
    + "Run the whole test suite before every commit. " * 6
    + "</system-reminder>"
)


def with_reminders(messages: list[dict[str, Any]], at: set[int]) -> list[dict[str, Any]]:
    """``messages`` with a persisted reminder envelope (one body) before the assistant
    turns numbered in ``at``, as a hook that injects its reminder does."""
    out: list[dict[str, Any]] = []
    turns = 0
    for message in messages:
        if message["role"] == "assistant":
            turns += 1
            if turns in at:
                metadata = {"ephemeral": True, "persisted": True, "source": "hook"}
                out.append({"role": "user", "content": REMINDER, "metadata": metadata})
        out.append(message)
    return out


def retaining_every(every: int, budget: int) -> Any:
    """Ordinary requests, and every ``every``-th one retaining the reminder (its newest
    envelope shown whole even where a decision stubbed it: the view changes there)."""

    async def request(manager: SimpleContextManager, number: int) -> list[dict[str, Any]]:
        if number % every == every - 1 and number > 2:
            return await manager.get_messages_for_request_retaining(
                retain_contents=[REMINDER], token_budget=budget
            )
        return await manager.get_messages_for_request(token_budget=budget)

    return request


@pytest.mark.parametrize("fmt", ["anthropic", "amplifier"])
async def test_a_retained_reminder_shown_whole_leaves_out_the_thinking_after_it(
    fmt: str,
) -> None:
    """Retaining a reminder a decision stubbed shows it whole on that request and stubbed
    on the next: each time the view changes there, and the thinking after it is left out,
    so no request sends an invalid block. (Leaving it out is sticky: thinking that becomes
    valid again when the reminder is stubbed again stays out; docs/thinking.md.)"""
    total = Tally()
    for seed in range(3):
        # one early reminder: it ages, a rung stubs it, and retaining it shows it whole
        messages = with_reminders(thinking_session(fmt, 40, 400 + seed), at={2})
        tally = await replay_checked(messages, retaining_every(3, 3_000))
        total.add(tally)
    assert total.compactions > 3 and total.shown > 0
    assert total.invalid_requests == 0, total.first_invalid
