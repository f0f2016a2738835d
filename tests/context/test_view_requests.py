"""Views are requests a provider accepts: reused ids, interrupted calls, intervening notes.

Each test builds a history in one of the three formats, takes views from a real store and
judges them with the independent provider validator (``provider_rules``) for both APIs,
then asserts the one exact shape the contract gives.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from amplifier_module_context_simple import InvalidMessageError, SimpleContextManager
from amplifier_module_context_simple.testing.provider_rules import check_provider_valid
from tests.context.strategies import calls, result_ids_of, results

pytestmark = pytest.mark.anyio
FORMATS = ("openai", "amplifier", "anthropic")


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def note(text: str) -> dict[str, Any]:
    """A machine-written user note (a hook's), not a person's turn."""
    return {"role": "user", "content": text, "metadata": {"source": "hook"}}


def valid(view: list[dict[str, Any]]) -> list[dict[str, Any]]:
    check_provider_valid(view, "openai")
    check_provider_valid(view, "anthropic")
    return view


async def view_of(messages: list[dict[str, Any]], **config: Any) -> list[dict[str, Any]]:
    config.setdefault("compaction_notice_enabled", False)
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(messages))
    return valid(await manager.get_messages_for_request(token_budget=1_000_000))


def shown_call_ids(message: dict[str, Any]) -> list[str]:
    ids = [c["id"] for c in message.get("tool_calls") or []]
    content = message.get("content")
    if isinstance(content, list):
        ids += [b["id"] for b in content if b.get("type") == "tool_use"]
    return ids


def synthesized(message: dict[str, Any]) -> bool:
    return bool((message.get("metadata") or {}).get("compaction", {}).get("form") == "synthesized")


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_reused_call_id_is_shown_under_a_fresh_name(fmt: str) -> None:
    """The second declaration of ``c1`` and its result are shown as ``c1~2``; the map back
    is in the metadata; the stored history keeps ``c1`` twice."""
    messages = [
        human("first"),
        calls(fmt, ["c1"]),
        *results(fmt, {"c1": "one"}),
        calls(fmt, ["c1"]),
        *results(fmt, {"c1": "two"}),
        human("latest"),
    ]
    manager = SimpleContextManager(compaction_notice_enabled=False)
    await manager.set_messages(copy.deepcopy(messages))
    view = valid(await manager.get_messages_for_request(token_budget=1_000_000))
    assert [shown_call_ids(m) for m in view if m["role"] == "assistant"] == [["c1"], ["c1~2"]]
    assert result_ids_of(view[2]) == ["c1"] and result_ids_of(view[4]) == ["c1~2"]
    assert view[3]["metadata"]["renamed_tool_call_ids"] == {"c1~2": "c1"}
    assert view[4]["metadata"]["renamed_tool_call_ids"] == {"c1~2": "c1"}
    stored = await manager.get_messages()
    assert [result_ids_of(m) for m in stored[2:5:2]] == [["c1"], ["c1"]]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_an_unanswered_call_followed_by_an_assistant_turn_is_answered_in_the_view(
    fmt: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One synthesized result right after the call, in the call's format, marked; logged
    once; counted in the meter stats; never stored."""
    messages = [
        human("first"),
        calls(fmt, ["lost"]),
        {"role": "assistant", "content": "carrying on"},
        human("latest"),
    ]
    manager = SimpleContextManager(compaction_notice_enabled=False)
    with caplog.at_level(logging.WARNING):
        await manager.set_messages(copy.deepcopy(messages))
        view = valid(await manager.get_messages_for_request(token_budget=1_000_000))
        valid(await manager.get_messages_for_request(token_budget=1_000_000))
    assert [m["role"] for m in view] == [
        "user",
        "assistant",
        "user" if fmt == "anthropic" else "tool",
        "assistant",
        "user",
    ]
    answer = view[2]
    assert synthesized(answer) and answer["metadata"]["compaction"]["tool_call_ids"] == ["lost"]
    assert result_ids_of(answer) == ["lost"]
    if fmt == "anthropic":
        assert answer["content"][0]["is_error"] is True
    assert "No result was recorded" in str(answer["content"])
    assert caplog.text.count("has no recorded result") == 1
    assert manager.last_token_meter_stats is not None
    assert manager.last_token_meter_stats["results_synthesized"] == 1
    assert len(await manager.get_messages()) == len(messages)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_person_speaking_after_an_unanswered_call_closes_it(fmt: str) -> None:
    """An interrupted tool: the person's next turn follows the call; the view answers it."""
    messages = [human("first"), calls(fmt, ["stopped"]), human("stop, do something else")]
    view = await view_of(messages)
    assert [synthesized(m) for m in view] == [False, False, True, False]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_call_at_the_tail_stays_pending(fmt: str) -> None:
    """No turn after the call yet: a pending tail, shown as it is (no synthesized result)."""
    messages = [human("first"), calls(fmt, ["running"])]
    view = await view_of(messages)
    assert len(view) == 2 and not any(synthesized(m) for m in view)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_hook_note_between_parallel_results_moves_after_them(fmt: str) -> None:
    """A machine note admitted between two results of one call message is shown after
    both results, so the results follow their call (both APIs require it)."""
    messages = [
        human("first"),
        calls(fmt, ["a", "b"]),
        *results(fmt, {"a": "A"}),
        note("lint warning from a hook"),
        *results(fmt, {"b": "B"}),
        {"role": "assistant", "content": "done"},
    ]
    view = await view_of(messages)
    assert [m.get("content") for m in view][-2:] == ["lint warning from a hook", "done"]
    assert [result_ids_of(m) for m in view[2:4]] == [["a"], ["b"]]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_result_after_a_later_assistant_turn_answers_nothing(fmt: str) -> None:
    """A late result (its call's run ended) never reaches a view; the call is answered by
    a synthesized result instead."""
    messages = [
        human("first"),
        calls(fmt, ["late"]),
        {"role": "assistant", "content": "moving on"},
        *results(fmt, {"late": "too late"}),
        human("latest"),
    ]
    view = await view_of(messages)
    assert "too late" not in str(view)
    assert [synthesized(m) for m in view] == [False, False, True, False, False]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_result_admitted_before_its_call_answers_nothing(fmt: str) -> None:
    messages = [
        human("first"),
        *results(fmt, {"early": "EARLY-OUTPUT"}),
        calls(fmt, ["early"]),
        human("latest"),
    ]
    view = await view_of(messages)
    assert "EARLY-OUTPUT" not in str(view)
    assert [synthesized(m) for m in view] == [False, False, True, False]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_synthesized_result_leaves_the_view_with_its_call(fmt: str) -> None:
    """Under pressure the group (call and synthesized result) is removed as one unit."""
    filler = "output line with some detail\n" * 60
    messages: list[dict[str, Any]] = [human("first")]
    messages += [calls(fmt, ["lost"]), {"role": "assistant", "content": "x " * 400}]
    for k in range(8):
        messages += [calls(fmt, [f"c{k}"]), *results(fmt, {f"c{k}": filler})]
    messages.append(human("latest"))
    manager = SimpleContextManager(compaction_notice_enabled=False, protected_tool_results=2)
    await manager.set_messages(copy.deepcopy(messages))
    budgets = [1_000_000, 4000, 2500, 1500]
    seen = []
    for budget in budgets:
        view = valid(await manager.get_messages_for_request(token_budget=budget))
        has_call = any("lost" in shown_call_ids(m) for m in view)
        has_answer = any(synthesized(m) for m in view)
        assert has_call == has_answer, budget
        seen.append(has_call)
    assert seen[0] is True and seen[-1] is False


async def test_a_message_with_empty_list_content_is_shown() -> None:
    """``content: []`` carries no results to drop: the message is shown as given (a system
    message, the latest human turn, a call message)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": []},
        human("first"),
        {"role": "assistant", "content": [], "tool_calls": calls("openai", ["c"])["tool_calls"]},
        *results("openai", {"c": "r"}),
        {"role": "user", "content": []},
    ]
    view = await view_of(messages)
    assert view == messages


@pytest.mark.parametrize(
    ("role", "block", "says"),
    [
        ("assistant", {"type": "tool_result", "tool_use_id": "z", "content": "x"}, "tool_result"),
        ("developer", {"type": "tool_result", "tool_use_id": "z", "content": "x"}, "tool_result"),
        ("user", {"type": "tool_use", "id": "z", "name": "grep", "input": {}}, "tool_use"),
        ("tool", {"type": "tool_use", "id": "z", "name": "grep", "input": {}}, "tool_use"),
    ],
)
async def test_a_tool_block_in_a_role_no_provider_accepts_is_rejected(
    role: str, block: dict[str, Any], says: str
) -> None:
    """Results come from the caller's side (user/tool), calls from the model (assistant).

    Both providers reject the other placements, and no view could show such a block as the
    answer to (or the origin of) a call, so admission refuses it by name and keeps the store.
    """
    odd = {"role": role, "content": [{"type": "text", "text": "t"}, block]}
    manager = SimpleContextManager(compaction_notice_enabled=False)
    await manager.set_messages([human("q")])
    before = manager.observable_state()
    with pytest.raises(InvalidMessageError, match=f"a '{role}' message cannot carry {says}") as e:
        await manager.add_message(odd)
    assert e.value.index is None
    with pytest.raises(InvalidMessageError, match=f"a '{role}' message cannot carry {says}") as e:
        await manager.set_messages([human("q"), odd, human("latest")])
    assert e.value.index == 1
    assert manager.observable_state() == before
