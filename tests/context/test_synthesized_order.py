"""Synthesized results come after the results a turn did record.

A turn whose calls are partly answered when the conversation goes on (a person speaks, a
new assistant turn) keeps its recorded results where and as they are stored; the view
answers the missing calls after them, in call order, and before a message that mixes
results with other content (both providers reject results after such content). The
synthesized results travel with their call: compaction removes them with it, and they
count in its ladder item.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.slices import run_through
from amplifier_module_context_simple.testing import (
    call_ids,
    check_view_invariants,
    reduced_kind,
    result_ids,
)
from amplifier_module_context_simple.testing.provider_rules import (
    check_provider_valid,
    provider_violations,
)
from tests.context.strategies import FORMATS, calls, results, synthesized_for

pytestmark = pytest.mark.anyio

BIG = "output line with some detail\n" * 100  # ~3,000 characters
DIALECTS = ("openai", "anthropic")
STOP = {"role": "user", "content": "stop, do something else"}


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def partly_answered(fmt: str) -> list[dict[str, Any]]:
    """Three calls, ``c`` then ``a`` recorded (in that order), ``b`` never; a person speaks."""
    return [
        human("first request"),
        calls(fmt, ["a", "b", "c"], text="three calls"),
        *results(fmt, {"c": "c output", "a": "a output"}),
        STOP,
    ]


def mixed(fmt: str) -> list[dict[str, Any]]:
    """Three calls: ``a`` answered alone, ``b`` in the person's own turn (a ``tool_result``
    block then their text), ``c`` never."""
    typed = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "b", "content": "b output"},
            {"type": "text", "text": "and then rename the module"},
        ],
    }
    return [
        human("first request"),
        calls(fmt, ["a", "b", "c"]),
        *results(fmt, {"a": "a output"}),
        typed,
    ]


def reused(fmt: str) -> list[dict[str, Any]]:
    """A second turn reuses the id ``dup`` (views show it ``dup~2``) and leaves it
    unanswered; its other two calls are answered; a person speaks."""
    return [
        human("first request"),
        calls(fmt, ["dup"]),
        *results(fmt, {"dup": "first output"}),
        {"role": "assistant", "content": "done"},
        human("again"),
        calls(fmt, ["dup", "y", "z"]),
        *results(fmt, {"y": "y output", "z": "z output"}),
        STOP,
    ]


async def manager_of(messages: list[dict[str, Any]], **config: Any) -> SimpleContextManager:
    config.setdefault("compaction_notice_enabled", False)
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(messages))
    return manager


async def view_of(messages: list[dict[str, Any]], **config: Any) -> list[dict[str, Any]]:
    manager = await manager_of(messages, **config)
    return await manager.get_messages_for_request(token_budget=1_000_000)


def synthesized(view: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        m for m in view if m.get("metadata", {}).get("compaction", {}).get("form") == "synthesized"
    ]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_synthesized_results_follow_the_recorded_ones(fmt: str) -> None:
    """The call, its two recorded results in stored order, then the synthesized one, then
    the person's turn."""
    messages = partly_answered(fmt)
    view = await view_of(messages)
    assert view == [*messages[:4], *synthesized_for(fmt, ["b"]), STOP]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_order_is_valid_for_both_providers(fmt: str, dialect: str) -> None:
    check_provider_valid(await view_of(partly_answered(fmt)), dialect)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_several_missing_calls_are_answered_in_call_order(fmt: str) -> None:
    """With only the third of four calls answered, the other three follow its result in
    the order the turn made them."""
    messages = [
        human("first request"),
        calls(fmt, ["a", "b", "c", "d"]),
        *results(fmt, {"c": "c output"}),
        STOP,
    ]
    view = await view_of(messages)
    assert view == [*messages[:3], *synthesized_for(fmt, ["a", "b", "d"]), STOP]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_stored_history_is_unchanged(fmt: str) -> None:
    messages = partly_answered(fmt)
    manager = await manager_of(messages)
    before = await manager.get_messages()
    await manager.get_messages_for_request(token_budget=1_000_000)
    assert await manager.get_messages() == before


@pytest.mark.parametrize("fmt", FORMATS)
async def test_synthesized_results_come_before_a_message_mixing_results_and_text(
    fmt: str,
) -> None:
    """The person's own turn carrying a result and their text stays last: the synthesized
    result goes after the pure result carrier, before it."""
    messages = mixed(fmt)
    view = await view_of(messages)
    assert view == [*messages[:3], *synthesized_for(fmt, ["c"]), messages[3]]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_order_with_a_mixed_message_is_valid_for_both_providers(
    fmt: str, dialect: str
) -> None:
    check_provider_valid(await view_of(mixed(fmt)), dialect)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("dialect", "codes"),
    [
        ("openai", [("missing-result", 1), ("orphan-result", 4)]),
        ("anthropic", [("results-not-first", 4)]),
    ],
)
async def test_after_the_mixed_message_the_providers_would_reject_them(
    dialect: str, codes: list[tuple[str, int]]
) -> None:
    """Why they go before it: after the person's text, OpenAI's call misses a result in
    the run of tool messages following it and the late tool message follows a user message
    (it answers no call); Anthropic's merged user turn has a result after text."""
    view = await view_of(mixed("anthropic"))
    late = [*view[:3], view[4], view[3]]
    found = provider_violations(late, dialect)  # type: ignore[arg-type]
    assert [(v.code, v.position) for v in found] == codes


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_view_extended_after_the_run_closes_matches_a_fresh_one(fmt: str) -> None:
    """A view rendered while the calls were running (a system note admitted meanwhile),
    then extended once the person speaks, equals the view of a fresh store."""
    messages = [
        human("first request"),
        calls(fmt, ["a", "b", "c"]),
        *results(fmt, {"c": "c output"}),
        {"role": "system", "content": "a hook's system note", "metadata": {"source": "hook"}},
        *results(fmt, {"a": "a output"}),
    ]
    manager = await manager_of(messages)
    await manager.get_messages_for_request(token_budget=1_000_000)
    await manager.add_message(copy.deepcopy(STOP))
    extended = await manager.get_messages_for_request(token_budget=1_000_000)
    assert extended == await view_of([*messages, STOP])


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_renamed_call_s_synthesized_result_names_its_stored_id(fmt: str) -> None:
    """The result for the reused id, shown ``dup~2``, maps it back to ``dup``."""
    view = await view_of(reused(fmt))
    assert synthesized(view) == synthesized_for(fmt, ["dup~2"], {"dup~2": "dup"})


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_renamed_call_s_view_meets_the_invariants(fmt: str) -> None:
    """The view of the reused id is what the testing oracle owes (renamed call, results,
    the synthesized result after them; both providers' rules)."""
    messages = reused(fmt)
    check_view_invariants(messages, await view_of(messages))


async def test_the_warning_names_the_stored_id(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        await manager_of(reused("openai"))
    warned = [r.getMessage() for r in caplog.records if "no recorded result" in r.getMessage()]
    assert [w.split(" has no")[0] for w in warned] == [
        "context-simple: tool call dup (shown as dup~2) (message 5)"
    ]


def under_pressure(fmt: str) -> list[dict[str, Any]]:
    """``partly_answered`` with large results, then short turns, then the latest request."""
    messages = [
        human("first request"),
        calls(fmt, ["a", "b", "c"], text="three calls"),
        *results(fmt, {"c": f"c {BIG * 4}", "a": f"a {BIG * 4}"}),
        STOP,
    ]
    for turn in range(6):
        messages += [{"role": "assistant", "content": "answer"}, human(f"follow-up {turn}")]
    return [*messages, {"role": "assistant", "content": "ok"}, human("latest request")]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_compaction_removes_the_synthesized_result_with_its_group(fmt: str) -> None:
    """Under pressure the group leaves whole: no call, recorded or synthesized result."""
    manager = await manager_of(under_pressure(fmt), protected_tool_results=0)
    view = await manager.get_messages_for_request(token_budget=3_000)
    assert [m for m in view if call_ids(m) or result_ids(m)] == []


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_truncated_result_keeps_the_synthesized_one_after_it(fmt: str) -> None:
    """A recorded result shortened in place: the call stays, so does its synthesized
    result, after the recorded ones."""
    config = {"protected_tool_results": 0, "truncate_chars": 300, "target_usage": 0.8}
    manager = await manager_of(under_pressure(fmt), **config)
    view = await manager.get_messages_for_request(token_budget=4_800)
    kinds = [reduced_kind(m) for m in view[:6]]
    assert kinds == [None, None, "truncated", None, "synthesized", None]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_ladder_counts_the_synthesized_result_in_its_call(fmt: str) -> None:
    """The ladder's total equals the estimate of the view it starts from."""
    manager = await manager_of(partly_answered(fmt))
    view = await manager.get_messages_for_request(token_budget=1_000_000)
    args = await manager._request_inputs(
        token_budget=1_000_000, provider=None, retain=(), hard_fit=False
    )
    plan = manager._snapshot(args)
    ladder = run_through(manager._policy.laddering(plan, plan.decisions, target=0))
    assert ladder.total == sum(map(estimate_message, view))
