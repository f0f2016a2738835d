"""The compaction notice (docs/design.md section 7.4, docs/thinking.md).

One user-role message, only on a compacted view, never stored: made when its decision is
staged, at the tail of that view (or, while the view ends with an unanswered tool call,
right after the results, on the first request that has them), and from then on shown at
that same place with the same text until the next decision; numbers are the cumulative
sticky totals.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.rendering.notice import (
    NOTICE_CLOSE,
    NOTICE_OPEN,
    notice_message,
    notice_text,
    tail_is_safe,
)
from amplifier_module_context_simple.testing import check_view_invariants, is_notice
from amplifier_module_context_simple.testing import tail_is_safe as oracle_tail_is_safe
from tests.context.strategies import FORMATS, calls, results

PROSE = "The build failed because the linker could not find symbol parse_config. "
LOG = "log line: compiling module ok\n"
NOTICE_METADATA = {"source": "context-compaction", "ephemeral": True}

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def pressured(fmt: str = "openai", turns: int = 8) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    messages.append(human("first " + PROSE))
    for index in range(turns):
        messages.append(calls(fmt, [f"n{index}"]))
        messages += results(fmt, {f"n{index}": LOG * 60})
        messages.append(human(f"next {index} " + PROSE * 3))
    return messages


async def compacted(messages: list[dict[str, Any]], **config: Any) -> SimpleContextManager:
    config.setdefault("max_tokens", 2_500)
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(messages))
    return manager


async def test_notice_is_the_last_and_only_notice(anyio_backend: str) -> None:
    """60: after a compaction the view ends with exactly one notice: role user, metadata
    ``{source: context-compaction, ephemeral: True}``, wrapped in the reminder tags, naming
    the level and the cumulative counts of the stats; it is never stored."""
    messages = pressured()
    manager = await compacted(messages)
    view = await manager.get_messages_for_request()
    check_view_invariants(messages, view)
    notices = [m for m in view if (m.get("metadata") or {}).get("source") == "context-compaction"]
    assert notices == [view[-1]]
    notice = view[-1]
    assert notice["role"] == "user" and notice["metadata"] == NOTICE_METADATA
    text = notice["content"]
    assert text.startswith(NOTICE_OPEN) and text.endswith(NOTICE_CLOSE)
    stats = manager.last_compaction_stats
    assert stats is not None
    assert f"level {stats['strategy_level']} of 8" in text
    for key in ("messages_removed", "messages_truncated", "user_messages_stubbed"):
        assert f"{stats[key]} " in text
    assert all(m.get("role") != "system" for m in view[1:])
    assert not any(is_notice(m) for m in await manager.get_messages())


async def test_minimal_verbosity(anyio_backend: str) -> None:
    """61: ``minimal`` is three lines: open tag, one sentence, close tag."""
    manager = await compacted(pressured(), compaction_notice_verbosity="minimal")
    view = await manager.get_messages_for_request()
    lines = view[-1]["content"].split("\n")
    assert len(lines) == 3
    assert lines[0] == NOTICE_OPEN and lines[2] == NOTICE_CLOSE
    assert lines[1] == (
        "Earlier parts of this conversation were condensed to fit the context window; "
        "some older tool output and messages are shortened or omitted."
    )


async def test_verbose_adds_view_sizes(anyio_backend: str) -> None:
    """``verbose`` adds the before/after message counts to the normal text."""
    manager = await compacted(pressured(), compaction_notice_verbosity="verbose")
    view = await manager.get_messages_for_request()
    stats = manager.last_compaction_stats
    assert stats is not None
    text = view[-1]["content"]
    normal = notice_text(stats, "normal")
    assert len(text) > len(normal)
    assert f"{stats['before_messages']} -> {stats['after_messages']}" in text


@pytest.mark.parametrize(
    "config", [{"compaction_notice_enabled": False}, {"compaction_notice_min_level": 9}]
)
async def test_no_notice_when_disabled_or_below_min_level(
    anyio_backend: str, config: dict[str, Any]
) -> None:
    """62: disabled, or a minimum level above 8: no notice although stats exist."""
    messages = pressured()
    manager = await compacted(messages, **config)
    view = await manager.get_messages_for_request()
    assert manager.last_compaction_stats is not None
    assert not any(is_notice(m) for m in view)
    check_view_invariants(messages, view)


async def test_min_level_gates_on_the_sticky_level(anyio_backend: str) -> None:
    """A notice appears only once the sticky level reaches ``compaction_notice_min_level``
    (level 1 first: no notice; a deeper escalation: notice)."""
    messages = pressured()
    manager = await compacted(
        messages,
        compaction_notice_min_level=3,
        compact_threshold=0.95,
        target_usage=0.9,
        max_tokens=None,
    )
    total = sum(estimate_message(m) for m in messages)
    levels = []
    # (the budgets leave the default notice reserve out of the policy budget)
    for fraction in (2.0, 1.2, 0.5, 0.1):
        view = await manager.get_messages_for_request(token_budget=int(total * fraction))
        stats = manager.last_compaction_stats
        level = stats["strategy_level"] if stats else 0
        levels.append(level)
        assert is_notice(view[-1]) == (level >= 3), (fraction, level)
    assert levels[0] == 0 and 1 <= levels[1] < 3 and levels[-1] >= 3


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_notice_stays_where_it_was_first_shown(anyio_backend: str, fmt: str) -> None:
    """63: a notice shown at the tail of its compaction's view stays at that place, with
    the same text, while later messages (a pending call, then its results) follow it."""
    messages = pressured(fmt)
    manager = await compacted(messages)
    first = await manager.get_messages_for_request()
    assert is_notice(first[-1])
    place = len(first) - 1
    pending = calls(fmt, ["p1", "p2"])
    await manager.add_message(copy.deepcopy(pending))
    answer_p2 = results(fmt, {"p2": "two"})
    for message in answer_p2:
        await manager.add_message(copy.deepcopy(message))
    view = await manager.get_messages_for_request()
    assert view[: len(first)] == first
    assert [i for i, m in enumerate(view) if is_notice(m)] == [place]
    check_view_invariants([*messages, pending, *answer_p2], view)
    answer_p1 = results(fmt, {"p1": "one"})
    for message in answer_p1:
        await manager.add_message(copy.deepcopy(message))
    view = await manager.get_messages_for_request()
    assert view[: len(first)] == first
    assert [i for i, m in enumerate(view) if is_notice(m)] == [place]
    check_view_invariants([*messages, pending, *answer_p2, *answer_p1], view)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_notice_decided_before_the_results_goes_right_after_them(
    anyio_backend: str, fmt: str
) -> None:
    """63: a compaction decided while the view ends with an unanswered call shows no
    notice (a provider expects the results next); the first request with the results
    shows it right after them, and later requests keep it there."""
    pending = calls(fmt, ["p1"])
    messages = [*pressured(fmt), pending]
    manager = await compacted(messages)
    first = await manager.get_messages_for_request()
    assert manager.last_compaction_stats is not None
    assert not any(is_notice(m) for m in first)
    answer = results(fmt, {"p1": "one"})
    for message in answer:
        await manager.add_message(copy.deepcopy(message))
    view = await manager.get_messages_for_request()
    assert is_notice(view[-1]) and view[:-1] == [*first, *answer]
    assert oracle_tail_is_safe(view[:-1])
    reply = {"role": "assistant", "content": "done"}
    await manager.add_message(copy.deepcopy(reply))
    await manager.add_message(human("thanks"))
    later = await manager.get_messages_for_request()
    assert later == [*view, reply, human("thanks")]
    check_view_invariants([*messages, *answer, reply, human("thanks")], later)


async def test_identical_notice_until_the_next_escalation(anyio_backend: str) -> None:
    """64: requests without a new escalation repeat the notice exactly, at its place, and
    keep the same stats object; a new escalation makes a new notice with the new numbers,
    at the tail of its own view."""
    messages = pressured()
    manager = await compacted(messages)
    first = await manager.get_messages_for_request()
    stats = manager.last_compaction_stats
    second = await manager.get_messages_for_request()
    assert second == first and manager.last_compaction_stats is stats
    for index in range(10):
        await manager.add_message(human(f"more {index} " + PROSE * 10))
        await manager.add_message({"role": "assistant", "content": PROSE * 10})
    later = await manager.get_messages_for_request()
    new_stats = manager.last_compaction_stats
    assert new_stats is not None and new_stats is not stats
    assert later[-1]["content"] == notice_text(new_stats, "normal")
    assert later[-1]["content"] != first[-1]["content"]
    assert sum(map(is_notice, later)) == 1


async def test_notice_never_on_an_uncompacted_view(anyio_backend: str) -> None:
    """No stats, no notice: a view below the trigger carries none."""
    manager = await compacted(pressured(), max_tokens=None)
    view = await manager.get_messages_for_request()
    assert manager.last_compaction_stats is None
    assert not any(is_notice(m) for m in view)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tail_is_safe_in_every_format(fmt: str) -> None:
    """The tail check pairs by id over trailing results, split or reordered, in every
    format; a partially answered or unanswered tail is unsafe."""
    call = calls(fmt, ["a", "b"])
    both = results(fmt, {"b": "2", "a": "1"})
    assert tail_is_safe([human("q"), call, *both])
    assert not tail_is_safe([human("q"), call, *results(fmt, {"b": "2"})])
    assert not tail_is_safe([human("q"), call])
    assert tail_is_safe([human("q"), call, *both, {"role": "assistant", "content": "done"}])
    assert tail_is_safe([])
    assert tail_is_safe([human("q")])


def test_notice_message_shape() -> None:
    """The notice message is a user message with exactly the notice metadata."""
    stats = {"strategy_level": 5, "messages_removed": 3, "messages_truncated": 2}
    message = notice_message(stats, "normal")
    assert message["role"] == "user" and message["metadata"] == NOTICE_METADATA
    assert is_notice(message)
    assert "level 5 of 8" in message["content"]
