"""Negotiated rungs stop at the target (and continue when a count says they must).

On the negotiated path a rung works oldest first and stops once our estimate, calibrated
by the last count (``count / estimate``), predicts the target; a counted candidate that
still lands above the target continues the same rung, within the scope the rung froze at
its first application, before the next rung. ``negotiate(..., exhaust_rungs=True)`` keeps
the existing module's rule (every rung exhausts its legal work) for comparison.

Counts come from the suite's fake provider (``orchestrator.proportional``: characters of
the view times a scale; ``orchestrator.denser``: the same, denser once the view is
reduced), so they share nothing with the module's estimator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio.lowlevel
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.ladder.ladder import Ladder
from amplifier_module_context_simple.context.slices import run_through
from amplifier_module_context_simple.negotiator.driver import MAX_COUNTS, negotiate
from amplifier_module_context_simple.testing import check_view_invariants, strip_notice
from tests.context.strategies import calls, results
from tests.context.test_ladder import human, ladder_of
from tests.negotiator.orchestrator import (
    FakeProvider,
    Orchestrator,
    Rule,
    conversation,
    counted,
    denser,
    mount_context,
    proportional,
    view_chars,
)

SCALE = 0.25


def key(message: dict[str, Any]) -> str:
    """A message's identity across views (what it says, not its metadata)."""
    return json.dumps({k: v for k, v in message.items() if k != "metadata"}, sort_keys=True)


class Counting:
    """A recording ``count_view`` over a fake-provider rule."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.views: list[list[dict[str, Any]]] = []
        self.envelopes: list[dict[str, Any]] = []

    async def __call__(self, view: list[dict[str, Any]]) -> dict[str, Any]:
        self.views.append(view)
        self.envelopes.append(counted(self.rule, view))
        await anyio.lowlevel.checkpoint()  # a provider's count is an await
        return self.envelopes[-1]

    def count(self, index: int) -> int:
        return int(self.envelopes[index]["budget_decision"]["measurement"]["input_tokens"])


async def store(history: list[dict[str, Any]], **config: Any) -> SimpleContextManager:
    context = SimpleContextManager(token_meter="actual", **config)
    await context.set_messages(history)
    return context


async def negotiated(
    context: SimpleContextManager, counting: Counting, *, exhaust: bool = False
) -> dict[str, Any]:
    """One negotiated request (the old rule through the driver's internal keyword)."""
    if not exhaust:
        return await context.get_measured_request_view(
            provider=None, retain_contents=[], count_view=counting
        )
    seam = await context._open_negotiation(None, [])
    return await negotiate(seam, count_view=counting, exhaust_rungs=True)


def level(result: dict[str, Any]) -> int:
    return int(result["transaction"].stats["strategy_level"])


# -- a rung stops at the target -----------------------------------------------------------------

HUGE = 3000
"""Eight results this long, the oldest quarter of 32: rung 1 may truncate all eight."""


def front_loaded() -> list[dict[str, Any]]:
    """A prompt, 8 tool groups with huge results, 24 with short ones, a prompt."""
    messages = [human("Read every file and report.")]
    for k in range(32):
        messages.append(calls("openai", [f"f{k}"]))
        body = (f"file {k}: " + "data row, " * HUGE)[: HUGE if k < 8 else 100]
        messages += results("openai", {f"f{k}": body})
    messages.append(human("Now the report, please."))
    return messages


FRONT_CONFIG: dict[str, Any] = {
    "max_tokens": 8_500,
    "compact_threshold": 0.9,
    "target_usage": 0.8,
    "protected_tool_results": 1,
}


@pytest.mark.anyio
async def test_a_rung_that_overshot_now_stops_within_one_message_of_the_target() -> None:
    """Rung 1 may truncate eight huge results. The old rule truncates all eight and lands
    more than one message below the target; the new rule truncates oldest first and stops
    within one message of it (both at level 1, both target_reached)."""
    history = front_loaded()
    largest = int(max(view_chars([m]) for m in history) * SCALE)
    finals = {}
    for exhaust in (True, False):
        counting = Counting(proportional(SCALE, limit=100_000))
        result = await negotiated(await store(history, **FRONT_CONFIG), counting, exhaust=exhaust)
        assert counting.count(0) >= result["trigger"], "the first count must compact"
        assert (result["outcome"], level(result)) == ("target_reached", 1)
        finals[exhaust] = (result["measured_after"], result["target"])
    (old, target), (new, _) = finals[True], finals[False]
    assert old < target - largest, "the old rule overshot by more than one message"
    assert target - largest < new <= target


# -- a count above target continues the same rung ---------------------------------------------------

SMALL = conversation(12, size=300, rounds=3)
"""36 small tool groups: the removal passes stop one group at a time."""
SMALL_CONFIG: dict[str, Any] = {"max_tokens": 4000, "protected_tool_results": 1}


def under_predicting() -> Rule:
    """Reduced views count 15% more per character than the full view."""
    return denser(0.3, 1.15, below=len(SMALL), limit=100_000)


@pytest.mark.anyio
async def test_a_count_above_target_continues_the_same_rung() -> None:
    """Calibrated on the full view, rung 5 stops at a view the provider counts above the
    target; the next counted candidate continues rung 5 (the result stays at level 5, with
    only removals since the first stop) and lands. Its messages include every message the
    whole rung 5 keeps (the old rule, which applies rung 5 whole here): a continuation
    touches only what the whole rung would."""
    counting = Counting(under_predicting())
    result = await negotiated(await store(SMALL, **SMALL_CONFIG), counting)
    target = result["target"]
    assert [counting.count(i) > target for i in range(len(counting.views))] == [
        True,
        True,
        False,
    ]
    assert (result["outcome"], level(result), result["base_view"]) == (
        "target_reached",
        5,
        counting.views[-1],
    )
    # (each candidate's notice states its own counts: compare what they show besides)
    stopped, continued = ({key(m) for m in strip_notice(view)} for view in counting.views[1:])
    assert continued < stopped, "the continuation only removed more (a removal pass)"
    whole = Counting(under_predicting())
    old = await negotiated(await store(SMALL, **SMALL_CONFIG), whole, exhaust=True)
    assert (old["outcome"], level(old)) == ("target_reached", 5)
    assert {key(m) for m in strip_notice(old["base_view"])} < continued


# -- count skipping and count_every_rung ---------------------------------------------------------


@pytest.mark.anyio
async def test_a_stop_predicted_at_target_is_counted_and_far_above_is_skipped() -> None:
    """Skipping: rung 3 exhausts its work still predicted far above the target and is not
    counted; rung 5 stops at the predicted target and is: two counts, the second the
    returned view."""
    counting = Counting(proportional(0.3, limit=100_000))
    result = await negotiated(await store(SMALL, **SMALL_CONFIG), counting)
    assert (result["outcome"], result["count_calls"], len(counting.views)) == (
        "target_reached",
        2,
        2,
    )
    assert result["base_view"] is counting.views[-1] and level(result) == 5


@pytest.mark.anyio
async def test_count_every_rung_counts_every_candidate_that_changed_something() -> None:
    """``count_every_rung``: the exhausted rung 3 is counted too (rungs 1, 2 and 4 change
    nothing here and make no candidate), then rung 5's stop: three counts, each of a
    smaller view than the one before."""
    counting = Counting(proportional(0.3, limit=100_000))
    context = await store(SMALL, count_every_rung=True, **SMALL_CONFIG)
    result = await negotiated(context, counting)
    sizes = [len(view) for view in counting.views]
    assert (result["outcome"], result["count_calls"], level(result)) == ("target_reached", 3, 5)
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3


def stubborn(threshold: int, target: int) -> Rule:
    """Above ``target`` while the view has more than ``threshold`` messages."""
    counting = proportional(0.3, limit=100_000)

    def rule(view: list[dict[str, Any]]) -> Any:
        decided = counting(view)
        assert decided is not None
        if len(view) > threshold:
            count = max(decided["measurement"]["input_tokens"], target + 1)
            decided["measurement"]["input_tokens"] = decided["estimated_input_tokens"] = count
        return decided

    return rule


@pytest.mark.anyio
async def test_with_one_base_count_left_the_rest_is_exhausted_and_the_result_counted() -> None:
    """Every stop counts above the target until the view is small: rung 5 continues count
    after count; with one base count left, it and the remaining rungs exhaust their work
    (rung 7 is the last that changes something) and the ninth count is of the returned
    candidate (its view and envelope)."""
    counting = Counting(stubborn(threshold=7, target=1600))
    result = await negotiated(await store(SMALL, **SMALL_CONFIG), counting)
    assert result["target"] == 1600
    assert (result["outcome"], result["count_calls"], len(counting.views)) == (
        "target_reached",
        MAX_COUNTS,
        MAX_COUNTS,
    )
    assert result["base_view"] is counting.views[-1]
    assert result["final_attempt"] is counting.envelopes[-1]
    assert level(result) == 7


# -- what a request leaves behind -------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_next_request_reuses_the_landed_view() -> None:
    """After the commit, the next request (one more short turn) keeps the sticky
    decisions: not_needed in one count, its view the committed one plus the new turn (and
    the notice of the committed compaction at the tail)."""
    context = await store(SMALL, **SMALL_CONFIG)
    first = await negotiated(context, Counting(proportional(0.3, limit=100_000)))
    assert await first["transaction"].commit()
    turn = [
        {"role": "assistant", "content": "Here is the report."},
        {"role": "user", "content": "Thanks, one more thing."},
    ]
    for message in turn:
        await context.add_message(message)
    counting = Counting(proportional(0.3, limit=100_000))
    second = await negotiated(context, counting)
    assert (second["outcome"], second["count_calls"]) == ("not_needed", 1)
    kept = [key(m) for m in first["base_view"]]
    view = [key(m) for m in second["base_view"]]
    assert view[: len(kept)] == kept
    assert view[len(kept) : len(kept) + 2] == [key(m) for m in turn]


REMINDER = "<system-reminders>Keep the answers short; cite file names. " * 8 + "</system-reminders>"


@pytest.mark.anyio
async def test_retained_reminders_are_never_reduced() -> None:
    """A retained reminder older than every removable group stays whole while the
    removal passes stop around it."""
    history = [
        SMALL[0],
        {"role": "user", "content": REMINDER, "metadata": {"ephemeral": True, "persisted": True}},
        *SMALL[1:],
    ]
    context = await store(history, **SMALL_CONFIG)
    counting = Counting(proportional(0.3, limit=100_000))
    result = await context.get_measured_request_view(
        provider=None, retain_contents=[REMINDER], count_view=counting
    )
    assert result["outcome"] == "target_reached" and level(result) >= 3
    reminders = [m for m in result["base_view"] if m.get("content") == REMINDER]
    assert len(reminders) == 1 and "compaction" not in (reminders[0].get("metadata") or {})


@pytest.mark.anyio
async def test_the_orchestrator_dispatches_the_continued_rungs_counted_request(
    anyio_backend: str,
) -> None:
    """Through the test orchestrator (a real coordinator on asyncio): the request it
    dispatches after the commit is the one the last count built, the continuation's."""
    coordinator, context, _ = await mount_context(anyio_backend, SMALL_CONFIG)
    await context.set_messages(SMALL)
    provider = FakeProvider(under_predicting())
    orchestrator = Orchestrator(coordinator, provider)
    outcome = await orchestrator.run()
    assert (outcome.result["outcome"], outcome.committed, outcome.dispatched) == (
        "target_reached",
        True,
        True,
    )
    assert len(provider.counted) == outcome.result["count_calls"] == 3
    request, view = orchestrator.dispatched[0]
    assert request.messages is provider.counted[-1] and view == request.messages
    check_view_invariants(SMALL, view)


# -- the ladder: a rung applied in pieces ---------------------------------------------------------


def mixed() -> list[dict[str, Any]]:
    """Every rung has work: 16 tool groups, machine-written user envelopes between them."""
    messages = [human("Start.")]
    for k in range(16):
        messages.append(calls("openai", [f"m{k}"]))
        messages += results("openai", {f"m{k}": f"output {k}: " + "log line ok\n" * 40})
        if k % 4 == 3:
            note = f"hook note {k}: " + "keep going. " * 30
            messages.append({"role": "user", "content": note, "metadata": {"source": "hook"}})
        messages.append({"role": "assistant", "content": f"Step {k} done. " + "detail " * 20})
    messages.append(human("Finish."))
    return messages


def touches(ladder: Ladder, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Record, in order, every reduction ``ladder`` makes from now on: (seq, kind)."""
    log: list[tuple[int, str]] = []
    replace, drop = Ladder._replace, Ladder._drop

    def replacing(self: Ladder, row: int, form: Any, code: int) -> None:
        if self is ladder:
            log.append((self.rows.seq[row], f"form {code}"))
        replace(self, row, form, code)

    def dropping(self: Ladder, rows: Any, doomed: set[int]) -> None:
        rows = list(rows)
        if self is ladder:
            log.extend((self.rows.seq[row], "removed") for row in rows)
        drop(self, rows, doomed)

    monkeypatch.setattr(Ladder, "_replace", replacing)
    monkeypatch.setattr(Ladder, "_drop", dropping)
    return log


def fresh() -> Ladder:
    """A ladder over ``mixed()`` protecting the recent half and the last result."""
    return ladder_of(mixed(), protected_recent=0.5, protected_tool_results=1)


def pieces(ladder: Ladder, rung: int, step: int) -> Iterator[None]:
    """Apply ``rung`` in pieces, lowering the target ``step`` tokens below the view each
    time, until it is exhausted; yield after each piece."""
    while not ladder.exhausted(rung):
        ladder.target = ladder.total - step
        run_through(ladder.applying(rung))
        yield


@pytest.mark.parametrize("rung", range(1, 9))
def test_a_rung_applied_in_pieces_touches_a_prefix_of_the_whole_rung(
    rung: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rung ``rung`` applied whole and applied in pieces (the target lowered a little below
    the view each time, as a negotiation's counts do): after every piece, what it touched
    so far is a prefix (oldest first) of what the whole rung touches, and it ends equal."""
    whole = fresh()
    whole_log = touches(whole, monkeypatch)
    run_through(whole.applying(rung))
    assert whole_log, f"rung {rung} has work in this history"
    split = fresh()
    split_log = touches(split, monkeypatch)
    lengths = []
    for _ in pieces(split, rung, step=60):
        assert split_log == whole_log[: len(split_log)]
        lengths.append(len(split_log))
    assert split_log == whole_log and len(lengths) > 1
    assert (split.removed, split.truncated, split.stubbed) == (
        whole.removed,
        whole.truncated,
        whole.stubbed,
    )


def test_a_continued_removal_pass_keeps_the_window_of_its_first_application() -> None:
    """Rung 3 protects the recent half of the view as it is when the rung is first
    applied. Stopped halfway and continued, it removes exactly what it removes applied
    whole - never a message of that window, which a window recomputed on the shrunk view
    would expose."""
    whole = fresh()
    items = whole.view_items()
    window = {item.seq for item in items[len(items) // 2 :]}
    before = whole.total
    run_through(whole.applying(3))
    split = fresh()
    split.target = before - (before - whole.total) // 2
    run_through(split.applying(3))
    assert 0 < len(split.removed) < len(whole.removed) and not split.exhausted(3)
    split.target = -1
    run_through(split.applying(3))
    assert split.exhausted(3) and split.removed == whole.removed
    assert not split.removed & window


def notes(count: int) -> list[dict[str, Any]]:
    """A prompt, ``count`` machine-written notes, a prompt: rung 8's stubs and drops."""
    hook = {"source": "hook"}
    body = "keep going, the build is still running. " * 12
    return [
        human("Start."),
        *({"role": "user", "content": f"note {k}: {body}", "metadata": hook} for k in range(count)),
        human("Finish."),
    ]


def test_a_continued_rung_eight_keeps_its_boundary() -> None:
    """Rung 8 drops stubs only before the boundary it computed at its first application
    (70% of the view here). Continued after some drops, it drops exactly what it drops
    applied whole; a boundary recomputed on the shrunk view would reach further."""
    whole = ladder_of(notes(20), protected_recent=1.0)
    run_through(whole.applying(8))
    split = ladder_of(notes(20), protected_recent=1.0)
    while not split.exhausted(8):
        split.target = split.total - 1  # one reduction per piece
        run_through(split.applying(8))
    assert whole.removed and split.removed == whole.removed
    assert len(whole.removed) < 20 and split.stubbed == whole.stubbed


def test_applying_an_exhausted_rung_changes_nothing() -> None:
    ladder = fresh()
    assert run_through(ladder.applying(1)) and ladder.exhausted(1)
    assert not run_through(ladder.applying(1))
