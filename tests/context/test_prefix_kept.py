"""``prefix_kept_tokens`` and ``first_changed_message``: what a compaction costs in cache.

Each case builds a history, takes the view before a compaction and the view after it,
and checks the stats against the two views: the kept prefix is exactly the leading
messages the two views share, and its tokens are their estimates.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from tests.context.strategies import calls, fill, results

pytestmark = pytest.mark.anyio


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def session(rounds: int, size: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        human("first: fix the build"),
    ]
    for k in range(rounds):
        messages.append(calls("openai", [f"c{k}"]))
        messages += results("openai", {f"c{k}": f"r{k} " + fill("code", size)})
    messages.append(human("latest: run the tests"))
    return messages


def expected(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[int, int | None]:
    kept = 0
    for index, message in enumerate(before):
        if index >= len(after) or after[index] != message:
            return kept, index
        kept += estimate_message(message)
    return kept, None


async def test_the_first_compaction_keeps_the_system_prompt_and_the_first_request() -> None:
    messages = session(8, 2000)
    manager = SimpleContextManager(compaction_notice_enabled=False, protected_tool_results=1)
    await manager.set_messages(copy.deepcopy(messages))
    before = await manager.get_messages_for_request(token_budget=10**6)
    budget = sum(estimate_message(m) for m in before) // 2
    after = await manager.get_messages_for_request(token_budget=budget)
    stats = manager.last_compaction_stats
    assert stats is not None
    kept, first = expected(before, after)
    assert (stats["prefix_kept_tokens"], stats["first_changed_message"]) == (kept, first)
    # the system prompt and the first request are never compacted: the prefix keeps them
    assert first is not None and first >= 2
    assert kept >= sum(estimate_message(m) for m in messages[:2])


async def test_a_later_escalation_is_measured_against_the_previous_view() -> None:
    messages = session(10, 2000)
    manager = SimpleContextManager(compaction_notice_enabled=False, protected_tool_results=1)
    await manager.set_messages(copy.deepcopy(messages))
    total = sum(estimate_message(m) for m in messages)
    await manager.get_messages_for_request(token_budget=int(total * 0.8))
    first_stats = manager.last_compaction_stats
    before = await manager.get_messages_for_request(token_budget=int(total * 0.8))
    after = await manager.get_messages_for_request(token_budget=int(total * 0.2))
    stats = manager.last_compaction_stats
    assert stats is not None and stats is not first_stats
    assert (stats["prefix_kept_tokens"], stats["first_changed_message"]) == expected(before, after)


async def test_a_negotiated_compaction_reports_its_kept_prefix() -> None:
    messages = session(8, 2000)
    manager = SimpleContextManager(token_meter="actual", max_tokens=6000, protected_tool_results=1)
    await manager.set_messages(copy.deepcopy(messages))
    views: list[list[dict[str, Any]]] = []

    async def count_view(view: list[dict[str, Any]]) -> dict[str, Any]:
        await checkpoint()
        views.append(copy.deepcopy(view))
        tokens = sum(estimate_message(m) for m in view)
        measurement = {"kind": "provider_count", "source": "estimate", "input_tokens": tokens}
        decision = {
            "estimated_input_tokens": tokens,
            "input_limit_tokens": 10**6,
            "measurement": measurement,
        }
        return {"dispatch": view, "budget_decision": decision}

    result = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=count_view
    )
    stats = result["transaction"].stats
    assert (stats["prefix_kept_tokens"], stats["first_changed_message"]) == expected(
        views[0], result["base_view"]
    )
    assert stats["first_changed_message"] is not None
