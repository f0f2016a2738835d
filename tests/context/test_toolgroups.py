"""Tool groups are linked by id, in every format, never by adjacency (CONTRACT 6.1).

A view never contains a result without its call, nor (except an unanswered tail) a call
without all of its results; a group leaves a view as one unit; orphan results never
appear in a view.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.history import History
from tests.context.invariants import call_ids, check_view_invariants, result_ids
from tests.context.strategies import FORMATS, calls, results

BIG = "output line with some detail\n" * 100  # ~3,000 characters
pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def shown_ids(view: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    declared = {i for m in view for i in call_ids(m)}
    answered = {i for m in view for i in result_ids(m)}
    return declared, answered


async def views_at(
    messages: list[dict[str, Any]], budgets: list[int], **config: Any
) -> list[list[dict[str, Any]]]:
    """Views of ``messages`` at decreasing budgets, each checked against the invariants."""
    config.setdefault("compaction_notice_enabled", False)
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(messages))
    stored = await manager.get_messages()
    out = []
    for budget in budgets:
        view = await manager.get_messages_for_request(token_budget=budget)
        check_view_invariants(messages, view, truncate_chars=manager.truncate_chars)
        out.append(view)
    assert await manager.get_messages() == stored
    return out


def tool_turns(fmt: str, turns: int, *, width: int = 3, together: bool = False) -> list[Any]:
    """``turns`` rounds of ``width`` parallel calls whose results arrive in reverse order."""
    messages: list[dict[str, Any]] = [human("first request")]
    for turn in range(turns):
        ids = [f"{fmt}_{turn}_{k}" for k in range(width)]
        messages.append(calls(fmt, ids, text=f"round {turn}"))
        answers = {i: f"{i} {BIG}" for i in reversed(ids)}
        messages += results(fmt, answers, together=together)
        messages.append({"role": "assistant", "content": f"done with round {turn}"})
    messages.append(human("latest request"))
    return messages


BUDGETS = [40_000, 6_000, 3_000, 1_500, 600, 100]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("together", [False, True])
async def test_groups_leave_and_stay_whole_in_every_format(
    anyio_backend: str, fmt: str, together: bool
) -> None:
    """At every pressure, a call id is shown exactly when its result is shown (results in
    reverse order, one message each or all in one), and pressure does remove groups."""
    messages = tool_turns(fmt, 6, together=together)
    views = await views_at(messages, BUDGETS, protected_tool_results=2)
    for view in views:
        declared, answered = shown_ids(view)
        assert declared == answered
    assert len(shown_ids(views[-1])[0]) < 18, "the tightest budget removed no group"


async def test_mixed_formats_in_one_history(anyio_backend: str) -> None:
    """Rounds in the three formats interleaved: every group is paired by its own ids."""
    messages: list[dict[str, Any]] = [human("first request")]
    for turn in range(9):
        fmt = FORMATS[turn % 3]
        ids = [f"{fmt}{turn}a", f"{fmt}{turn}b"]
        messages.append(calls(fmt, ids))
        messages += results(fmt, {ids[1]: f"b {BIG}", ids[0]: f"a {BIG}"})
    messages.append(human("latest request"))
    for view in await views_at(messages, BUDGETS, protected_tool_results=1):
        declared, answered = shown_ids(view)
        assert declared == answered


@pytest.mark.parametrize("fmt", FORMATS)
async def test_results_separated_from_their_call(anyio_backend: str, fmt: str) -> None:
    """Messages between a call and its (split, reordered) results do not break pairing:
    the group is found by id, not by position."""
    messages: list[dict[str, Any]] = [human("first request")]
    for turn in range(5):
        ids = [f"s{turn}a", f"s{turn}b"]
        messages.append(calls(fmt, ids))
        first, second = results(fmt, {ids[1]: f"b {BIG}", ids[0]: f"a {BIG}"})
        messages += [
            first,
            {
                "role": "user",
                "content": f"<system-reminder>note {turn}</system-reminder>",
                "metadata": {"ephemeral": True, "persisted": True, "source": "hook"},
            },
            {"role": "developer", "content": f"developer note {turn}"},
            second,
        ]
    messages.append(human("latest request"))
    for view in await views_at(messages, BUDGETS, protected_tool_results=1):
        declared, answered = shown_ids(view)
        assert declared == answered


@pytest.mark.parametrize("fmt", FORMATS)
async def test_orphan_results_never_in_a_view(anyio_backend: str, fmt: str) -> None:
    """A result whose call was never made (or only made later) never reaches a view, even
    without pressure; a human turn carrying an orphan block keeps its text."""
    messages: list[dict[str, Any]] = [
        human("first request"),
        *results(fmt, {"ghost": "no call made this"}),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "ghost2", "content": "stray"},
                {"type": "text", "text": "the human also typed this"},
            ],
        },
        *results(fmt, {"later": "answered before it was asked"}),
        calls(fmt, ["later"]),
        *results(fmt, {"later": "the real answer"}),
        human("latest request"),
    ]
    (view,) = await views_at(messages, [40_000])
    assert "ghost" not in str(view) and "ghost2" not in str(view)
    assert "answered before it was asked" not in str(view)
    assert "the real answer" in str(view)
    typed = [m for m in view if "the human also typed this" in str(m)]
    assert typed == [
        {"role": "user", "content": [{"type": "text", "text": "the human also typed this"}]}
    ]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_partly_answered_call_pins_its_group(anyio_backend: str, fmt: str) -> None:
    """REFERENCE 49: an assistant that declared A and B with only A answered is never
    removed (nor is A's result), at any pressure; B stays without a result."""
    messages: list[dict[str, Any]] = [
        human("first request"),
        calls(fmt, ["A", "B"], text=f"two calls {BIG}"),
        *results(fmt, {"A": f"A done {BIG}"}),
    ]
    for turn in range(6):
        messages += [human(f"follow-up {turn} {BIG}"), {"role": "assistant", "content": BIG}]
    messages.append(human("latest request"))
    for view in await views_at(messages, BUDGETS, protected_tool_results=0):
        assert messages[1] in view
        declared, answered = shown_ids(view)
        assert {"A", "B"} <= declared and "A" in answered and "B" not in answered


@pytest.mark.parametrize("fmt", FORMATS)
async def test_protected_zone_keeps_all_parallel_results(anyio_backend: str, fmt: str) -> None:
    """REFERENCE 50: an assistant with 6 calls whose 6 results are in the protected zone
    keeps all 6 results, in every view."""
    messages = tool_turns(fmt, 3)
    ids = [f"p{k}" for k in range(6)]
    messages[-1:-1] = [calls(fmt, ids), *results(fmt, {i: f"{i} short" for i in ids})]
    for view in await views_at(messages, BUDGETS, protected_tool_results=6):
        declared, answered = shown_ids(view)
        assert set(ids) <= declared and set(ids) <= answered


@pytest.mark.parametrize("fmt", FORMATS)
async def test_protected_sibling_result_vetoes_group_removal(anyio_backend: str, fmt: str) -> None:
    """A group one of whose results is among the last ``protected_tool_results`` results
    is kept whole, even when its other results are old."""
    messages: list[dict[str, Any]] = [human("first request"), calls(fmt, ["old", "young"])]
    messages += results(fmt, {"old": f"old {BIG}"})
    for turn in range(6):
        messages += [human(f"turn {turn}"), {"role": "assistant", "content": BIG}]
    messages += results(fmt, {"young": "young, protected"})
    messages.append(human("latest request"))
    for view in await views_at(messages, BUDGETS, protected_tool_results=1):
        declared, answered = shown_ids(view)
        assert {"old", "young"} <= declared and {"old", "young"} <= answered


async def test_ids_reused_across_turns(anyio_backend: str) -> None:
    """Providers that reuse ids per turn (``call_0`` every time): each result belongs to
    the latest earlier declaration, and groups still leave whole."""
    messages: list[dict[str, Any]] = [human("first request")]
    for turn in range(6):
        messages.append(calls("openai", ["call_0", "call_1"]))
        messages += results("openai", {"call_1": f"t{turn} b {BIG}", "call_0": f"t{turn} a {BIG}"})
        messages.append(human(f"next {turn}"))
    views = await views_at(messages, BUDGETS, protected_tool_results=1)
    assert sum(1 for m in views[-1] if m.get("tool_calls")) < 6


async def test_growth_cycles_never_orphan(anyio_backend: str) -> None:
    """REFERENCE 48: across 15 growth-and-request cycles in rotating formats, every view
    pairs calls and results both ways."""
    manager = SimpleContextManager(max_tokens=4_000, protected_tool_results=1)
    admitted: list[dict[str, Any]] = []

    async def add(message: dict[str, Any]) -> None:
        admitted.append(message)
        await manager.add_message(copy.deepcopy(message))

    await add(human("first request"))
    for cycle in range(15):
        fmt = FORMATS[cycle % 3]
        ids = [f"g{cycle}a", f"g{cycle}b"]
        await add(calls(fmt, ids))
        for message in results(fmt, {ids[1]: f"b {BIG}", ids[0]: f"a {BIG}"}):
            await add(message)
        await add(human(f"request {cycle}"))
        view = await manager.get_messages_for_request()
        check_view_invariants(admitted, view, truncate_chars=manager.truncate_chars)
        declared, answered = shown_ids(view)
        assert declared == answered
    assert manager._removed_seqs


async def test_human_text_next_to_results_is_never_removed(anyio_backend: str) -> None:
    """A user message with tool_result blocks *and* human text is a human turn: a removal
    pass may not drop it (it cannot be stubbed either, its content is a list).

    Regression: this suite found the group removal taking the human turn with it."""
    mixed = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": BIG},
            {"type": "text", "text": "MIDDLE HUMAN: also, please rename the module"},
        ],
    }
    messages: list[dict[str, Any]] = [
        human("first request"),
        calls("anthropic", ["t1"], text="let me look"),
        mixed,
        {"role": "assistant", "content": f"answer {BIG}"},
    ]
    for turn in range(6):
        messages += [human(f"q{turn} {BIG}"), {"role": "assistant", "content": f"a {BIG}"}]
    messages.append(human("latest request"))
    for view in await views_at(messages, [3_000], protected_tool_results=0):
        assert any("MIDDLE HUMAN" in str(m) for m in view)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_result_of_a_reference_only_call_is_an_orphan(anyio_backend: str, fmt: str) -> None:
    """A call that never reaches a view (its row is ``amplifier_public_reference_only``)
    answers nothing: its results must not appear in a view either.

    Regression: this suite found such results reaching views without their call."""
    hidden = calls(fmt, ["c1"])
    hidden["metadata"] = {"amplifier_public_reference_only": True}
    messages = [human("first"), hidden, *results(fmt, {"c1": "result"}), human("next")]
    (view,) = await views_at(messages, [40_000])
    assert "result" not in str(view)


def test_history_links_groups_and_tracks_unanswered_calls() -> None:
    """``History`` links results to the latest earlier declaration of their id (any
    format) and tracks which calls are still unanswered."""
    history = History()
    admitted = [
        human("q"),
        calls("openai", ["o1", "o2"]),
        *results("openai", {"o2": "b"}),
        calls("anthropic", ["a1"]),
        *results("anthropic", {"a1": "x"}),
        *results("openai", {"o1": "a"}),
        *results("openai", {"nobody": "orphan"}),
    ]
    entries = [
        history.admit(m, max_tool_result_bytes=131_072, stamp_time=False)[0] for m in admitted
    ]
    assert history.group_of(2) == history.group_of(5) == history.group_of(1) == 1
    assert history.group_of(4) == history.group_of(3) == 3
    assert history.group_of(6) == 6 and entries[6].public is None
    assert not any(history.unanswered.values())
    history.admit(calls("amplifier", ["m1", "m2"]), max_tool_result_bytes=131_072, stamp_time=False)
    assert history.unanswered[7] == {"m1", "m2"}
