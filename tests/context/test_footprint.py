"""What the module keeps for the collector to walk, counted (never timed).

A loaded history is long-lived: every full collection walks whatever the module holds per
message, and the event loop waits while it does (docs/design.md section 8.1). The benchmark
times that (``make bench``, footprint section); these tests pin the structure behind it
with counts that do not depend on the machine: the tracked objects and the references the
module adds per message, which of its columns the collector does not track at all, and
that a compacting request keeps no reduced form of a message it removes.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from typing import Any

import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.history.history import History
from amplifier_module_context_simple.context.ladder.decisions import Decisions
from amplifier_module_context_simple.context.ladder.forms import truncated_form
from amplifier_module_context_simple.context.slices import run_through
from benchmarks import histories
from tests.context.test_ladder import RESULT_SEQS, eight_results, ladder_of
from tests.realdata import conversations

N = 2_000
"""Messages of the benchmark's history used here (the per-message figures at 16k are in
``make bench``; they are lower there, the fixed part spread over more messages)."""


def _new_objects(before: set[int]) -> list[object]:
    gc.collect()
    return [o for o in gc.get_objects() if id(o) not in before]


@pytest.fixture(scope="module")
def text() -> str:
    return json.dumps(histories.history(N))


@pytest.fixture
def quiet_collector() -> Iterator[None]:
    """Counts taken with the collector's automatic passes off (a pass between two counts
    would move nothing, but keep the counts exact)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def _loaded(
    messages: list[dict[str, Any]], *, one_by_one: bool = False
) -> SimpleContextManager:
    """A manager holding ``messages`` (set at once, or added one by one as a live session
    adds them) that served one compacting request (half the history's estimate), its view
    dropped."""
    store = SimpleContextManager()
    if one_by_one:
        for message in messages:
            await store.add_message(message)
    else:
        await store.set_messages(messages)
    budget = sum(map(estimate_message, messages)) // 2
    await store.get_messages_for_request(token_budget=budget)
    assert store.last_compaction_stats is not None, "the request must compact"
    return store


async def _added_per_message(text: str, *, one_by_one: bool = False) -> tuple[float, float]:
    """Tracked objects, and the references they hold, that a manager loaded with the JSON
    history ``text`` adds per message (its one-off lazy state built first, uncounted)."""
    await _loaded(json.loads(text), one_by_one=one_by_one)
    messages = json.loads(text)
    gc.collect()
    before = {id(o) for o in gc.get_objects()}
    before.add(id(before))
    store = await _loaded(messages, one_by_one=one_by_one)
    added = [o for o in _new_objects(before) if o is not store]
    references = sum(len(gc.get_referents(o)) for o in added)
    return len(added) / len(messages), references / len(messages)


@pytest.mark.anyio
@pytest.mark.usefixtures("quiet_collector")
async def test_a_loaded_history_adds_under_one_tracked_object_and_five_references_a_message(
    text: str,
) -> None:
    """After ``set_messages`` and a compacting request, the module's own tracked objects
    are under one per message and everything they hold under five references a message
    (the caller's decoded messages: about 1.5 objects and 5 references a message; at 2k
    messages the module measured 0.80 and 4.39). Before the columns these were 4.2 objects
    and 13.7 references a message."""
    objects, references = await _added_per_message(text)
    assert objects < 1.0, objects
    assert references < 5.0, references


@pytest.mark.anyio
@pytest.mark.usefixtures("quiet_collector")
async def test_real_conversations_add_one_tracked_object_and_six_references_a_message() -> None:
    """The real public conversations (1,015 messages in three formats, mostly content lists
    and tool calls: every message holds a container), added one by one as a live session
    adds them (stamped), then a compacting request: the module keeps about one tracked
    object a message (its own top-level copy of each, the isolation views promise) and
    under six references a message (the messages' own: 1.66 objects, 5.10 references).
    Before the columns: 1.01 objects, 12.95 references. Their assistant turns carry
    thinking blocks: each one a compaction shows without its thinking holds its own form
    (a message dict and a content list), 1.02 to 1.03 objects a message in all, alone;
    under pytest-xdist's worker about 0.01 more. The bound is 1.05: the store's constant
    objects count here too (the count correction and the cache's clock added four, 0.004 a
    message at this size), and a bound that a constant can break does not measure a
    per-message cost."""
    text = json.dumps([message for conv in conversations() for message in conv.messages])
    objects, references = await _added_per_message(text, one_by_one=True)
    assert objects <= 1.05, objects
    assert references < 6.0, references


def test_the_per_message_columns_are_nothing_for_the_collector(text: str) -> None:
    """The ids, timestamps and declared ids are dicts of strings and of tuples of strings:
    once a full collection has run, the collector tracks none of them (a list of them, or
    a set, it walks in full on every full collection)."""
    history = History()
    for message in json.loads(text):
        history.admit(message, max_tool_result_bytes=131_072, stamp_time=True)
    entries = history.entries
    assert entries.call_ids and entries.result_ids and len(entries.timestamps) == N
    gc.collect()
    for name, column in (
        ("call_ids", entries.call_ids),
        ("result_ids", entries.result_ids),
        ("timestamps", entries.timestamps),
        ("declared ids", history._declared),
        ("order", history.order),
        ("body_prefix", history.body_prefix),
    ):
        # untracked, or (an array) holding nothing but its type
        assert not gc.is_tracked(column) or all(
            isinstance(r, type) for r in gc.get_referents(column)
        ), name


def test_the_given_form_is_kept_only_where_it_is_not_the_public_one() -> None:
    """Most messages have one dict for both forms; the others keep their given form apart,
    and ``given``/``givens`` read it back in seq order."""
    history = History()
    plain = {"role": "user", "content": "hello"}
    hidden = {"role": "user", "content": "x", "metadata": {"amplifier_public_message": 1}}
    for message in (plain, hidden, {"role": "assistant", "content": "hi"}):
        history.admit(message, max_tool_result_bytes=131_072, stamp_time=False)
    entries = history.entries
    assert entries.given(0) is entries.public[0] and entries.given(0) == plain
    assert entries.given(1) is not entries.public[1] and entries.given(1) == hidden
    assert entries.givens(0, 3) == [plain, hidden, {"role": "assistant", "content": "hi"}]
    assert entries.givens(1, 2) == [hidden]
    assert [e.given for e in entries] == entries.givens(0, 3)


def test_a_rung_keeps_no_form_of_a_message_a_later_rung_removes() -> None:
    """Rungs 1 and 2 truncate four results and a removal pass removes some of them: the
    ladder has made no form at all, and the merge makes exactly the forms of the results
    still shown, equal to the truncations the rungs measured."""
    ladder = ladder_of(eight_results(), protected_tool_results=1)
    assert run_through(ladder.applying(1)) and run_through(ladder.applying(2))
    assert ladder.truncated == set(RESULT_SEQS[0:4])
    for rung in (3, 5, 7):
        run_through(ladder.applying(rung))
    assert ladder.removed & set(RESULT_SEQS[0:4]), "a removal pass must remove some"
    assert ladder._reduced == {}, "a rung made a form it keeps"
    merged = run_through(Decisions().merging(ladder))
    assert set(merged.overrides) == ladder.truncated | ladder.stubbed
    assert set(ladder._reduced) == set(merged.overrides)
    shown = {item.seq: item for item in ladder.view_items()}
    messages = dict(enumerate(eight_results()))
    for seq in ladder.truncated:
        form = truncated_form(messages[seq], estimate_message(messages[seq]), 20)
        assert form is not None
        assert (merged.overrides[seq], merged.override_tokens[seq]) == form
        assert shown[seq].tokens == form[1]
        assert merged.overrides[seq] is shown[seq].message, "made twice"


def test_decisions_hold_no_entry_per_removed_message_and_no_pair_per_reduced_one() -> None:
    """A removal is in ``removed`` only, a reduced message is kept with its estimate apart
    (no pair per message); ``shown`` gives the full picture (the shape
    ``observable_state`` reports), and ``hides`` answers for both kinds."""
    message = {"role": "tool", "tool_call_id": "a", "content": "cut"}
    decisions = Decisions(
        removed=frozenset({1, 2}),
        truncated=frozenset({3}),
        overrides={3: message},
        override_tokens={3: 3},
    )
    assert dict(decisions.overrides) == {3: message}
    assert decisions.shown() == {1: None, 2: None, 3: (message, 3)}
    assert [decisions.hides(seq) for seq in range(5)] == [False, True, True, True, False]
    assert not decisions.is_empty and Decisions(removed=frozenset({1})).is_empty is False
    assert Decisions().is_empty
