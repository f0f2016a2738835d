"""Tool groups are linked by id, in every format, never by adjacency (docs/design.md sections 3.2 and 6.1).

A call's results are those admitted before the next assistant message (its run). A view
never contains a result without its call, nor (except an unanswered tail) a call without
all of its results: a call a later assistant turn left unanswered is answered by
synthesized results after its recorded results; a view shows results right after their call, the
other messages of the run after them; a group leaves a view as one unit; orphan results
(never called, called in an earlier run, admitted before their call) never appear.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.history.history import History, synthesized_marker
from amplifier_module_context_simple.testing import (
    call_ids,
    check_view_invariants,
    result_ids,
)
from tests.context.strategies import FORMATS, calls, results, synthesized_for

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
FLOOR_BUDGETS = BUDGETS[:-1]
"""Budgets the protected floor fits: below it (100) the manager reduces the floor itself
(``Ladder.reducing_floor``: protected results truncated, whole groups removed oldest first)."""


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
    """Messages admitted between a call and its (split, reordered) results do not break
    pairing: the group is found by id, not by position, and the view shows the results
    right after their call, the reminder and developer note after them (new semantics:
    both providers reject anything between a call and its results)."""
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
    views = await views_at(messages, BUDGETS, protected_tool_results=1)
    # each round: call, first result, second result, reminder, developer note
    display = [0]
    for turn in range(5):
        start = 1 + 5 * turn
        display += [start, start + 1, start + 4, start + 2, start + 3]
    display.append(len(messages) - 1)
    assert views[0] == [messages[i] for i in display]
    for view in views:
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
async def test_partly_answered_call_gets_a_synthesized_result(anyio_backend: str, fmt: str) -> None:
    """The existing module's case, with our semantics: an assistant that declared A and B with only A
    answered, followed by later assistant turns, is shown with a synthesized error result
    for B after A's recorded result, and the group (call, A, synthesized B) is then
    complete: pressure removes it as one unit, never a part of it."""
    messages: list[dict[str, Any]] = [
        human("first request"),
        calls(fmt, ["A", "B"], text=f"two calls {BIG}"),
        *results(fmt, {"A": f"A done {BIG}"}),
    ]
    for turn in range(6):
        messages += [human(f"follow-up {turn} {BIG}"), {"role": "assistant", "content": BIG}]
    messages.append(human("latest request"))
    views = await views_at(messages, BUDGETS, protected_tool_results=0)
    assert views[0][:4] == [messages[0], messages[1], messages[2], *synthesized_for(fmt, ["B"])]
    assert views[0][4:] == messages[3:]
    for view in views[1:]:
        assert shown_ids(view) == (set(), set())


@pytest.mark.parametrize("fmt", FORMATS)
async def test_protected_zone_keeps_all_parallel_results(anyio_backend: str, fmt: str) -> None:
    """(docs/design.md section 4.1) An assistant with 6 calls whose 6 results are in the protected zone
    keeps all 6 results, in every view whose budget the protected floor fits."""
    messages = tool_turns(fmt, 3)
    ids = [f"p{k}" for k in range(6)]
    messages[-1:-1] = [calls(fmt, ids), *results(fmt, {i: f"{i} short" for i in ids})]
    for view in await views_at(messages, FLOOR_BUDGETS, protected_tool_results=6):
        declared, answered = shown_ids(view)
        assert set(ids) <= declared and set(ids) <= answered


@pytest.mark.parametrize("fmt", FORMATS)
async def test_protected_sibling_result_vetoes_group_removal(anyio_backend: str, fmt: str) -> None:
    """A group one of whose results is among the last ``protected_tool_results`` results
    is kept whole, even when its other result was admitted long before (many turns with no
    assistant message in between, so both results belong to the call's run), in every view
    whose budget the protected floor fits."""
    messages: list[dict[str, Any]] = [human("first request"), calls(fmt, ["old", "young"])]
    messages += results(fmt, {"old": f"old {BIG}"})
    for turn in range(6):
        messages += [
            human(f"turn {turn} {BIG}"),
            {"role": "user", "content": f"hook note {turn} {BIG}", "metadata": {"source": "hook"}},
        ]
    messages += results(fmt, {"young": "young, protected"})
    messages.append(human("latest request"))
    for view in await views_at(messages, FLOOR_BUDGETS, protected_tool_results=1):
        declared, answered = shown_ids(view)
        assert declared == answered == {"old", "young"}


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_result_after_a_later_assistant_turn_is_an_orphan(
    anyio_backend: str, fmt: str
) -> None:
    """New semantics: a result admitted after a later assistant message answers nothing
    (its call's run is closed): it never reaches a view, and the call's missing id is
    answered by a synthesized result after the results its run did record."""
    messages: list[dict[str, Any]] = [human("first request"), calls(fmt, ["old", "young"])]
    messages += results(fmt, {"old": "old result"})
    messages += [human("turn"), {"role": "assistant", "content": "an answer"}]
    late = results(fmt, {"young": "young, too late"})
    messages += [*late, human("latest request")]
    (view,) = await views_at(messages, [40_000])
    assert view == [*messages[:3], *synthesized_for(fmt, ["young"]), *messages[3:-2], messages[-1]]


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
    """(docs/design.md section 3.2) Across 15 growth-and-request cycles in rotating formats, every view
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
    assert manager.observable_state().removed


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
    """``History`` links a result to the open run's call of its id (any format); the next
    assistant message closes a run, so a result admitted after it is an orphan and the
    call's unanswered id gets synthesized results placed after the run's results; a run open
    at the end is a pending tail (new semantics: runs, not "the latest declaration")."""
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
    assert history.group_of(2) == history.group_of(1) == 1
    assert history.group_of(4) == history.group_of(3) == 3
    assert history.group_of(5) == 5 and entries[5].public is None
    assert history.group_of(6) == 6 and entries[6].public is None
    assert history.unanswered == {1: {"o1"}}  # 3 is answered: it has no entry
    assert list(history.synthesized) == [1]
    assert history.synthesized[1].call_ids == ("o1",) and history.synthesized[1].closed_at == 3
    assert list(history.order) == [0, 1, 2, synthesized_marker(1), 3, 4]
    history.admit(calls("amplifier", ["m1", "m2"]), max_tool_result_bytes=131_072, stamp_time=False)
    assert history.unanswered[7] == {"m1", "m2"} and 7 not in history.synthesized


@pytest.mark.parametrize("fmt", FORMATS)
async def test_list_content_results_shrink_to_text_blocks(anyio_backend: str, fmt: str) -> None:
    """A result whose content is a list of blocks (text and an image) - a ``tool`` message
    with list content, or a ``tool_result`` block with list content - is reduced to a list
    of text blocks (its image becomes a short text placeholder), traceable to the original
    and valid for both providers; groups of such results still leave whole."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}

    def listed(call_id: str) -> dict[str, Any]:
        content = [{"type": "text", "text": f"{call_id} {BIG}"}, dict(image)]
        if fmt == "anthropic":
            block = {"type": "tool_result", "tool_use_id": call_id, "content": content}
            return {"role": "user", "content": [block]}
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    messages: list[dict[str, Any]] = [human("first request")]
    for turn in range(3):
        call_id = f"r{turn}"
        messages += [calls(fmt, [call_id]), listed(call_id), {"role": "assistant", "content": "ok"}]
    messages.append(human("latest request"))
    roomy, tight = await views_at(messages, [40_000, 1_500], protected_tool_results=1)
    assert roomy == messages
    assert tight[:2] == [messages[0], messages[7]] and tight[3:] == [messages[-1]]
    reduced = tight[2]
    assert reduced["metadata"]["compaction"]["form"] == "truncated"
    blocks = reduced["content"] if fmt != "anthropic" else reduced["content"][0]["content"]
    assert all(block["type"] == "text" for block in blocks)
    assert any("image" in block["text"] and "omitted" in block["text"] for block in blocks)
    check_view_invariants(messages, tight)  # the providers' rules included


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_person_speaking_after_a_call_closes_its_run(anyio_backend: str, fmt: str) -> None:
    """A person's own turn after an unanswered call closes its run (the call was
    interrupted): the call gets a synthesized result and a result admitted afterwards is an
    orphan. A machine-written note does not close it: the call stays a pending tail."""
    note = {"role": "user", "content": "hook note", "metadata": {"source": "hook"}}
    spoken = [human("first request"), calls(fmt, ["a"]), note, human("stop that")]
    spoken += results(fmt, {"a": "too late"})
    (view,) = await views_at(spoken, [40_000])
    assert view == [*spoken[:2], *synthesized_for(fmt, ["a"]), note, spoken[3]]
    pending = [human("first request"), calls(fmt, ["a"]), note]
    (view,) = await views_at(pending, [40_000])
    assert view[:2] == pending[:2] and shown_ids(view) == ({"a"}, set())


async def test_a_turn_answering_calls_begins_with_its_results(anyio_backend: str) -> None:
    """A message answering calls shows its results first, in their order, before its other
    blocks (Anthropic requires it), without a block naming no call and without a second
    block for an id it answered already; a message of nothing but results loses its
    repeated block the same way."""
    typed = {"type": "text", "text": "typed by the person"}
    one = {"type": "tool_result", "tool_use_id": "a", "content": "one"}
    two = {"type": "tool_result", "tool_use_id": "a", "content": "two"}
    anonymous = {"type": "tool_result", "content": "no id"}
    answer_b = {"type": "tool_result", "tool_use_id": "b", "content": "rb"}
    mixed = [
        human("first request"),
        calls("anthropic", ["a", "b"]),
        {"role": "user", "content": [typed, one, two, anonymous, answer_b]},
        human("latest request"),
    ]
    (view,) = await views_at(mixed, [40_000])
    assert view == [*mixed[:2], {"role": "user", "content": [one, answer_b, typed]}, mixed[3]]
    report = check_view_invariants(mixed, view)  # the providers' rules included
    assert report.mapping == (0, 1, 2, 3) and report.pending == set()
    pure = [*mixed[:2], {"role": "user", "content": [one, two, answer_b]}, mixed[3]]
    (view,) = await views_at(pure, [40_000])
    assert view == [*mixed[:2], {"role": "user", "content": [one, answer_b]}, mixed[3]]
    check_view_invariants(pure, view)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_note_is_held_until_its_run_is_answered(anyio_backend: str, fmt: str) -> None:
    """A machine-written note admitted while calls are running is held: a view of a history
    ending with the run pending shows the pending call and not the note (so no note, and no
    notice, ever follows an unanswered call), and once the last result arrives the note is
    shown right after the run's results. A note admitted once nothing is pending is placed
    at the end as usual."""
    note = {"role": "user", "content": "hook note", "metadata": {"source": "hook"}}
    later = {"role": "user", "content": "later note", "metadata": {"source": "hook"}}
    first, second = results(fmt, {"c1": "one", "c2": "two"})
    messages = [human("first request"), calls(fmt, ["c1", "c2"]), first, note]
    manager = SimpleContextManager(compaction_notice_enabled=False)
    await manager.set_messages(copy.deepcopy(messages))
    view = await manager.get_messages_for_request()
    assert view == messages[:3]
    report = check_view_invariants(messages, view)
    assert report.pending == {"c2"} and report.held == {3} and report.mapping == (0, 1, 2)
    for message in (second, later):
        await manager.add_message(copy.deepcopy(message))
        messages.append(message)
    view = await manager.get_messages_for_request()
    assert view == [*messages[:3], second, note, later]
    report = check_view_invariants(messages, view)  # the providers' rules included
    assert report.pending == set() and report.held == set()
    assert report.mapping == (0, 1, 2, 4, 3, 5)
