"""Unit tests of ``amplifier_module_context_simple.testing``: the oracle must accept valid
views and name each broken invariant, in all three tool formats; the fault plan, the
snapshot, the model and the hooks must behave as documented."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.testing import (
    CANCEL,
    ERROR,
    LOADED_TOOL_STATE,
    MUTATION_MARK,
    NATIVE,
    NOTICE_METADATA,
    NOTICE_PREFIX,
    FaultPlan,
    FaultyHooks,
    InjectedFault,
    Prepare,
    Prepared,
    RecordingHooks,
    ReferenceStore,
    Registration,
    Slot,
    SweepFailure,
    ViewInvariantError,
    call_ids,
    check_isolation,
    check_view_invariants,
    display_order,
    faulty_count_view,
    faulty_factory,
    faulty_fit_output,
    freeze,
    is_notice,
    reduced_kind,
    result_ids,
    run_cancelling_after_step,
    snapshot,
    strip_notice,
    sweep,
    tail_is_safe,
)
from tests.reliability.harness import (
    REMINDER,
    amplifier_round,
    anthropic_round,
    envelope,
    openai_call,
    openai_round,
)

ROUNDS = {
    "openai": lambda: openai_round(["c1", "c2"], 50),
    "amplifier": lambda: amplifier_round(["a1", "a2"], 50),
    "anthropic": lambda: anthropic_round(["t1", "t2"], 50, split=True),
}
FORMATS = sorted(ROUNDS)


def conversation(fmt: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "first question"},
        *ROUNDS[fmt](),
        {"role": "assistant", "content": "answer"},
        envelope(),
        {"role": "user", "content": "latest question"},
    ]


def view_of(history: Sequence[Any], *drop: int) -> list[dict[str, Any]]:
    return [copy.deepcopy(m) for i, m in enumerate(history) if i not in drop]


def code_of(history: list[Any], view: Any, **kwargs: Any) -> tuple[int, str]:
    with pytest.raises(ViewInvariantError) as raised:
        check_view_invariants(history, view, **kwargs)
    return raised.value.item, raised.value.code


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_full_view_and_a_whole_group_removed_are_valid(fmt: str) -> None:
    history = conversation(fmt)
    report = check_view_invariants(history, view_of(history), retained=[REMINDER])
    assert report.systems == 1 and report.mapping == tuple(range(1, len(history)))
    calls = [i for i, m in enumerate(history) if m.get("role") == "assistant"][:1]
    group = calls + list(range(calls[0] + 1, calls[0] + 3))
    check_view_invariants(history, view_of(history, *group))


@pytest.mark.parametrize("fmt", FORMATS)
def test_pairing_is_checked_by_id_both_ways(fmt: str) -> None:
    history = conversation(fmt)
    call = 2
    assert code_of(history, view_of(history, call)) == (1, "result-without-call")
    assert code_of(history, view_of(history, call + 2)) == (1, "call-without-results")
    # a result moved before its call is an orphan in the history: never in a view
    swapped = view_of(history)
    swapped[call], swapped[call + 1] = swapped[call + 1], swapped[call]
    assert code_of(history, swapped)[0] == 1


def test_a_pending_call_may_be_shown_without_results() -> None:
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "p1", "tool": "x"}]},
    ]
    assert check_view_invariants(history, view_of(history)).pending == {"p1"}


def in_order(history: Sequence[Any], *order: int) -> list[dict[str, Any]]:
    """Copies of ``history[i]`` for ``i`` in ``order``."""
    return [copy.deepcopy(history[i]) for i in order]


def test_results_split_around_another_message_pair_by_id() -> None:
    """A message admitted between a call's results is shown after them (display order),
    never between: the view in admission order is out of order (new semantics: views follow
    the providers' tool-use rules, results right after their call)."""
    history = [
        {"role": "user", "content": "go"},
        *openai_round(["c1", "c2"], 40)[:2],
        {"role": "user", "content": "machine note", "metadata": {"source": "hook"}},
        openai_round(["c1", "c2"], 40)[2],
        {"role": "user", "content": "latest"},
    ]
    report = check_view_invariants(history, in_order(history, 0, 1, 2, 4, 3, 5))
    assert report.mapping == (0, 1, 2, 4, 3, 5)
    assert code_of(history, view_of(history)) == (3, "out-of-order")
    # adjacency would drop the call with its neighbour and keep the far result
    assert code_of(history, in_order(history, 0, 4, 3, 5)) == (1, "result-without-call")
    assert code_of(history, in_order(history, 0, 1, 2, 3, 5)) == (1, "call-without-results")


@pytest.mark.parametrize(
    ("result", "code"),
    [
        ({"role": "tool", "content": "x"}, "result-without-id"),
        ({"role": "tool", "tool_call_id": 3, "content": "x"}, "result-without-id"),
        (
            {"role": "user", "content": [{"type": "tool_result", "content": "x"}]},
            "result-without-id",
        ),
        ({"role": "tool", "tool_call_id": "nobody", "content": "x"}, "result-without-call"),
    ],
)
def test_results_without_a_valid_call(result: dict[str, Any], code: str) -> None:
    history = [{"role": "user", "content": "a"}, result, {"role": "user", "content": "b"}]
    assert code_of(history, view_of(history)) == (1, code)


@pytest.mark.parametrize("fmt", FORMATS)
def test_order_invention_and_leaks(fmt: str) -> None:
    history = conversation(fmt)
    late = view_of(history)
    late.append(late.pop(0))
    assert code_of(history, late) == (3, "system-late")
    swapped = view_of(history)
    swapped[-1], swapped[-2] = swapped[-2], swapped[-1]
    assert code_of(history, swapped) == (3, "out-of-order")
    invented = view_of(history)
    invented.insert(-1, {"role": "assistant", "content": "never said"})
    assert code_of(history, invented) == (4, "invented")
    leaking = view_of(history)
    leaking[1]["metadata"] = {"_seq": 1}
    assert code_of(history, leaking) == (4, "bookkeeping-leak")


@pytest.mark.parametrize("fmt", FORMATS)
def test_protected_content(fmt: str) -> None:
    history = conversation(fmt)
    assert code_of(history, view_of(history, len(history) - 1))[0] == 2  # latest human
    assert code_of(history, view_of(history, 1)) == (2, "protected")  # first human
    assert code_of(history, view_of(history, 0)) == (2, "systems")
    envelope_at = len(history) - 2
    assert code_of(history, view_of(history, envelope_at), retained=[REMINDER]) == (
        2,
        "protected",
    )
    assert code_of(history, view_of(history), retained=["not admitted"])[1] == "retained-missing"
    factory = [{"role": "system", "content": "factory"}, *view_of(history)[1:]]
    check_view_invariants(history, factory, factory_text="factory")
    assert code_of(history, factory)[1] == "systems"


def test_reduced_forms_and_the_notice() -> None:
    history = [
        {"role": "user", "content": "first " * 40},
        *openai_round(["c1"], 900),
        {"role": "user", "content": "latest"},
    ]
    view = view_of(history)
    tokens = estimate_message(history[2])
    view[2] = {**view[2], "content": "[truncated] " + history[2]["content"][:40] + "…"}
    view[2]["metadata"] = {"compaction": {"form": "truncated", "original_tokens": tokens}}
    report = check_view_invariants(history, view, truncate_chars=40)
    assert (report.reduced, report.truncated, report.stubbed) == ((2,), 1, 0)
    assert code_of(history, view, truncate_chars=80) == (4, "invented")
    miscounted = copy.deepcopy(view)
    miscounted[2]["metadata"]["compaction"]["original_tokens"] = tokens + 1
    assert code_of(history, miscounted, truncate_chars=40) == (4, "invented")
    grown = copy.deepcopy(view)
    grown[2]["content"] = history[2]["content"] + " [truncated]"  # a "reduction" that grew
    assert code_of(history, grown, truncate_chars=40) == (4, "invented")
    assert check_view_invariants(history, [*view, NOTICE]).notice
    pending = [*history, {"role": "assistant", "content": "", "tool_calls": [{"id": "p"}]}]
    assert code_of(pending, [*view_of(pending), NOTICE]) == (3, "notice-unsafe")
    # only the module's own notice: exact metadata, text opening with its marker
    unmarked = {**NOTICE, "content": "<system-reminder>condensed</system-reminder>"}
    assert code_of(history, [*view, unmarked]) == (4, "invented")
    tagged = {**NOTICE, "metadata": {**NOTICE_METADATA, "extra": 1}}
    assert code_of(history, [*view, tagged]) == (4, "invented")


NOTICE: dict[str, Any] = {
    "role": "user",
    "content": f"{NOTICE_PREFIX}condensed</system-reminder>",
    "metadata": dict(NOTICE_METADATA),
}


# -- the providers' tool-use rules: runs, display order, synthesized results ----------------

NO_RESULT = "[No result was recorded for this call of `read`.]"


def synthesized(fmt: str, *ids: str) -> list[dict[str, Any]]:
    """The synthesized results a view owes for ``ids`` of a call in ``fmt``."""
    if fmt == "anthropic":
        blocks = [
            {"type": "tool_result", "tool_use_id": i, "is_error": True, "content": NO_RESULT}
            for i in ids
        ]
        note = {"compaction": {"form": "synthesized", "tool_call_ids": list(ids)}}
        return [{"role": "user", "content": blocks, "metadata": note}]
    return [
        {
            "role": "tool",
            "tool_call_id": i,
            "content": NO_RESULT,
            "metadata": {"compaction": {"form": "synthesized", "tool_call_ids": [i]}},
        }
        for i in ids
    ]


def half_answered(fmt: str) -> list[dict[str, Any]]:
    """A call of two ids, one answered, then a later assistant turn (it closes the run)."""
    call, *answers = ROUNDS[fmt]()
    return [
        {"role": "user", "content": "first question"},
        call,
        answers[0],
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "latest question"},
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_synthesized_results_are_owed_after_the_recorded_ones(fmt: str) -> None:
    """A call left unanswered when a later assistant turn closes its run must be answered
    by exactly the synthesized results of its format, after the results its run recorded
    (never before them), and they travel with the call."""
    history = half_answered(fmt)
    (missing,) = set(call_ids_of(history[1])) - set(result_ids_of(history[2]))
    owed = synthesized(fmt, missing)
    view = [*view_of(history)[:3], *owed, *view_of(history)[3:]]
    report = check_view_invariants(history, view)
    assert report.synthesized == {missing} and report.mapping == (0, 1, 2, 3, 4)
    assert code_of(history, view_of(history)) == (1, "call-without-results")
    early = [*view_of(history)[:2], *owed, *view_of(history)[2:]]
    assert code_of(history, early) == (3, "out-of-order")
    wrong = copy.deepcopy(view)
    if fmt == "anthropic":
        wrong[3]["content"][0]["is_error"] = False
    else:
        wrong[3]["metadata"]["compaction"]["form"] = "truncated"
    assert code_of(history, wrong) == (4, "invented")
    alone = [view[0], *owed, *view_of(history)[3:]]
    assert code_of(history, alone) == (1, "result-without-call")
    pending = history[:3]  # no later turn: a pending tail, nothing is owed
    assert code_of(pending, [*view_of(pending)[:2], *owed, view_of(pending)[2]]) == (
        4,
        "invented",
    )
    assert check_view_invariants(pending, view_of(pending)).pending == {missing}


def result_ids_of(message: dict[str, Any]) -> list[str]:
    if message["role"] == "tool":
        return [message["tool_call_id"]]
    return [b["tool_use_id"] for b in message["content"] if b.get("type") == "tool_result"]


def call_ids_of(message: dict[str, Any]) -> list[str]:
    calls = [c["id"] for c in message.get("tool_calls") or []]
    content = message.get("content")
    if isinstance(content, list):
        calls += [b["id"] for b in content if b.get("type") == "tool_use"]
    return calls


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_result_after_the_run_closed_is_an_orphan(fmt: str) -> None:
    """A result admitted after a later assistant turn (or before its call) answers
    nothing: showing it is a result outside its call's run."""
    call, first, second = ROUNDS[fmt]()
    history = [
        {"role": "user", "content": "go"},
        call,
        first,
        {"role": "assistant", "content": "answer"},
        second,
        {"role": "user", "content": "latest"},
    ]
    (missing,) = set(call_ids_of(call)) - set(result_ids_of(first))
    good = [*view_of(history)[:3], *synthesized(fmt, missing), *view_of(history, 4)[3:]]
    check_view_invariants(history, good)
    assert code_of(history, view_of(history)) == (1, "call-without-results")
    shown_late = [*good[:-1], copy.deepcopy(second), good[-1]]
    assert code_of(history, shown_late) == (1, "result-without-call")
    early = [history[0], second, call, first, history[3], history[5]]
    assert code_of(early, [copy.deepcopy(m) for m in early]) == (1, "result-without-call")


def test_a_person_speaking_closes_the_run() -> None:
    """A person's own turn after a call closes its run (the call gets synthesized results);
    a machine-written note does not (the call stays a pending tail). New semantics: the
    note is then *held* (admitted while ``p1`` is running, the history ends first), so the
    valid view is the pending tail without it, and showing it is ``held-note``."""
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "p1", "tool": "x"}]}
    spoken = [{"role": "user", "content": "go"}, call, {"role": "user", "content": "stop"}]
    view = [*view_of(spoken)[:2], *synthesized("amplifier", "p1"), view_of(spoken)[2]]
    assert check_view_invariants(spoken, view).synthesized == {"p1"}
    assert code_of(spoken, view_of(spoken)) == (1, "synthesized-missing")
    note = {"role": "user", "content": "hook note", "metadata": {"source": "hook"}}
    noted = [spoken[0], call, note]
    report = check_view_invariants(noted, view_of(noted, 2))
    assert report.pending == {"p1"} and report.held == {2} and report.mapping == (0, 1)
    assert code_of(noted, view_of(noted)) == (3, "held-note")


def test_the_notice_never_follows_an_unanswered_call() -> None:
    """No notice in a view that leaves a call unanswered, with or without the note admitted
    after the call (new semantics: that note is held, so the valid view ends with the
    pending call itself - a notice after it is still unsafe)."""
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "p1", "tool": "x"}]},
        {"role": "user", "content": "hook note", "metadata": {"source": "hook"}},
    ]
    assert code_of(history, [*view_of(history), NOTICE]) == (3, "notice-unsafe")
    assert code_of(history, [*view_of(history, 2), NOTICE]) == (3, "notice-unsafe")


def test_result_carriers_are_tidied() -> None:
    """A block list keeps only the results that answer the open run - no block without an
    id, no second block for an id the message answered already - and shows them first, in
    their order, before its other blocks (Anthropic: a turn answering calls begins with
    its results)."""
    call = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "a", "name": "f", "input": {}},
            {"type": "tool_use", "id": "b", "name": "f", "input": {}},
        ],
    }
    typed = {"type": "text", "text": "typed"}
    one = {"type": "tool_result", "tool_use_id": "a", "content": "one"}
    two = {"type": "tool_result", "tool_use_id": "a", "content": "two"}
    anonymous = {"type": "tool_result", "content": "no id"}
    answer_b = {"type": "tool_result", "tool_use_id": "b", "content": "rb"}
    mixed = {"role": "user", "content": [typed, one, two, anonymous, answer_b]}
    history = [{"role": "user", "content": "q"}, call, mixed, {"role": "user", "content": "latest"}]
    tidy = {"role": "user", "content": [one, answer_b, typed]}
    view = [*view_of(history)[:2], copy.deepcopy(tidy), view_of(history)[3]]
    report = check_view_invariants(history, view)
    assert report.mapping == (0, 1, 2, 3) and report.pending == frozenset()
    as_given = view_of(history)
    assert code_of(history, as_given) == (1, "duplicate-result")
    unsorted = [*view[:2], {"role": "user", "content": [typed, one, answer_b]}, view[3]]
    assert code_of(history, unsorted) == (4, "invented")
    twice = [*view[:2], {"role": "user", "content": [one, two, answer_b, typed]}, view[3]]
    assert code_of(history, twice) == (1, "duplicate-result")
    pure = [history[0], call, {"role": "user", "content": [one, two, answer_b]}, history[3]]
    view = [*view_of(pure)[:2], {"role": "user", "content": [one, answer_b]}, view_of(pure)[3]]
    assert check_view_invariants(pure, view).mapping == (0, 1, 2, 3)


def test_notes_are_held_while_calls_are_running() -> None:
    """A note admitted while the open run has calls without results (a hook's message, an
    envelope, a developer message) is held: never shown while the run is pending - a
    retained envelope held is then allowed to be absent - and shown after the run's
    results once the run is answered completely (or closed: after the synthesized results,
    before the closing turn). A note admitted once nothing is pending is placed as usual."""
    call, first, second = openai_round(["c1", "c2"], 20)  # c2 answered first
    hook = {"role": "user", "content": "hook note", "metadata": {"source": "hook"}}
    developer = {"role": "developer", "content": "developer note"}
    go = {"role": "user", "content": "go"}
    pending = [go, call, first, hook, envelope()]
    report = check_view_invariants(pending, view_of(pending, 3, 4), retained=[REMINDER])
    assert report.pending == {"c1"} and report.held == {3, 4} and report.mapping == (0, 1, 2)
    assert code_of(pending, view_of(pending, 4)) == (3, "held-note")
    assert code_of(pending, view_of(pending, 3)) == (3, "held-note")
    answered = [*pending, second, developer]
    view = in_order(answered, 0, 1, 2, 5, 3, 4, 6)
    report = check_view_invariants(answered, view, retained=[REMINDER])
    assert report.held == frozenset() and report.mapping == (0, 1, 2, 5, 3, 4, 6)
    assert code_of(answered, view_of(answered)) == (3, "out-of-order")
    no_envelope = in_order(answered, 0, 1, 2, 5, 3, 6)  # released: must be shown now
    assert code_of(answered, no_envelope, retained=[REMINDER]) == (2, "protected")
    closed = [go, call, first, hook, {"role": "assistant", "content": "moving on"}]
    view = [*in_order(closed, 0, 1, 2), *synthesized("openai", "c1"), *in_order(closed, 3, 4)]
    report = check_view_invariants(closed, view)
    assert report.synthesized == {"c1"} and report.mapping == (0, 1, 2, 3, 4)
    early = [*view[:3], copy.deepcopy(hook), view[3], view[5]]
    assert code_of(closed, early) == (3, "out-of-order")


def test_duplicate_results_and_reused_ids() -> None:
    """A second result for an answered id is an orphan; an id declared again is shown
    renamed ``<id>~2`` in its call and results, with the ``renamed_tool_call_ids`` note."""
    call, answer = openai_round(["c1"], 20)
    history = [{"role": "user", "content": "go"}, call, answer, answer, call, answer]
    view = view_of(history, 3)
    assert code_of(history, view) == (3, "out-of-order")  # the reused id is not renamed
    renamed_call = copy.deepcopy(call)
    renamed_call["tool_calls"][0]["id"] = "c1~2"
    renamed_call["metadata"] = {"renamed_tool_call_ids": {"c1~2": "c1"}}
    renamed_answer = {**copy.deepcopy(answer), "tool_call_id": "c1~2"}
    renamed_answer["metadata"] = {"renamed_tool_call_ids": {"c1~2": "c1"}}
    check_view_invariants(history, [*view[:3], renamed_call, renamed_answer])
    twice = [*view[:2], copy.deepcopy(answer), copy.deepcopy(answer)]
    assert code_of(history, twice) == (1, "duplicate-result")


def test_reduced_list_content_and_protected_forms() -> None:
    """Truncated results with block-list content (a ``tool`` message, a ``tool_result``
    block) are traced to their original; the last-resort form of a protected result
    (``"protected": True``) may keep less than ``truncate_chars``."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    long = "lorem ipsum " * 40
    listed = {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [{"type": "text", "text": long}, image],
    }
    blocks: dict[str, Any] = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [image, {"type": "text", "text": long}],
            }
        ],
    }
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "tool": "x"}]},
        listed,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "g", "input": {}}],
        },
        blocks,
        {"role": "user", "content": "latest"},
    ]
    note: dict[str, dict[str, Any]] = {
        "compaction": {"form": "truncated", "original_tokens": estimate_message(listed)}
    }
    short_listed = {
        **listed,
        "content": [
            {"type": "text", "text": f"[truncated] {long[:40]}…"},
            {"type": "text", "text": "[image omitted]"},
        ],
        "metadata": note,
    }
    inner = [
        {"type": "text", "text": "[truncated]"},
        {"type": "text", "text": "[image omitted]"},
        {"type": "text", "text": long[:40] + "…"},
    ]
    short_blocks = {
        **blocks,
        "content": [{**blocks["content"][0], "content": inner}],
        "metadata": {
            "compaction": {**note["compaction"], "original_tokens": estimate_message(blocks)}
        },
    }
    view = [
        *view_of(history)[:2],
        short_listed,
        view_of(history)[3],
        short_blocks,
        view_of(history)[5],
    ]
    assert check_view_invariants(history, view, truncate_chars=40).reduced == (2, 4)
    assert code_of(history, view, truncate_chars=80) == (4, "invented")
    kept_image = {**short_listed, "content": [*short_listed["content"], {**image, "data": "y"}]}
    assert code_of(history, [*view[:2], kept_image, *view[3:]], truncate_chars=40)[0] == 4
    protected = {
        **listed,
        "content": [{"type": "text", "text": f"[shortened] {long[:10]}…"}],
        "metadata": {"compaction": {**note["compaction"], "protected": True}},
    }
    check_view_invariants(history, [*view[:2], protected, *view[3:]], truncate_chars=40)
    unmarked = {**protected, "metadata": note}
    assert code_of(history, [*view[:2], unmarked, *view[3:]], truncate_chars=40) == (4, "invented")


def test_serialisation_isolation_and_canonical() -> None:
    history = conversation("openai")
    broken = view_of(history)
    broken[1]["extra"] = object()
    assert code_of(history, broken) == (9, "json")
    shared = view_of(history)
    shared[1] = history[1]
    assert code_of(history, shared) == (7, "shared-dict")
    twice = view_of(history)
    twice.insert(2, twice[1])  # the same dict twice: isolation is checked before order
    assert code_of(history, twice) == (7, "repeated-dict")
    changed = copy.deepcopy(history)
    changed[1]["content"] = "edited"
    assert code_of(history, view_of(history), canonical=changed) == (6, "canonical-changed")
    assert code_of(history, "not a list") == (4, "not-a-list")


@pytest.mark.anyio
@pytest.mark.parametrize("via_add", [False, True])
async def test_views_check_against_the_stored_history(via_add: bool, anyio_backend: str) -> None:
    """With ``get_messages()`` as the history (``_seq``, stamped timestamps) views still pass."""
    history = conversation("anthropic")
    manager = SimpleContextManager()
    if via_add:
        for message in history:
            await manager.add_message(message)
    else:
        await manager.set_messages(history)
    view = await manager.get_messages_for_request()
    stored = await manager.get_messages()
    check_view_invariants(stored, view, canonical=await manager.get_messages())
    check_view_invariants(history, view)


# -- the fault plan and the seams ---------------------------------------------------------------


@pytest.mark.anyio
async def test_a_fault_plan_counts_and_fires(anyio_backend: str) -> None:
    plan = FaultPlan(2, ERROR, persistent=True, always={"emit:x": ERROR})
    await plan.hit("a")
    with pytest.raises(InjectedFault) as raised:
        await plan.hit("b")
    assert (raised.value.label, raised.value.hit) == ("b", 2)
    with pytest.raises(InjectedFault):
        await plan.hit("c")
    assert plan.labels == ["a", "b", "c"] and plan.fired_label == "b"
    assert plan.last_fired_label == "c"
    plan.disarm()
    await plan.hit("d")
    assert plan.hits == 3
    plan.arm()
    with pytest.raises(InjectedFault):
        await plan.hit("emit:x")
    with pytest.raises(ValueError, match="kind"):
        FaultPlan(1, "explode")
    with pytest.raises(ValueError, match="fail_at"):
        FaultPlan(-1)


@pytest.mark.anyio
async def test_a_cancelling_plan_cancels_its_scope(anyio_backend: str) -> None:
    plan = FaultPlan(1, CANCEL)
    with pytest.raises(RuntimeError, match="CancelScope"):
        plan.hit_nowait("a")
    plan = FaultPlan(1, CANCEL)
    with anyio.CancelScope() as scope:
        plan.scope = scope
        await plan.hit("a")
        pytest.fail("not cancelled")
    assert scope.cancelled_caught and plan.fired == [(1, "a", CANCEL)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_native_cancellation_needs_asyncio(anyio_backend: str) -> None:
    with pytest.raises(RuntimeError, match="asyncio"):
        await FaultPlan(1, NATIVE).hit("a")


@pytest.mark.anyio
async def test_seam_wrappers_and_hooks(anyio_backend: str) -> None:
    plan = FaultPlan()

    async def count(view: list[dict[str, Any]]) -> Any:
        await anyio.lowlevel.checkpoint()
        return len(view)

    async def fit(view: list[dict[str, Any]], attempt: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        return attempt

    assert await faulty_count_view(plan, count)([{}]) == 1
    assert await faulty_fit_output(plan, fit)([], 7) == 7
    assert await faulty_factory(plan, "p")() == "p"
    hooks = FaultyHooks(FaultPlan(2, ERROR))
    await hooks.emit("one", {"n": 1})
    with pytest.raises(InjectedFault):
        await hooks.emit("two", {})
    assert hooks.started == ["one", "two"] and hooks.interrupted == ["two"]
    assert hooks.named("one") == [{"n": 1}]
    assert plan.labels == ["count_view", "fit_output", "factory"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_step_canceller_reaches_every_checkpoint(anyio_backend: str) -> None:
    async def three_checkpoints() -> str:
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        return "done"

    outcomes = []
    for k in range(1, 10):
        run = await run_cancelling_after_step(k, three_checkpoints)
        outcomes.append((run.cancelled, run.returned))
        if run.steps < k:
            break
    assert outcomes == [(True, False)] * 4 + [(False, True)]


# -- snapshots and the model -------------------------------------------------------------------


def test_freeze_is_exact() -> None:
    assert freeze({"a": [1, {"b": 2}]}) == freeze({"a": [1, {"b": 2}]})
    assert freeze({"a": 1, "b": 2}) == freeze({"b": 2, "a": 1})
    assert freeze({"a": True}) != freeze({"a": 1})
    assert freeze({"a": 1.0}) != freeze({"a": 1})
    assert freeze([math.nan]) == freeze([math.nan])
    assert freeze({"a": [1]}) != freeze({"a": {"0": 1}})


@pytest.mark.anyio
async def test_snapshots_compare_values_and_objects(anyio_backend: str) -> None:
    manager = SimpleContextManager(protected_tool_results=1)
    await manager.set_messages(conversation("openai") * 4)
    before = snapshot(manager)
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)
    await manager.get_messages_for_request(token_budget=300)
    after = snapshot(manager)
    assert after != before and not after.identical(before)
    values = ["version", "removed", "level", "overrides", "floor_reported", "stats", "meter"]
    values += ["floor", "budget_mark"]  # (a floor above the target was reported)
    assert after.differences(before, objects=False) == values
    assert after.differences(before) == [*values, "decisions_ref", "stats_ref", "meter_ref"]


@pytest.mark.anyio
async def test_the_reference_store_models_admission(anyio_backend: str) -> None:
    manager = SimpleContextManager()
    model = ReferenceStore()
    history = conversation("amplifier")
    await manager.set_messages(history)
    model.set(history)
    model.check(manager)
    message = {"role": "user", "content": "more", "metadata": {"k": 1}}
    await manager.add_message(message)
    model.add(message)
    model.check(manager)
    await manager.add_message({"role": "user", "content": "timed", "metadata": {"timestamp": "t"}})
    assert model.mismatches(manager.messages)  # the model has not seen it
    model.add({"role": "user", "content": "timed", "metadata": {"timestamp": "t"}})
    model.check(manager)
    await manager.clear()
    model.clear()
    model.check(manager)
    model.note_commit()
    with pytest.raises(AssertionError, match="version"):
        model.check(manager)


# -- the package's other helpers ---------------------------------------------------------------


@pytest.mark.anyio
async def test_recording_hooks_record_registrations_and_deliveries(anyio_backend: str) -> None:
    seen: list[str] = []
    inner = RecordingHooks()
    hooks = RecordingHooks(lambda event, data: seen.append(event), inner=inner)

    async def handler(event: str, data: dict[str, Any]) -> None:
        await anyio.lowlevel.checkpoint()

    unregister = hooks.register("llm:response", handler, 50, "meter")
    assert hooks.registrations == [Registration("llm:response", handler, 50, "meter")]
    assert inner.registrations == hooks.registrations  # forwarded
    unregister()
    unregister()
    assert (hooks.unregistered, inner.unregistered) == (2, 2)
    await hooks.emit("one", {"n": 1})
    assert hooks.events == inner.events == [("one", {"n": 1})] and seen == ["one"]

    class Failing:
        async def emit(self, event: str, data: dict[str, Any]) -> None:
            await anyio.lowlevel.checkpoint()
            raise RuntimeError(event)

    failing = RecordingHooks(inner=Failing())
    with pytest.raises(RuntimeError, match="two"):
        await failing.emit("two", {})
    assert failing.failed == ["two"] and failing.interrupted == ["two"]
    assert failing.emitted == [("two", {})] and failing.events == []


def test_the_message_helpers() -> None:
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "g", "input": {}}],
        "tool_calls": [{"id": "c1", "tool": "x"}],
    }
    results = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}
    tool: dict[str, Any] = {"role": "tool", "tool_call_id": "c1", "content": "r"}
    assert call_ids(call) == ["c1", "t1"] and result_ids(results) == ["t1"]
    assert result_ids(tool) == ["c1"] and call_ids(tool) == []
    assert not tail_is_safe([call, tool]) and tail_is_safe([call, tool, results])
    assert is_notice(NOTICE) and strip_notice([tool, NOTICE]) == [tool]
    assert strip_notice([tool]) == [tool]
    stub = {"role": "user", "content": "x", "metadata": {"compaction": {"form": "stubbed"}}}
    assert reduced_kind(stub) == "stubbed" and reduced_kind(tool) is None


def test_the_display_order_puts_results_and_synthesized_ones_after_their_call() -> None:
    call, first, second = openai_round(["c1", "c2"], 20)
    note = {"role": "user", "content": "note", "metadata": {"source": "hook"}}
    history = [
        {"role": "user", "content": "go"},
        call,
        note,
        first,
        {"role": "user", "content": "x"},
    ]
    assert display_order(history) == [
        Slot(0),
        Slot(1),
        Slot(3),
        Slot(1, ("c1",)),  # c2 answered, c1 owed a synthesized result once the person spoke
        Slot(2),
        Slot(4),
    ]
    assert second["tool_call_id"] == "c1"


def test_the_oracle_checks_the_budget_and_loaded_tool_state() -> None:
    loaded = {
        "role": "user",
        "content": "tools loaded",
        "metadata": {"source": "hook", LOADED_TOOL_STATE: [{"name": "grep"}]},
    }
    history = [*conversation("openai")[:-1], loaded, conversation("openai")[-1]]
    view = view_of(history)
    total = sum(estimate_message(m) for m in view)
    assert check_view_invariants(history, view, budget=total).systems == 1
    assert code_of(history, view, budget=total - 1) == (5, "over-budget")
    assert code_of(history, view_of(history, len(history) - 2)) == (2, "protected")


def test_the_oracle_applies_the_providers_rules() -> None:
    """The caller's own content passes through verbatim: OpenAI rejects a tool message
    whose content is an object, and takes only text parts (an adapter drops an image)."""
    call = {"role": "assistant", "content": "", "tool_calls": [openai_call("c1")]}
    odd = {"role": "tool", "tool_call_id": "c1", "content": {"not": "text"}}
    history = [{"role": "user", "content": "go"}, call, odd, {"role": "user", "content": "x"}]
    assert code_of(history, view_of(history)) == (1, "provider-openai")
    assert check_view_invariants(history, view_of(history), dialects=()).mapping == (0, 1, 2, 3)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    pictured = {**odd, "content": [{"type": "text", "text": "see"}, image]}
    history[2] = pictured
    assert check_view_invariants(history, view_of(history)).media_dropped


@pytest.mark.anyio
async def test_check_isolation_names_each_leak(anyio_backend: str) -> None:
    manager = SimpleContextManager()
    await manager.set_messages(conversation("openai"))

    async def rebuild() -> list[dict[str, Any]]:
        return await manager.get_messages_for_request()

    again = await check_isolation(manager, await rebuild(), rebuild)
    assert again == await rebuild()

    async def leaking() -> list[dict[str, Any]]:
        await anyio.lowlevel.checkpoint()
        return [{"role": "user", "content": MUTATION_MARK}]

    async def different() -> list[dict[str, Any]]:
        return (await rebuild())[:-1]

    for next_view, detail in ((leaking, "leaked"), (different, "nothing new was committed")):
        with pytest.raises(ViewInvariantError, match=detail) as raised:
            await check_isolation(manager, await rebuild(), next_view)
        assert (raised.value.item, raised.value.code) == (7, "isolation")
    shared = await manager.get_messages()  # not a view: the history's own copies
    stored = manager._history.entries[0].given  # the store's own dict, not a copy
    with pytest.raises(ViewInvariantError, match="changed the store"):
        await check_isolation(manager, [stored], rebuild)
    assert shared


# -- sweep failures, each named by its code ---------------------------------------------------


def operation(
    run: Callable[[SimpleContextManager, FaultPlan], Awaitable[Any]],
    follow_up: Callable[[SimpleContextManager], Awaitable[Any]] | None = None,
) -> Prepare[Any]:
    """A ``prepare`` over a fresh manager whose operation is ``run(manager, plan)``."""

    async def prepare(plan: FaultPlan) -> Prepared[Any]:
        manager = SimpleContextManager()
        await manager.set_messages([{"role": "user", "content": "hi"}])

        async def go() -> Any:
            return await run(manager, plan)

        retry = None if follow_up is None else functools.partial(follow_up, manager)
        prepared: Prepared[Any] = Prepared(manager, go, FaultyHooks(plan), retry)
        manager.hooks = prepared.hooks
        RUNS.append(prepared)
        return prepared

    return prepare


RUNS: list[Prepared[Any]] = []


async def sweep_code(prepare: Prepare[Any], **kwargs: Any) -> tuple[str, tuple[str, ...]]:
    with pytest.raises(SweepFailure) as raised:
        await sweep("synthetic", prepare, kind=kwargs.pop("kind", ERROR), **kwargs)
    return raised.value.code, raised.value.fields


@pytest.mark.anyio
async def test_a_stage_of_a_composite_run_is_kept(anyio_backend: str) -> None:
    """A run that raises after an inner operation returned is judged at that stage: the
    store as the reference had it then (``staged``), and no more."""

    async def run(manager: SimpleContextManager, plan: FaultPlan) -> Any:
        await manager.get_messages_for_request()
        RUNS[-1].reached("view")
        try:
            await plan.hit("after")
        except InjectedFault:
            if manager.truncate_chars == 250:  # only while proving the failure below
                manager.truncate_chars = SPOILED[0]
            raise

    SPOILED[:] = [250]
    report = await sweep("staged", operation(run), kind=ERROR)
    # hit 1 (context:budget delivery) fails inside the store, which logs it and returns
    assert (report.points, report.staged, report.returned) == (2, 1, 1)
    SPOILED[:] = [99]
    assert await sweep_code(operation(run)) == ("stage-not-kept", ("config",))


SPOILED: list[int] = []


@pytest.mark.anyio
async def test_each_sweep_failure_has_its_code(anyio_backend: str) -> None:
    calls: list[int] = []

    async def changes_then_raises(manager: SimpleContextManager, plan: FaultPlan) -> Any:
        await plan.hit("a")
        manager.truncate_chars = 7
        raise InjectedFault("b", 0)

    assert await sweep_code(operation(changes_then_raises)) == ("reference-changed", ("config",))

    async def reorders(manager: SimpleContextManager, plan: FaultPlan) -> Any:
        calls.append(1)
        first, second = ("a", "b") if len(calls) % 2 else ("b", "a")
        await plan.hit(first)
        await plan.hit(second)

    assert (await sweep_code(operation(reorders), kind=CANCEL))[0] == "seam-order"

    async def translates(manager: SimpleContextManager, plan: FaultPlan) -> Any:
        try:
            await plan.hit("a")
        except InjectedFault as error:
            raise KeyError("a") from error

    assert await sweep_code(operation(translates)) == ("undocumented-error", ())

    async def leaves_a_trace(manager: SimpleContextManager, plan: FaultPlan) -> Any:
        await plan.hit("a")
        try:
            await plan.hit("b")
        finally:
            manager.truncate_chars = 9 if plan.fired else 250

    code, fields = await sweep_code(operation(leaves_a_trace))
    assert (code, fields) == ("raised-not-before", ("config",))

    async def returns(manager: SimpleContextManager, plan: FaultPlan) -> Any:
        await plan.hit("a")

    async def fails(manager: SimpleContextManager) -> Any:
        raise InjectedFault("retry", 0)

    assert await sweep_code(operation(returns, fails)) == ("retry-outcome", ())

    async def moves(manager: SimpleContextManager) -> Any:
        await anyio.lowlevel.checkpoint()
        manager.truncate_chars = 11

    assert await sweep_code(operation(returns, moves)) == ("retry-state", ("config",))

    async def emits(manager: SimpleContextManager) -> Any:
        await manager.hooks.emit("extra", {})

    assert await sweep_code(operation(returns, emits)) == ("retry-events", ())


def test_reduced_forms_are_traceable_exactly() -> None:
    """A stub keeps the first words and states the original length; a truncated result's
    note holds only ``form``, ``original_tokens`` and ``protected: True``."""
    long = "first words of a long request. " * 30
    history = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": long},
        *openai_round(["c1"], 900),
        {"role": "user", "content": "latest"},
    ]
    stub_note = {"form": "stubbed", "original_chars": len(long)}
    stub = {
        "role": "user",
        "content": f"[stub] {long[:60]}…",
        "metadata": {"compaction": stub_note},
    }
    stubbed = [*view_of(history)[:2], stub, *view_of(history)[3:]]
    assert check_view_invariants(history, stubbed).stubbed == 1
    stub_note["original_chars"] = len(long) - 1
    assert code_of(history, stubbed) == (4, "invented")
    tokens = estimate_message(history[4])

    def truncated(note: dict[str, Any]) -> list[dict[str, Any]]:
        short = {**history[4], "content": history[4]["content"][:40], "metadata": {}}
        short["metadata"]["compaction"] = note
        return [*view_of(history)[:4], short, *view_of(history)[5:]]

    note = {"form": "truncated", "original_tokens": tokens}
    assert check_view_invariants(history, truncated(note), truncate_chars=40).truncated == 1
    for bad in ({**note, "extra": 1}, {**note, "protected": "yes"}):
        assert code_of(history, truncated(bad), truncate_chars=40) == (4, "invented")
