"""Admission: copies, timestamps, sequence ids, validation, resets (docs/design.md section 3.1).

Also: estimates are computed once at admission, and a request that needs no compaction
returns the full view (copies, sequence ids stripped, system messages first).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import InvalidMessageError, SimpleContextManager
from amplifier_module_context_simple.context.counting import estimate as estimate_module
from amplifier_module_context_simple.context.history import history as history_module
from amplifier_module_context_simple.context.policy import policy as policy_module
from amplifier_module_context_simple.testing import RecordingHooks, snapshot
from tests.support import replaced

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")


def seqs(messages: list[dict[str, Any]]) -> list[int]:
    return [m["metadata"]["_seq"] for m in messages]


def has_seq(message: dict[str, Any]) -> bool:
    return "_seq" in (message.get("metadata") or {})


def without_seq(message: dict[str, Any]) -> dict[str, Any]:
    stripped = dict(message)
    stripped["metadata"] = {k: v for k, v in message["metadata"].items() if k != "_seq"}
    return stripped


async def fill(cm: SimpleContextManager, pairs: int, size: int = 200) -> None:
    await checkpoint()  # even for pairs=0
    for i in range(pairs):
        await cm.add_message({"role": "user", "content": f"question {i} " + "q" * size})
        await cm.add_message({"role": "assistant", "content": f"answer {i} " + "a" * size})


async def compacted() -> SimpleContextManager:
    """A manager whose last request committed a compaction."""
    cm = SimpleContextManager(max_tokens=800, compact_threshold=0.1)
    await fill(cm, 10)
    await cm.get_messages_for_request()
    assert cm.last_compaction_stats is not None
    assert (
        cm.observable_state().removed
        or cm.observable_state().stubbed
        or cm.observable_state().truncated
    )
    return cm


# -- add_message ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_add_message_does_not_mutate_the_callers_dict() -> None:
    """The caller's dict (and its metadata) is unchanged after admission."""
    cm = SimpleContextManager()
    plain = {"role": "user", "content": "Hello"}
    with_meta = {"role": "user", "content": "Hi", "metadata": {"_seq": 99, "custom": 1}}
    snapshot = copy.deepcopy([plain, with_meta])
    await cm.add_message(plain)
    await cm.add_message(with_meta)
    assert [plain, with_meta] == snapshot
    assert "metadata" not in plain


@pytest.mark.anyio
async def test_timestamp_is_utc_milliseconds() -> None:
    """A stored message gets a fresh ``+00:00`` timestamp with milliseconds."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "Hello"})
    (stored,) = await cm.get_messages()
    stamp = stored["metadata"]["timestamp"]
    assert TIMESTAMP.match(stamp), stamp
    parsed = datetime.fromisoformat(stamp)
    assert parsed.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - parsed) < timedelta(seconds=1)
    assert stored["metadata"]["_seq"] == 0


@pytest.mark.anyio
async def test_existing_timestamp_and_metadata_are_kept() -> None:
    """An existing timestamp and all other metadata survive admission."""
    cm = SimpleContextManager()
    metadata = {"timestamp": "2026-02-06T10:00:00.123+00:00", "source": "hook", "x": [1]}
    await cm.add_message({"role": "system", "content": "s", "metadata": metadata})
    (stored,) = await cm.get_messages()
    assert stored["metadata"] == {**metadata, "_seq": 0}


@pytest.mark.anyio
async def test_seq_counts_from_zero_and_overwrites_incoming() -> None:
    """Sequence ids are 0, 1, 2... whatever ``_seq`` a message arrived with."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "a", "metadata": {"_seq": 99}})
    await cm.add_message({"role": "assistant", "content": "b"})
    await cm.add_message({"role": "user", "content": "c", "metadata": {"_seq": -4}})
    assert seqs(await cm.get_messages()) == [0, 1, 2]


@pytest.mark.anyio
async def test_other_keys_are_preserved() -> None:
    """Every other key of the message is stored as given."""
    cm = SimpleContextManager()
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call], "name": "bot"}
    await cm.add_message(message)
    (stored,) = await cm.get_messages()
    assert {k: v for k, v in stored.items() if k != "metadata"} == message


# -- the view carries no sequence ids ---------------------------------------------------------


@pytest.mark.anyio
async def test_seq_never_in_any_view() -> None:
    """Views (ordinary and retaining) never carry ``_seq``; stored history always does."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "system", "content": "sys", "metadata": {"_seq": 5}})
    await fill(cm, 3)
    ordinary = await cm.get_messages_for_request()
    retaining = await cm.get_messages_for_request_retaining(retain_contents=[])
    for view in (ordinary, retaining):
        assert view
        assert not any(has_seq(m) for m in view)
    assert all(has_seq(m) for m in await cm.get_messages())


@pytest.mark.anyio
async def test_seq_never_in_a_compacted_view() -> None:
    """A compacted view carries no ``_seq`` either; stored messages keep theirs."""
    cm = await compacted()
    view = await cm.get_messages_for_request()
    assert not any(has_seq(m) for m in view)
    assert seqs(await cm.get_messages()) == list(range(20))


# -- full view when no compaction is needed ---------------------------------------------------


@pytest.mark.anyio
async def test_full_view_without_compaction() -> None:
    """Small history, big budget: the view is every message as the caller gave it (no
    ``_seq``, no stamped timestamp), system messages first, others in admission order."""
    cm = SimpleContextManager()
    given: list[dict[str, Any]] = [
        {"role": "user", "content": "first"},
        {"role": "system", "content": "late system"},
        {"role": "assistant", "content": "reply", "metadata": {"custom": 1}},
        {"role": "system", "content": "hook sys", "metadata": {"source": "hook"}},
        {"role": "user", "content": "second", "metadata": {"timestamp": "2026-01-01T00:00:00"}},
    ]
    for message in given:
        await cm.add_message(message)
    view = await cm.get_messages_for_request()
    systems = [m for m in given if m["role"] == "system"]
    others = [m for m in given if m["role"] != "system"]
    assert view == systems + others
    assert cm.last_compaction_stats is None
    stored = await cm.get_messages()
    assert all("timestamp" in m["metadata"] for m in stored)


@pytest.mark.anyio
async def test_view_is_a_copy() -> None:
    """Mutating a returned view (keys, metadata, the list) changes nothing stored."""
    cm = SimpleContextManager()
    given: list[dict[str, Any]] = [
        {"role": "user", "content": "q", "metadata": {"k": "v"}},
        {"role": "assistant", "content": "a"},
    ]
    for message in given:
        await cm.add_message(message)
    before = await cm.get_messages()
    view = await cm.get_messages_for_request()
    view[0]["content"] = "changed"
    view[0]["metadata"]["injected"] = True
    del view[0]["metadata"]["k"]
    del view[1]["role"]
    view.append({"role": "user", "content": "extra"})
    assert await cm.get_messages() == before
    assert await cm.get_messages_for_request() == given


@pytest.mark.anyio
async def test_two_views_share_no_message_dicts() -> None:
    """Each request returns new message and metadata dicts."""
    cm = SimpleContextManager()
    for i in range(4):
        await cm.add_message({"role": "user", "content": f"m{i}", "metadata": {"i": i}})
    first = await cm.get_messages_for_request()
    second = await cm.get_messages_for_request()
    assert first == second
    for a, b in zip(first, second, strict=True):
        assert a is not b
        assert a["metadata"] is not b["metadata"]


# -- get_messages returns copies ---------------------------------------------------------------


@pytest.mark.anyio
async def test_get_messages_returns_copies() -> None:
    """Setting, replacing or deleting keys of a returned message or its metadata is harmless."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "hello", "metadata": {"k": "v"}})
    snapshot = await cm.get_messages()
    returned = await cm.get_messages()
    returned[0]["content"] = "evil"
    returned[0]["metadata"]["_seq"] = 42
    returned[0]["metadata"]["k"] = "changed"
    del returned[0]["metadata"]["timestamp"]
    returned[0]["new"] = 1
    returned.clear()
    assert await cm.get_messages() == snapshot
    attribute = cm.messages
    attribute[0]["metadata"]["k"] = "again"
    assert await cm.get_messages() == snapshot


@pytest.mark.anyio
async def test_get_messages_new_dicts_each_call() -> None:
    """Two calls return distinct message and metadata dicts."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "x"})
    (a,) = await cm.get_messages()
    (b,) = await cm.get_messages()
    assert a == b
    assert a is not b
    assert a["metadata"] is not b["metadata"]


# -- invalid messages ------------------------------------------------------------------------

BAD_MESSAGES: list[tuple[object, str]] = [
    ("hello", "dict"),
    (None, "dict"),
    (["role", "user"], "dict"),
    ({"content": "no role"}, "role"),
    ({"role": None, "content": "x"}, "role"),
    ({"role": 3, "content": "x"}, "role"),
    ({"role": "", "content": "x"}, "role"),
    ({"role": "user", "content": "x", "metadata": "meta"}, "metadata"),
    ({"role": "user", "content": "x", "metadata": ["a"]}, "metadata"),
    ({"role": "user", "content": 42}, "content"),
    ({"role": "user", "content": {"type": "text", "text": "x"}}, "content"),
    ({"role": "user", "content": b"bytes"}, "content"),
    ({"role": "assistant", "content": None, "tool_calls": "call"}, "tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": {"id": "c"}}, "tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": [1, 2]}, "tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "c"}, "x"]}, "tool_calls"),
]


def _bad_id(case: tuple[object, str]) -> str:
    return f"{case[1]}:{case[0]!r}"[:60]


@pytest.mark.anyio
@pytest.mark.parametrize("case", BAD_MESSAGES, ids=_bad_id)
async def test_add_message_rejects_bad_shapes(case: tuple[object, str]) -> None:
    """A malformed message raises InvalidMessageError (a ValueError) naming the problem;
    nothing is admitted and no sequence id is consumed."""
    bad, word = case
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    await cm.add_message({"role": "user", "content": "kept"})
    before = snapshot(cm)
    with pytest.raises(InvalidMessageError, match=word) as error:
        await cm.add_message(bad)  # type: ignore[arg-type]  # deliberately malformed
    assert isinstance(error.value, ValueError)
    assert snapshot(cm).identical(before)
    assert hooks.started == []
    await cm.add_message({"role": "user", "content": "next"})
    assert seqs(await cm.get_messages()) == [0, 1]


@pytest.mark.anyio
async def test_set_messages_rejects_a_bad_message_by_index() -> None:
    """One bad message in a batch names its index; the previous history stays intact."""
    cm = await compacted()
    before = snapshot(cm)
    batch: list[dict[str, Any]] = [
        {"role": "user", "content": "ok"},
        {"role": "user", "content": 7},
    ]
    with pytest.raises(InvalidMessageError) as error:
        await cm.set_messages(batch)
    assert error.value.index == 1
    assert "message 1" in str(error.value)
    assert "content" in str(error.value)
    assert snapshot(cm).identical(before)


@pytest.mark.anyio
async def test_set_messages_bad_batch_emits_nothing() -> None:
    """A rejected batch clips nothing and emits no ingress event, even for good members."""
    hooks = RecordingHooks()
    cm = SimpleContextManager(hooks=hooks)
    huge = {"role": "tool", "tool_call_id": "t", "content": "x" * 200_000}
    with pytest.raises(InvalidMessageError) as error:
        junk: Any = "not a message"  # deliberately no dict
        await cm.set_messages([huge, {"role": "user", "content": "x"}, junk])
    assert error.value.index == 2
    assert hooks.started == []
    assert await cm.get_messages() == []


@pytest.mark.anyio
@pytest.mark.parametrize("batch", ["abc", {"role": "user", "content": "x"}, 5, None])
async def test_set_messages_rejects_a_non_list(batch: object) -> None:
    """set_messages needs a list of messages; anything else is rejected and nothing changes."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "kept"})
    before = await cm.get_messages()
    with pytest.raises(InvalidMessageError):
        await cm.set_messages(batch)  # type: ignore[arg-type]  # deliberately no list
    assert await cm.get_messages() == before


# -- set_messages ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_set_messages_reassigns_seqs_without_timestamps() -> None:
    """Seqs become 0..N-1, no timestamp is added, and the caller's list is untouched."""
    cm = SimpleContextManager()
    batch: list[dict[str, Any]] = [
        {"role": "user", "content": "a", "metadata": {"_seq": 999}},
        {"role": "assistant", "content": "b", "metadata": {"_seq": 123, "keep": True}},
        {"role": "user", "content": "c"},
    ]
    snapshot = copy.deepcopy(batch)
    await cm.set_messages(batch)
    assert batch == snapshot
    stored = await cm.get_messages()
    assert seqs(stored) == [0, 1, 2]
    assert not any("timestamp" in m["metadata"] for m in stored)
    assert stored[1]["metadata"]["keep"] is True
    await cm.add_message({"role": "user", "content": "d"})
    last = (await cm.get_messages())[-1]
    assert last["metadata"]["_seq"] == 3
    assert "timestamp" in last["metadata"]


@pytest.mark.anyio
async def test_set_messages_replaces_history() -> None:
    """set_messages replaces the previous history entirely."""
    cm = SimpleContextManager()
    await fill(cm, 3)
    await cm.set_messages([{"role": "user", "content": "only"}])
    assert [m["content"] for m in await cm.get_messages()] == ["only"]
    assert [m["content"] for m in await cm.get_messages_for_request()] == ["only"]


@pytest.mark.anyio
async def test_set_messages_resets_sticky_state() -> None:
    """After set_messages with an unrelated history: no sticky decisions, level 0, no
    compaction stats (re-setting a list that starts with the current history keeps them:
    test_set_messages_extending_keeps_sticky_state)."""
    cm = await compacted()
    stats = cm.last_compaction_stats
    await cm.set_messages(await cm.get_messages())
    assert cm.last_compaction_stats is stats and cm.observable_state().removed
    await cm.set_messages(replaced(await cm.get_messages()))
    assert cm.observable_state().removed == set()
    assert cm.observable_state().truncated == set()
    assert cm.observable_state().stubbed == set()
    assert cm.observable_state().level == 0
    assert cm.last_compaction_stats is None
    assert cm.last_compaction_stats is None


@pytest.mark.anyio
async def test_set_messages_round_trip() -> None:
    """A history round-trips through get_messages/set_messages unchanged."""
    cm = SimpleContextManager()
    await fill(cm, 3)
    history = await cm.get_messages()
    other = SimpleContextManager()
    await other.set_messages(history)
    assert await other.get_messages() == history
    assert await other.get_messages_for_request() == [without_seq(m) for m in history]


# -- clear, stubs --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_clear() -> None:
    """clear empties history, sticky state and meter; the next message gets ``_seq`` 0."""
    cm = await compacted()
    await cm.on_llm_response("llm:response", {"usage": {"input_tokens": 50}})
    await cm.get_messages_for_request()
    await cm.clear()
    assert await cm.get_messages() == []
    assert await cm.get_messages_for_request() == []
    assert cm.last_compaction_stats is None
    assert cm.observable_state().level == 0
    assert not (
        cm.observable_state().removed
        or cm.observable_state().truncated
        or cm.observable_state().stubbed
    )
    assert cm.observable_state().measured is None
    await cm.clear()
    assert cm._last_token_meter_stats is None
    await cm.add_message({"role": "user", "content": "fresh"})
    assert seqs(await cm.get_messages()) == [0]


@pytest.mark.anyio
async def test_protocol_stubs() -> None:
    """should_compact is False; compact returns None and changes nothing."""
    cm = SimpleContextManager()
    await fill(cm, 2)
    before = await cm.get_messages()
    assert await cm.should_compact() is False
    compact: Callable[[], Awaitable[object]] = cm.compact
    assert await compact() is None
    assert await cm.get_messages() == before


@pytest.mark.anyio
async def test_get_messages_after_compaction_is_the_full_history() -> None:
    """Compaction is view-only: the stored history is complete and unmarked."""
    cm = SimpleContextManager(max_tokens=800, compact_threshold=0.1)
    await fill(cm, 10)
    before = await cm.get_messages()
    view = await cm.get_messages_for_request()
    assert cm.last_compaction_stats is not None
    assert len(view) < len(before)
    after = await cm.get_messages()
    assert after == before
    for message in after:
        assert not {"_truncated", "_stubbed"} & set(message)
        assert not {"_truncated", "_stubbed"} & set(message["metadata"])


# -- orphan tool results ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_orphan_tool_message_never_in_a_view() -> None:
    """A tool result with no earlier call is stored but never reaches a view."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "go"})
    await cm.add_message({"role": "tool", "tool_call_id": "ghost", "content": "orphan"})
    call = {"id": "late", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    await cm.add_message({"role": "tool", "tool_call_id": "late", "content": "too early"})
    await cm.add_message({"role": "assistant", "content": None, "tool_calls": [call]})
    await cm.add_message({"role": "tool", "tool_call_id": "late", "content": "answer"})
    assert len(await cm.get_messages()) == 5
    for view in (
        await cm.get_messages_for_request(),
        await cm.get_messages_for_request_retaining(retain_contents=[]),
    ):
        contents = [m["content"] for m in view]
        assert "orphan" not in contents
        assert "too early" not in contents
        assert contents[-1] == "answer"


@pytest.mark.anyio
async def test_orphan_result_blocks_are_dropped_from_views() -> None:
    """Anthropic-style result blocks with no earlier tool_use never reach a view."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "go"})
    await cm.add_message(
        {"role": "assistant", "content": [{"type": "tool_use", "id": "u1", "name": "f"}]}
    )
    await cm.add_message(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "u1", "content": "real"},
                {"type": "tool_result", "tool_use_id": "ghost", "content": "orphan"},
            ],
        }
    )
    await cm.add_message(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}],
        }
    )
    view = await cm.get_messages_for_request()
    assert len(view) == 3
    blocks = view[2]["content"]
    assert [b["tool_use_id"] for b in blocks] == ["u1"]
    stored = await cm.get_messages()
    assert len(stored) == 4
    assert len(stored[2]["content"]) == 2


# -- estimates are computed once -----------------------------------------------------------


@pytest.mark.anyio
async def test_estimates_are_computed_once_at_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each admitted message is estimated once; repeated requests never re-estimate."""
    calls: list[str] = []
    real = estimate_module.estimate_message

    def counting(where: str) -> Any:
        def wrapper(message: Any) -> int:
            calls.append(where)
            return real(message)

        return wrapper

    monkeypatch.setattr(history_module, "estimate_message", counting("history"))
    monkeypatch.setattr(policy_module, "estimate_message", counting("policy"))
    cm = SimpleContextManager()
    await cm.add_message({"role": "system", "content": "sys"})
    await fill(cm, 5)
    assert calls == ["history"] * 11
    calls.clear()
    for _ in range(5):
        await cm.get_messages_for_request()
        await cm.get_messages_for_request_retaining(retain_contents=[])
    assert calls == []
    await cm.add_message({"role": "user", "content": "one more"})
    await cm.get_messages_for_request()
    assert calls == ["history"]


@pytest.mark.anyio
async def test_set_messages_estimates_each_message_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """set_messages estimates each message once; later requests add no estimates."""
    count = 0
    real = estimate_module.estimate_message

    def counting(message: Any) -> int:
        nonlocal count
        count += 1
        return real(message)

    monkeypatch.setattr(history_module, "estimate_message", counting)
    cm = SimpleContextManager()
    await cm.set_messages([{"role": "user", "content": f"m{i}"} for i in range(7)])
    assert count == 7
    await cm.get_messages_for_request()
    await cm.get_messages_for_request()
    assert count == 7


@pytest.mark.anyio
async def test_caller_mutating_its_dict_later_changes_nothing() -> None:
    """After admission, the caller changing its own dict or metadata changes nothing stored."""
    cm = SimpleContextManager()
    message: dict[str, Any] = {"role": "user", "content": "original", "metadata": {"k": "v"}}
    await cm.add_message(message)
    before = await cm.get_messages()
    view_before = await cm.get_messages_for_request()
    message["content"] = "changed"
    message["metadata"]["k"] = "changed"
    message["metadata"]["new"] = 1
    message["role"] = "assistant"
    assert await cm.get_messages() == before
    assert await cm.get_messages_for_request() == view_before


# -- junk content blocks (bugs found) --------------------------------------------------------

JUNK_BLOCK_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": ["x"]}]},
    {"role": "assistant", "content": [{"type": {}}]},
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "ghost"},
            {"type": "text", "text": "hi"},
            {"type": "tool_result", "tool_call_id": ["c"]},
        ],
    },
]


@pytest.mark.anyio
@pytest.mark.parametrize("junk", JUNK_BLOCK_MESSAGES, ids=["user-type", "assistant-type", "id"])
async def test_junk_block_fields_are_rejected_clearly(junk: dict[str, Any]) -> None:
    """A block with unhashable fields raises InvalidMessageError; nothing is admitted."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "kept"})
    before = await cm.get_messages()
    with pytest.raises(InvalidMessageError):
        await cm.add_message(junk)
    assert await cm.get_messages() == before


@pytest.mark.anyio
async def test_set_messages_junk_block_names_its_index() -> None:
    """A junk block in a batch raises InvalidMessageError naming the index."""
    cm = SimpleContextManager()
    with pytest.raises(InvalidMessageError) as error:
        await cm.set_messages([{"role": "user", "content": "ok"}, JUNK_BLOCK_MESSAGES[0]])
    assert error.value.index == 1


@pytest.mark.anyio
async def test_failed_admission_leaves_tool_links_unchanged() -> None:
    """A message that fails admission changes no tool-group state."""
    cm = SimpleContextManager()
    await cm.add_message({"role": "user", "content": "go"})
    await cm.add_message(
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f"}]}
    )
    unanswered = copy.deepcopy(cm._history.unanswered)
    bad = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "r"},
            {"type": "tool_result", "tool_use_id": "ghost"},
            {"type": "tool_result", "tool_use_id": ["bad"]},
        ],
    }
    with pytest.raises(InvalidMessageError, match="'tool_use_id' must be a string, got"):
        await cm.add_message(bad)
    await cm.add_message({"role": "user", "content": "next human"})
    assert cm._history.unanswered == unanswered
    assert cm._history.group_of(2) == 2
