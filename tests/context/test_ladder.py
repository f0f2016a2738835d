"""The eight-level ladder on the ordinary path (docs/design.md sections 4.1
and 4.2), the reduced forms, no-op levels, and scaling.

Numbers that depend on the estimator are derived from ``estimate_message`` rather than
hard-coded, so the tests hold while the estimator is recalibrated.
"""

from __future__ import annotations

import copy
import gc
import logging
import time
from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.history.classify import classify
from amplifier_module_context_simple.context.history.history import History
from amplifier_module_context_simple.context.ladder.forms import stubbed_form, truncated_form
from amplifier_module_context_simple.context.ladder.ladder import Ladder, LadderParams
from amplifier_module_context_simple.context.ladder.rows import Item, Rows
from amplifier_module_context_simple.context.slices import run_through
from amplifier_module_context_simple.testing import (
    RecordingHooks,
    check_view_invariants,
    reduced_kind,
)
from tests.context.strategies import FORMATS, calls, fill, results

PROSE = "The build failed because the linker could not find symbol parse_config. "
LOG = "log line: compiling module ok\n"


def human(content: str | list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", "content": content}


def total_of(messages: list[dict[str, Any]]) -> int:
    return sum(estimate_message(m) for m in messages)


async def admitted(messages: list[dict[str, Any]], **config: Any) -> SimpleContextManager:
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(messages))
    return manager


# -- the trigger and the untouched view (42-45) -----------------------------------------------


@pytest.mark.anyio
async def test_small_history_large_budget_is_untouched(anyio_backend: str) -> None:
    """42: below the trigger the view is the history as given (no ``_seq``), no stats, no
    notice, no compaction event."""
    hooks = RecordingHooks()
    manager = SimpleContextManager(hooks=hooks)
    messages = [
        {"role": "system", "content": "be helpful"},
        human("hello"),
        {"role": "assistant", "content": "hi", "metadata": {"custom": 1}},
    ]
    for message in messages:
        await manager.add_message(copy.deepcopy(message))
    view = await manager.get_messages_for_request()
    assert view == messages
    assert manager.last_compaction_stats is None
    assert not hooks.named("context:compaction")
    stored = await manager.get_messages()
    assert [m["metadata"]["_seq"] for m in stored] == [0, 1, 2]


@pytest.mark.anyio
async def test_notice_reserve_comes_off_the_budget(anyio_backend: str) -> None:
    """43: with ``max_tokens=10000`` the compaction budget is 10000 - 800 = 9200."""
    messages = [human(fill("prose", 1000)) for _ in range(5)]
    manager = await admitted(messages, max_tokens=10_000, compact_threshold=0.1, target_usage=0.05)
    await manager.get_messages_for_request()
    stats = manager.last_compaction_stats
    assert stats is not None and stats["budget"] == 9200
    assert stats["target_tokens"] == int(9200 * 0.05)


@pytest.mark.anyio
async def test_reserve_larger_than_the_budget_is_scaled_down(anyio_backend: str) -> None:
    """44: a notice reserve as large as the budget is scaled down to a quarter of it (not
    ignored); the ladder compacts, and the view with its notice stays within the budget."""
    messages = [human(f"u{k} " + "word " * 40) for k in range(20)]
    manager = await admitted(messages, max_tokens=800, compact_threshold=0.1)
    view = await manager.get_messages_for_request()
    stats = manager.last_compaction_stats
    assert stats is not None
    assert stats["budget"] == 800 - 800 // 4
    assert stats["after_tokens"] < stats["before_tokens"]
    assert sum(estimate_message(m) for m in view) <= 800
    assert len(view) < 20
    check_view_invariants(messages, view)


@pytest.mark.anyio
async def test_sequence_ids_stay_out_of_views(anyio_backend: str) -> None:
    """45: no view message carries ``_seq``; the stored history always does."""
    messages = [human(fill("prose", 800)) for _ in range(12)]
    manager = await admitted(messages, max_tokens=1_500)
    for budget in (None, 1_000, 300):
        view = await manager.get_messages_for_request(token_budget=budget)
        assert all("_seq" not in m.get("metadata", {}) for m in view)
        stored = await manager.get_messages()
        assert [m["metadata"]["_seq"] for m in stored] == list(range(12))


# -- protected content (46-47, 54) ----------------------------------------------------------


def heavy_history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are the build assistant. " * 20},
        human("first: " + PROSE * 10),
    ]
    for turn in range(10):
        fmt = FORMATS[turn % 3]
        messages.append(calls(fmt, [f"h{turn}"], text=f"looking {turn}"))
        messages += results(fmt, {f"h{turn}": LOG * 80})
        messages.append({"role": "assistant", "content": PROSE * 5})
        messages.append(human(f"turn {turn}: " + PROSE * 4))
    messages.append(
        {
            "role": "assistant",
            "content": "tools loaded",
            "metadata": {"openai:tool_search_items": [{"name": "grep"}]},
        }
    )
    messages.append(human("latest: " + PROSE * 10))
    return messages


@pytest.mark.anyio
@pytest.mark.parametrize("budget", [100_000, 8_000, 4_000, 2_000, 500, 1])
async def test_protected_content_verbatim_at_any_pressure(anyio_backend: str, budget: int) -> None:
    """46, 47, 54: the system message stays first and exact; the first and latest human
    prompts and loaded-tool state are verbatim in every view."""
    messages = heavy_history()
    manager = await admitted(messages)
    view = await manager.get_messages_for_request(token_budget=budget)
    check_view_invariants(messages, view)
    assert view[0] == messages[0]
    assert messages[1] in view and messages[-1] in view and messages[-2] in view


# -- the x7p workload (51) ------------------------------------------------------------------


def x7p() -> list[dict[str, Any]]:
    messages = [human("Investigate the failing build and fix it.")]
    for k in range(8):
        messages.append(calls("openai", [f"t{k}"]))
        messages += results("openai", {f"t{k}": (f"t{k} " + LOG * 40)[:800]})
    messages.append(human("Summarise what you found."))
    return messages


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("protected", "level", "truncated", "removed"),
    [(0, 2, ["t0", "t1", "t2", "t3"], False), (4, 2, ["t0", "t1", "t2", "t3"], False)],
)
async def test_x7p_truncation_waves(
    anyio_backend: str, protected: int, level: int, truncated: list[str], removed: bool
) -> None:
    """51: when four truncations are enough, waves 1 and 2 truncate the four oldest
    results, level 2, nothing removed (protecting the last four changes nothing)."""
    manager, view = await run_x7p(protected)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["strategy_level"] == level
    assert [m["tool_call_id"] for m in view if reduced_kind(m) == "truncated"] == truncated
    assert stats["messages_removed"] == 0


@pytest.mark.anyio
async def test_x7p_protecting_five_reaches_removal(anyio_backend: str) -> None:
    """51: protecting the last five results leaves too little to truncate: level 3 removes."""
    manager, _ = await run_x7p(5)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["strategy_level"] == 3 and stats["messages_removed"] > 0


@pytest.mark.anyio
async def test_x7p_everything_protected_reaches_the_floor(anyio_backend: str) -> None:
    """51: protecting all eight results: nothing truncated or removed, level 8 floor."""
    manager, view = await run_x7p(8)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["strategy_level"] >= 3
    assert stats["messages_truncated"] == 0 and stats["messages_removed"] == 0
    assert view == x7p()


async def run_x7p(protected: int) -> tuple[SimpleContextManager, list[dict[str, Any]]]:
    """The x7p workload with a budget where 3.5 truncations reach the target."""
    messages = x7p()
    one = estimate_message(messages[2])
    form = truncated_form(messages[2], one, 50)
    assert form is not None
    target = int(total_of(messages) - 3.5 * (one - form[1]))
    manager = await admitted(
        messages,
        max_tokens=int(target / 0.6) + 1,
        compact_threshold=0.5,
        target_usage=0.6,
        truncate_chars=50,
        protected_recent=0.5,
        compaction_notice_enabled=False,
        protected_tool_results=protected,
    )
    view = await manager.get_messages_for_request()
    check_view_invariants(messages, view, truncate_chars=50)
    return manager, view


# -- the reduced forms (52-53) and "only shrink" ----------------------------------------------


def test_truncated_form_shape() -> None:
    """52: a truncated result keeps its first ``truncate_chars`` characters after a note
    naming the original size and how to recover; ``metadata.compaction`` records it."""
    original = {"role": "tool", "tool_call_id": "c1", "content": LOG * 30, "name": "bash"}
    tokens = estimate_message(original)
    form = truncated_form(original, tokens, 50)
    assert form is not None
    message, new_tokens = form
    assert new_tokens == estimate_message(message) < tokens
    assert message["content"].startswith("[")
    assert f"~{tokens:,} tokens" in message["content"]
    assert "again" in message["content"]
    assert (LOG * 30)[:50] in message["content"]
    assert message["metadata"] == {"compaction": {"form": "truncated", "original_tokens": tokens}}
    assert {k: v for k, v in message.items() if k not in ("content", "metadata")} == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "bash",
    }
    assert "_truncated" not in message and "metadata" not in original


def test_truncated_form_of_anthropic_blocks() -> None:
    """Anthropic result carriers are truncated block by block; ids and types survive."""
    original: dict[str, Any] = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": LOG * 30},
            {"type": "tool_result", "tool_use_id": "b", "content": "short"},
        ],
        "metadata": {"keep": 1},
    }
    tokens = estimate_message(original)
    form = truncated_form(original, tokens, 40)
    assert form is not None
    message = form[0]
    assert [b["tool_use_id"] for b in message["content"]] == ["a", "b"]
    assert message["content"][1] == original["content"][1]
    assert (LOG * 30)[:40] in message["content"][0]["content"]
    assert message["metadata"]["keep"] == 1 and reduced_kind(message) == "truncated"


def test_stubbed_form_shape() -> None:
    """53: a stub keeps a short preview and the original length; ``metadata.compaction``
    records it."""
    text = "Please refactor\nthe parser module " + PROSE * 5
    original = {"role": "user", "content": text, "metadata": {"source": "hook"}}
    form = stubbed_form(original, estimate_message(original))
    assert form is not None
    message, tokens = form
    assert tokens < estimate_message(original)
    assert " ".join(text[:50].split()) in message["content"]
    assert f"{len(text):,}" in message["content"]
    assert message["metadata"] == {
        "source": "hook",
        "compaction": {"form": "stubbed", "original_chars": len(text)},
    }
    assert "_stubbed" not in message


@pytest.mark.parametrize("size", [0, 10, 50, 51, 60, 120, 200])
def test_truncation_that_would_not_shrink_is_not_made(size: int) -> None:
    """A result at or barely over ``truncate_chars`` (the note costs more than it saves)
    has no truncated form."""
    original = {"role": "tool", "tool_call_id": "c", "content": fill("prose", size)}
    form = truncated_form(original, estimate_message(original), 50)
    assert form is None or form[1] < estimate_message(original)
    if size <= 60:
        assert form is None


@pytest.mark.parametrize("size", [0, 80, 81, 100, 150])
def test_stub_that_would_not_shrink_is_not_made(size: int) -> None:
    """Short user messages (<= 80 characters, or barely over) have no stubbed form."""
    original = human(fill("prose", size))
    form = stubbed_form(original, estimate_message(original))
    assert form is None or form[1] < estimate_message(original)
    if size <= 100:
        assert form is None


def test_list_content_results_have_a_reduced_form_and_list_user_turns_no_stub() -> None:
    """A tool message whose content is a list of text blocks is truncated like a string
    one (the form is smaller and still a block list); list user content is never stubbed."""
    tool = {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": LOG * 50}]}
    form = truncated_form(tool, estimate_message(tool), 10)
    assert form is not None and form[1] < estimate_message(tool)
    assert [block["type"] for block in form[0]["content"]] == ["text"]
    blocks = human([{"type": "text", "text": PROSE * 10}])
    assert stubbed_form(blocks, estimate_message(blocks)) is None


@pytest.mark.anyio
async def test_noop_truncations_are_neither_applied_nor_counted(anyio_backend: str) -> None:
    """(docs/design.md section 4.1) Results barely longer than ``truncate_chars`` are left whole and not
    counted; the reported counts are what the view shows."""
    messages = [human("first")]
    for k in range(8):
        messages.append(calls("openai", [f"n{k}"]))
        messages += results("openai", {f"n{k}": fill("prose", 60)})
        messages.append(human(f"turn {k} " + PROSE * 3))
    messages.append(human("latest"))
    manager = await admitted(
        messages, truncate_chars=50, protected_tool_results=0, compaction_notice_enabled=False
    )
    view = await manager.get_messages_for_request(token_budget=total_of(messages) // 2)
    report = check_view_invariants(messages, view, truncate_chars=50)
    stats = manager.last_compaction_stats
    assert stats is not None
    assert stats["messages_truncated"] == 0 == report.truncated
    assert stats["user_messages_stubbed"] == report.stubbed
    assert stats["messages_removed"] == len(messages) - len(view) > 0


@pytest.mark.anyio
async def test_counts_match_the_view(anyio_backend: str) -> None:
    """Reported counts equal what the view shows (truncated and stubbed forms, messages
    missing) on a heavy history."""
    messages = heavy_history()
    manager = await admitted(messages, compaction_notice_enabled=False, truncate_chars=100)
    view = await manager.get_messages_for_request(token_budget=3_000)
    report = check_view_invariants(messages, view, truncate_chars=100)
    stats = manager.last_compaction_stats
    assert stats is not None
    assert stats["messages_truncated"] == report.truncated
    assert stats["user_messages_stubbed"] == report.stubbed
    assert stats["messages_removed"] == len(messages) - len(view)
    assert stats["after_messages"] == len(view)
    assert stats["after_tokens"] == total_of(view)


# -- no-op levels and the floor (55-59) ---------------------------------------------------------


@pytest.mark.anyio
async def test_nothing_reducible_reports_the_floor_once(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A history with nothing the ladder may touch: the ladder climbs to level 8, makes no
    change, and reports the floor once (one event, one warning); the view is unchanged."""
    messages = [human("only request " + PROSE * 40)]
    hooks = RecordingHooks()
    manager = SimpleContextManager(hooks=hooks, compaction_notice_enabled=False)
    await manager.set_messages(copy.deepcopy(messages))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            view = await manager.get_messages_for_request(token_budget=50)
            assert view == messages
    events = hooks.named("context:compaction")
    assert len(events) == 1
    stats = events[0]
    assert stats["strategy_level"] == 8 and stats["floor_tokens"] == stats["after_tokens"]
    assert stats["messages_removed"] == stats["messages_truncated"] == 0
    assert not manager.observable_state().removed and not manager.observable_state().truncated
    assert sum("above its target" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.anyio
async def test_short_results_survive_while_huge_prompts_force_deep_levels(
    anyio_backend: str,
) -> None:
    """55: four huge human prompts with short tool turns and a huge latest prompt: the
    ladder goes deep (level >= 4) but the short results are all present verbatim."""
    big = fill("prose", 100_000)
    messages: list[dict[str, Any]] = []
    for k in range(4):
        messages.append(human(f"h{k} {big}"))
        messages.append(calls("openai", [f"c{k}"]))
        messages += results("openai", {f"c{k}": f"short result {k}"})
    messages.append(human(f"last {big}"))
    manager = await admitted(messages, max_tokens=int(total_of(messages) * 0.8))
    view = await manager.get_messages_for_request()
    check_view_invariants(messages, view)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["strategy_level"] >= 4
    for k in range(4):
        assert results("openai", {f"c{k}": f"short result {k}"})[0] in view


@pytest.mark.anyio
async def test_large_system_prompt_triggers_compaction(anyio_backend: str) -> None:
    """56: a system prompt that alone passes the trigger makes tiny turns compact."""
    messages = [{"role": "system", "content": fill("prose", 4000)}]
    messages += [human("hi"), {"role": "assistant", "content": "hello"}] * 3
    system_tokens = estimate_message(messages[0])
    manager = await admitted(
        messages,
        max_tokens=int(system_tokens / 0.6) - 1,
        compact_threshold=0.6,
        compaction_notice_enabled=False,
    )
    view = await manager.get_messages_for_request()
    assert manager.last_compaction_stats is not None
    assert view[0] == messages[0]


@pytest.mark.anyio
async def test_reachable_target_is_reached_without_warning(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """57: a sizeable system prompt and 20 tool turns under a 10,000 budget: the view ends
    at or under the target (half the budget) and nothing is logged as over target."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": fill("prose", 8000)}]
    messages.append(human("start"))
    for k in range(20):
        messages.append(calls("amplifier", [f"s{k}"]))
        messages += results("amplifier", {f"s{k}": fill("code", 1400)})
    messages.append(human("finish"))
    manager = await admitted(messages, compaction_notice_enabled=False)
    with caplog.at_level(logging.WARNING):
        view = await manager.get_messages_for_request(token_budget=10_000)
    assert total_of(view) <= 5_000
    assert "above its target" not in caplog.text


@pytest.mark.anyio
async def test_system_floor_warning_names_the_numbers(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """58 (our wording): a system prompt larger than the budget logs one warning naming
    the level, the remaining tokens, the target and the budget with thousands separators."""
    messages = [
        {"role": "system", "content": fill("prose", 8000)},
        human("hi"),
        {"role": "assistant", "content": "hello"},
    ]
    manager = await admitted(messages)
    budget = estimate_message(messages[0]) + 10  # the system prompt alone is over it
    with caplog.at_level(logging.WARNING):
        await manager.get_messages_for_request(token_budget=budget)
    stats = manager.last_compaction_stats
    assert stats is not None
    text = caplog.text
    assert "level 8" in text and "floor" in text
    for key in ("after_tokens", "target_tokens", "budget"):
        assert f"{stats[key]:,}" in text


@pytest.mark.anyio
async def test_huge_sole_prompt_is_never_stubbed_and_reported_once(anyio_backend: str) -> None:
    """59 (storm fixed): a sole human prompt near the budget with 12 tool turns: level 8,
    the prompt is intact and never stubbed, the floor is above the target, and ten
    requests produce one context:compaction event (the target emitted ten)."""
    payload = fill("prose", 40_000)
    messages: list[dict[str, Any]] = [human(payload)]
    for k in range(12):
        messages.append(calls("openai", [f"k{k}"]))
        messages += results("openai", {f"k{k}": LOG * 30})
    budget = int(estimate_message(messages[0]) / 0.95)
    hooks = RecordingHooks()
    manager = SimpleContextManager(compact_threshold=0.8, hooks=hooks)
    await manager.set_messages(copy.deepcopy(messages))
    for _ in range(10):
        view = await manager.get_messages_for_request(token_budget=budget)
        assert view[0] == messages[0]
    stats = manager.last_compaction_stats
    assert stats is not None and stats["strategy_level"] == 8
    assert stats["user_messages_stubbed"] == 0
    assert stats["after_tokens"] > stats["target_tokens"]
    assert len(hooks.named("context:compaction")) == 1


# -- rung by rung (the Ladder itself) -------------------------------------------------------------


def ladder_of(
    messages: list[dict[str, Any]],
    *,
    target: int = -1,
    protected_recent: float = 0.0,
    protected_tool_results: int = 0,
    protected: frozenset[int] = frozenset(),
    truncate_chars: int = 20,
) -> Ladder:
    """A Ladder over ``messages`` (admitted into a History) that exhausts every rung."""
    history = History()
    for message in messages:
        history.admit(message, max_tool_result_bytes=131_072, stamp_time=False)
    full = {
        e.seq: (e.public, e.tokens)
        for e in history.entries
        if e.public is not None and not e.info.is_system
    }
    items = [
        Item(
            seq,
            history.entries[seq].info,
            message,
            tokens,
            history.group_of(seq),
            has_calls=bool(history.entries[seq].info.call_ids),
            has_results=bool(history.entries[seq].info.result_ids),
        )
        for seq, (message, tokens) in full.items()
    ]
    incomplete = frozenset(history.group_of(s) for s, ids in history.unanswered.items() if ids)
    return Ladder(
        rows=Rows.of(items),
        total=sum(item.tokens for item in items),
        target=target,
        protected=protected,
        incomplete_groups=incomplete,
        params=LadderParams(protected_recent, protected_tool_results),
        truncate=lambda seq: truncated_form(*full[seq], truncate_chars),
        stub=lambda seq: stubbed_form(*full[seq]),
    )


def eight_results() -> list[dict[str, Any]]:
    """human, then 8 single-call groups (seqs: call 1+2k, result 2+2k), then human."""
    messages = [human("first")]
    for k in range(8):
        messages.append(calls("openai", [f"r{k}"]))
        messages += results("openai", {f"r{k}": LOG * 20})
    messages.append(human("last"))
    return messages


RESULT_SEQS = [2 + 2 * k for k in range(8)]


def test_rungs_one_two_four_six_truncate_successive_quarters() -> None:
    """Rungs 1, 2 and 4 truncate the 1st, 2nd and 3rd quarter of results; rung 6 the
    rest except the protected last ones; a rung with nothing left to do is a no-op."""
    ladder = ladder_of(eight_results(), protected_tool_results=1)
    assert run_through(ladder.applying(1)) and ladder.truncated == set(RESULT_SEQS[0:2])
    assert not run_through(ladder.applying(1)), "repeating a rung must change nothing"
    assert run_through(ladder.applying(2)) and ladder.truncated == set(RESULT_SEQS[0:4])
    assert run_through(ladder.applying(4)) and ladder.truncated == set(RESULT_SEQS[0:6])
    assert run_through(ladder.applying(6)) and ladder.truncated == set(RESULT_SEQS[0:7])
    assert not run_through(ladder.applying(6))
    assert ladder.level == 6 and not ladder.removed and not ladder.stubbed
    assert ladder.total == sum(item.tokens for item in ladder.view_items())


def test_waves_stop_as_soon_as_the_target_is_met() -> None:
    """A wave stops once the running total is at or under the target."""
    ladder = ladder_of(eight_results())
    first = next(item for item in ladder.view_items() if item.seq == RESULT_SEQS[0])
    form = truncated_form(first.message, first.tokens, 20)
    assert form is not None
    ladder.target = ladder.total - (first.tokens - form[1])
    run_through(ladder.climbing())
    assert ladder.truncated == {RESULT_SEQS[0]} and ladder.level == 1 and ladder.fits


def test_removal_rungs_remove_whole_groups_outside_the_recent_window() -> None:
    """Rungs 3, 5, 7 remove whole groups older than a narrowing recent window; user turns
    are not removed; the first and last human prompts stay."""
    messages = eight_results()
    ladder = ladder_of(messages, protected_recent=1.0)
    assert not run_through(ladder.applying(3)), "protected_recent=1.0 protects everything at rung 3"
    assert run_through(ladder.applying(5))
    removed_at_5 = set(ladder.removed)
    assert removed_at_5 and all(
        seq % 2 == 1 and seq + 1 in removed_at_5 for seq in removed_at_5 if seq % 2 == 1
    )
    assert run_through(ladder.applying(7)) and ladder.removed > removed_at_5
    kept = {item.seq for item in ladder.view_items()}
    assert {0, len(messages) - 1} <= kept
    for seq in ladder.removed:
        partner = seq + 1 if seq % 2 == 1 else seq - 1
        assert partner in ladder.removed, "a group left the view in part"


def test_a_removed_item_releases_its_reduced_form() -> None:
    """A result truncated by rung 1 and then removed by a removal pass: nothing in the
    ladder keeps its truncated form alive (the wave's scope still lists the item, and a
    long session's removed forms were megabytes of text held to the end of the request)."""
    ladder = ladder_of(eight_results(), protected_tool_results=1)
    assert run_through(ladder.applying(1)) and run_through(ladder.applying(2))
    # (view_items makes the forms, and the ladder keeps them from then on, as for a merge)
    forms = {item.seq: item.message for item in ladder.view_items() if item.form == "truncated"}
    assert set(forms) == set(RESULT_SEQS[0:4])
    for rung in (3, 5, 7):
        run_through(ladder.applying(rung))
    gone = set(forms) & ladder.removed
    assert gone, "the removal passes must remove some truncated results"
    for seq in gone:
        holders = [r for r in gc.get_referrers(forms[seq]) if r is not forms]
        assert holders == [], f"the removed seq {seq}'s form is still held"


def test_removal_skips_incomplete_and_protected_groups() -> None:
    """A group with an unanswered call and a group holding a protected seq stay."""
    messages = [human("first"), calls("anthropic", ["a", "b"])]
    messages += results("anthropic", {"a": LOG * 20})  # "b" unanswered
    messages += [calls("amplifier", ["c"]), *results("amplifier", {"c": LOG * 20})]
    messages += [calls("openai", ["d"]), *results("openai", {"d": LOG * 20}), human("last")]
    ladder = ladder_of(messages, protected=frozenset({4}))
    for rung in range(1, 9):
        run_through(ladder.applying(rung))
    assert ladder.removed == {5, 6}
    assert {1, 2, 3, 4} <= {item.seq for item in ladder.view_items()}


def test_rung_eight_stubs_machine_turns_then_drops_old_stubs() -> None:
    """Rung 8 stubs machine-written user turns (never a human prompt, never the last user
    turn, never a protected one) and then drops stubs older than the recent window."""
    reminder = {"ephemeral": True, "persisted": True, "source": "hook"}
    messages = [
        {"role": "user", "content": "old reminder " + PROSE * 3, "metadata": reminder},
        human("first human " + PROSE * 3),
        {"role": "user", "content": "hook note " + PROSE * 3, "metadata": {"source": "hook"}},
        {"role": "user", "content": "kept reminder " + PROSE * 3, "metadata": reminder},
        human("middle human " + PROSE * 3),
        human("last human " + PROSE * 3),
        {"role": "user", "content": "newest reminder " + PROSE * 3, "metadata": reminder},
    ]
    ladder = ladder_of(messages, protected=frozenset({3}), protected_recent=1.0)
    assert run_through(ladder.applying(8))
    assert ladder.stubbed | ladder.removed == {0, 2}
    assert 4 not in ladder.stubbed and 6 not in ladder.stubbed
    assert {1, 3, 4, 5, 6} <= {item.seq for item in ladder.view_items()}
    assert all(classify(messages[s]).is_human is False for s in ladder.stubbed | ladder.removed)


def test_rung_eight_never_drops_the_last_user_turn_stubbed_by_an_earlier_rung() -> None:
    """The last user turn, a hook note a removal pass already stubbed, stays in the view:
    rung 8's second half keeps the bounds its first half froze."""
    note = {"source": "hook"}
    messages = [
        human("first human " + PROSE * 3),
        {"role": "user", "content": "old hook note " + PROSE * 3, "metadata": note},
        human("last human " + PROSE * 3),
        {"role": "user", "content": "newest hook note " + PROSE * 3, "metadata": note},
    ]
    ladder = ladder_of(messages, protected_recent=0.0)
    assert run_through(ladder.applying(3)) and ladder.stubbed == {1, 3}
    assert run_through(ladder.applying(8))
    assert ladder.removed == {1}


def test_unknown_rung_is_rejected() -> None:
    """Rungs are 1..8."""
    ladder = ladder_of(eight_results())
    for rung in (0, 9):
        with pytest.raises(ValueError, match="rung"):
            run_through(ladder.applying(rung))


def level_walk_history() -> list[dict[str, Any]]:
    """12 turns of prose prompt + one tool round (rotating formats), framed by humans."""
    messages = [human("first " + PROSE * 10)]
    for turn in range(12):
        fmt = FORMATS[turn % 3]
        messages += [human(f"t{turn} " + PROSE * 8), calls(fmt, [f"w{turn}"])]
        messages += results(fmt, {f"w{turn}": LOG * 40})
    messages.append(human("last " + PROSE * 10))
    return messages


@pytest.mark.anyio
async def test_every_level_is_reachable(anyio_backend: str) -> None:
    """Walking the budget down on one history visits every level 1..8 (fresh manager per
    budget, so each level is the one where the view first fits), every view valid."""
    messages = level_walk_history()
    total = total_of(messages)
    seen: set[int] = set()
    for percent in range(100, 0, -1):
        manager = await admitted(
            messages,
            compaction_notice_enabled=False,
            protected_tool_results=2,
            protected_recent=0.9,
            compact_threshold=0.95,
            target_usage=0.9,
        )
        view = await manager.get_messages_for_request(token_budget=total * percent // 100)
        check_view_invariants(messages, view, truncate_chars=manager.truncate_chars)
        stats = manager.last_compaction_stats
        if stats is not None:
            seen.add(stats["strategy_level"])
    assert seen == set(range(1, 9))


# -- scaling ---------------------------------------------------------------------------------------


def scaling_history(n: int) -> list[dict[str, Any]]:
    """About ``n`` messages: prose, code, JSON and CJK; 1-3 calls per turn in rotating
    formats; results of 200 B - 8 KB."""
    sizes = [200, 900, 2500, 8000, 400]
    styles = ["prose", "code", "json", "cjk"]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coder."}]
    turn = 0
    while len(messages) < n:
        fmt = FORMATS[turn % 3]
        ids = [f"s{turn}_{k}" for k in range(1 + turn % 3)]
        messages.append(human(f"turn {turn} " + fill(styles[turn % 4], 300)))
        messages.append(calls(fmt, ids))
        messages += results(
            fmt,
            {
                i: f"{i} " + fill(styles[(turn + k) % 4], sizes[(turn + k) % 5])
                for k, i in enumerate(ids)
            },
        )
        messages.append({"role": "assistant", "content": fill("prose", 200)})
        turn += 1
    return messages


class Timed:
    """A manager over ``messages`` with a budget that makes the first request compact."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.budget = int(total_of(messages) * 0.6)
        self.manager = SimpleContextManager(compaction_notice_enabled=False)
        self.best_compaction = self.best_steady = float("inf")

    async def compaction(self) -> None:
        """Time the first (compacting) request of a fresh manager."""
        self.manager = SimpleContextManager(compaction_notice_enabled=False)
        await self.manager.set_messages(self.messages)
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            await self.manager.get_messages_for_request(token_budget=self.budget)
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        stats = self.manager.last_compaction_stats
        assert stats is not None and stats["changes"] > 0
        self.best_compaction = min(self.best_compaction, elapsed)

    async def steady(self) -> None:
        """Time one steady-state request (sticky decisions reused, no new compaction)."""
        stats = self.manager.last_compaction_stats
        start = time.perf_counter()
        await self.manager.get_messages_for_request(token_budget=self.budget)
        self.best_steady = min(self.best_steady, time.perf_counter() - start)
        assert self.manager.last_compaction_stats is stats


COMPACTION_SAMPLES = 12
STEADY_SAMPLES = 200


async def measure_scaling(small: Timed, large: Timed) -> None:
    """Interleaved samples (so load on the machine hits both sizes alike); best of each."""
    for _ in range(COMPACTION_SAMPLES):
        await small.compaction()
        await large.compaction()
    gc.collect()
    gc.disable()
    try:
        for _ in range(STEADY_SAMPLES):
            await small.steady()
            await large.steady()
    finally:
        gc.enable()
    await checkpoint()  # (for ASYNC910: the loops' counts are not literals)


@pytest.mark.xdist_group("timing")  # one worker for every timed test (tests/test_scaling.py)
def test_four_times_the_history_costs_less_than_five_times_the_time() -> None:
    """(docs/design.md section 11) A compaction pass and a steady-state request on a 4x larger history
    (1,000 vs 4,000 messages) take < 5x as long (best of interleaved repeats).

    Timing on a shared machine has outliers (another process on the core, a polluted
    cache), so a failing measurement is repeated up to twice; a real scaling regression
    (quadratic work is 16x) fails every attempt.
    """
    small_history, large_history = scaling_history(1_000), scaling_history(4_000)
    ratios: list[tuple[float, float]] = []
    for _ in range(3):
        small, large = Timed(small_history), Timed(large_history)
        anyio.run(measure_scaling, small, large)
        ratios.append(
            (
                large.best_compaction / small.best_compaction,
                large.best_steady / small.best_steady,
            )
        )
        if max(ratios[-1]) < 5:
            break
    compaction, steady = ratios[-1]
    assert compaction < 5, f"compaction pass 4x history: {ratios}"
    assert steady < 5, f"steady-state request 4x history: {ratios}"
