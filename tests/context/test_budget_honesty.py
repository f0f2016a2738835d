"""Budget honesty (docs/design.md sections 4.4 and 7.4): the notice is budgeted, the budget is kept when the
irreducible content fits it, compaction never grows a view, and protected tool results
never strand a session (the floor is reduced past the eight rungs).

Budgets here are in the module's own estimate: that is the unit the ordinary, retaining
and hard-fit paths promise. The negotiated path is judged with the provider's count in
``tests/test_realdata.py`` and ``tests/negotiator``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import ContextLengthError, SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.rendering.notice import notice_message
from amplifier_module_context_simple.testing import (
    call_ids,
    check_view_invariants,
    is_notice,
    strip_notice,
)
from amplifier_module_context_simple.testing.provider_rules import check_provider_valid
from tests.context.strategies import calls, fill, result_ids_of, results

pytestmark = pytest.mark.anyio


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def total(view: list[dict[str, Any]]) -> int:
    return sum(estimate_message(message) for message in view)


def coding_session(fmt: str, rounds: int, size: int) -> list[dict[str, Any]]:
    """A first request, then ``rounds`` tool rounds with ``size``-character outputs."""
    messages: list[dict[str, Any]] = [human("first: fix the failing build")]
    for k in range(rounds):
        messages.append(calls(fmt, [f"c{k}"]))
        messages += results(fmt, {f"c{k}": f"r{k} " + fill("code", size)})
    messages.append(human("latest: and now run the tests"))
    return messages


async def manager_with(messages: list[dict[str, Any]], **config: Any) -> SimpleContextManager:
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(messages))
    return manager


def check(messages: list[dict[str, Any]], view: list[dict[str, Any]]) -> None:
    check_view_invariants(messages, view)
    check_provider_valid(view, "openai")
    check_provider_valid(view, "anthropic")


# -- the notice is budgeted --------------------------------------------------------------


def _notice_sizes(stats: dict[str, Any] | None = None) -> tuple[int, int]:
    if stats is None:
        stats = {"strategy_level": 8, "messages_removed": 10, "protected_tool_results": 5}
    return (
        estimate_message(notice_message(stats, "normal")),
        estimate_message(notice_message(stats, "minimal")),
    )


async def test_the_notice_shrinks_to_minimal_then_disappears_as_room_runs_out() -> None:
    """At budgets and notice reserves where the compacted view and the reserve leave room
    for the normal notice, only for the minimal one, or for neither, the view carries
    exactly that, and never exceeds the budget. (The notice never takes more than its
    reserve: later views grow towards the trigger with the notice where it was shown.)"""
    normal, minimal = _notice_sizes()
    assert minimal < normal
    messages = coding_session("openai", 12, 1500)
    seen: set[str] = set()
    for reserve in (0, minimal + 2, normal + 20):
        for budget in range(900, 4000, 37):
            manager = await manager_with(
                messages, compaction_notice_token_reserve=reserve, target_usage=1.0
            )
            view = await manager.get_messages_for_request(token_budget=budget)
            check(messages, view)
            assert total(view) <= budget, budget
            if manager.last_compaction_stats is None:
                continue
            body = strip_notice(view)
            room = min(budget - total(body), reserve, budget // 4)
            # the notice this view's stats make: its counts change its size by a token or two
            normal, minimal = _notice_sizes(manager.last_compaction_stats)
            if room >= normal:
                expected = "normal"
            elif room >= minimal:
                expected = "minimal"
            else:
                expected = "none"
            shown = "none"
            if view and is_notice(view[-1]):
                shown = "minimal" if "some older tool output" in view[-1]["content"] else "normal"
            assert shown == expected, (reserve, budget, room)
            seen.add(shown)
    assert seen == {"normal", "minimal", "none"}


async def test_a_compacted_view_with_its_notice_is_never_larger_than_before() -> None:
    """A compaction that saves less than the notice costs leaves the notice out."""
    messages = [human("first " + fill("prose", 60)), human("latest " + fill("prose", 60))]
    messages[1:1] = [
        {"role": "assistant", "content": f"a{k} " + fill("prose", 40)} for k in range(3)
    ]
    uncompacted = total(messages)
    for budget in range(40, uncompacted + 40, 3):
        manager = await manager_with(messages, compact_threshold=0.1, target_usage=0.1)
        view = await manager.get_messages_for_request(token_budget=budget)
        check(messages, view)
        assert total(view) <= uncompacted, budget
    await checkpoint()  # (for ASYNC910: the range is not a literal)


async def test_a_reserve_as_large_as_the_budget_is_scaled_to_a_quarter() -> None:
    messages = coding_session("anthropic", 6, 800)
    manager = await manager_with(messages, compaction_notice_token_reserve=5000)
    view = await manager.get_messages_for_request(token_budget=2000)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["budget"] == 2000 - 500
    assert total(view) <= 2000


# -- the floor is reduced past the rungs --------------------------------------------------


@pytest.mark.parametrize("fmt", ["openai", "amplifier", "anthropic"])
async def test_protected_results_over_the_budget_are_truncated_in_the_view(fmt: str) -> None:
    """The last five results alone exceed the budget (a coding agent's file views): the
    largest protected results are truncated in the view, marked and with the retrieval
    guidance, the history is unchanged, and the request fits."""
    messages = coding_session(fmt, 6, 12_000)
    manager = await manager_with(messages)
    stored = await manager.get_messages()
    budget = 6000
    view = await manager.get_messages_for_request(token_budget=budget)
    check(messages, view)
    assert total(view) <= budget
    reduced = [m for m in view if (m.get("metadata") or {}).get("compaction", {}).get("protected")]
    assert reduced, "no protected result was truncated"
    assert all("narrower read/query parameters" in str(m["content"]) for m in reduced)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["protected_results_truncated"] == len(reduced)
    assert await manager.get_messages() == stored
    assert view[0]["content"] == messages[0]["content"]
    assert view[-2 if is_notice(view[-1]) else -1]["content"] == messages[-1]["content"]


@pytest.mark.parametrize("hard_fit", [False, True])
async def test_retaining_paths_fit_by_reducing_the_floor(hard_fit: bool) -> None:
    messages = coding_session("anthropic", 6, 12_000)
    manager = await manager_with(messages)
    view = await manager.get_messages_for_request_retaining(
        retain_contents=[], token_budget=6000, hard_fit=hard_fit
    )
    check(messages, view)
    assert total(view) <= 6000


async def test_context_length_error_only_when_the_irreducible_content_is_over() -> None:
    """The first and latest human prompts alone exceed the budget: hard fit fails closed,
    naming the budget, and nothing changes; one token more than they need fits."""
    messages = coding_session("openai", 4, 3000)
    messages[0] = human("first " + fill("prose", 6000))
    messages[-1] = human("latest " + fill("prose", 6000))
    irreducible = estimate_message(messages[0]) + estimate_message(messages[-1])
    manager = await manager_with(messages)
    with pytest.raises(ContextLengthError):
        await manager.get_messages_for_request_retaining(
            retain_contents=[], token_budget=irreducible - 1, hard_fit=True
        )
    assert manager.last_compaction_stats is None
    view = await manager.get_messages_for_request_retaining(
        retain_contents=[], token_budget=irreducible, hard_fit=True
    )
    check(messages, view)
    assert total(view) <= irreducible


async def test_a_floor_over_the_target_but_within_the_budget_is_not_reduced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only a floor over the whole budget is reduced: over the target alone, the protected
    results stay whole and the floor is reported."""
    messages = coding_session("openai", 6, 3000)
    manager = await manager_with(messages)
    budget = int(total(messages) * 0.95)
    with caplog.at_level(logging.WARNING):
        view = await manager.get_messages_for_request(token_budget=budget)
    check(messages, view)
    assert not any((m.get("metadata") or {}).get("compaction", {}).get("protected") for m in view)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["protected_results_truncated"] == 0


@pytest.mark.parametrize("shape", ["openai", "amplifier", "anthropic-string", "anthropic-blocks"])
async def test_an_old_huge_result_is_truncated_not_removed(shape: str) -> None:
    """A 1 MiB output, capped at admission, then old: at a budget where truncating it
    suffices, the view shows it truncated (not removed), in every shape."""
    output = "x" * (1 << 20)
    fmt = "anthropic" if shape.startswith("anthropic") else shape
    messages: list[dict[str, Any]] = [human("first: read the log"), calls(fmt, ["big"])]
    result = results(fmt, {"big": output})[0]
    if shape == "anthropic-blocks":
        result["content"][0]["content"] = [{"type": "text", "text": output}]
    messages.append(result)
    for k in range(6):
        messages.append(calls(fmt, [f"s{k}"]))
        messages += results(fmt, {f"s{k}": f"small {k}"})
    messages.append(human("latest: summarise"))
    manager = await manager_with(messages)
    stored = await manager.get_messages()
    assert "[tool-result truncated at ingress: original_text_utf8_bytes=1048576;" in str(
        stored[2]["content"]
    )
    budget = 4000
    view = await manager.get_messages_for_request(token_budget=budget)
    # the history as admitted (ingress cap applied); these messages have no metadata of
    # their own, so the stored metadata is only the store's bookkeeping
    admitted = [{k: v for k, v in m.items() if k != "metadata"} for m in stored]
    check(admitted, view)
    assert total(view) <= budget
    big = [m for m in view if "big" in result_ids_of(m)]
    assert len(big) == 1, "the huge result's group was removed"
    assert (big[0].get("metadata") or {}).get("compaction", {}).get("form") == "truncated"
    assert any("big" in call_ids(m) for m in view)
