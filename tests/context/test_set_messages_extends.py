"""``set_messages`` that keeps the past extends the history; an unrelated list replaces it.

An orchestrator that re-sets the whole list after every few turns (one real orchestrator
does, on every background-job completion) must get what one that appends gets: the same
views, the same ``context:compaction`` events and so the same prefix changes.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from anyio.lowlevel import checkpoint

from amplifier_module_context_simple import InvalidMessageError, SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.testing import RecordingHooks
from tests.realdata import conversations
from tests.support import replaced

pytestmark = pytest.mark.anyio

NAMES = ("openai_tau_airline_052", "anthropic_entire_4", "amplifier_geminicli_1")


async def replay(messages: list[dict[str, Any]], budget: int, reset_every: int | None) -> Any:
    """Views before each assistant turn; with ``reset_every``, the whole list so far is
    re-set with ``set_messages`` every that many messages instead of appended."""
    hooks = RecordingHooks()
    manager = SimpleContextManager(hooks=hooks)
    views = []
    await checkpoint()  # (for ASYNC910: the loop may not run)
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and index > 0:
            views.append(await manager.get_messages_for_request(token_budget=budget))
        if reset_every is not None and index % reset_every == reset_every - 1:
            await manager.set_messages(copy.deepcopy(messages[: index + 1]))
        else:
            await manager.add_message(copy.deepcopy(message))
    return views, hooks.named("context:compaction")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reset_every", [1, 3, 7])
async def test_re_setting_the_whole_history_is_appending(name: str, reset_every: int) -> None:
    (conversation,) = [c for c in conversations() if c.name == name]
    messages = conversation.messages
    budget = sum(estimate_message(m) for m in messages) // 4
    appended = await replay(messages, budget, None)
    re_set = await replay(messages, budget, reset_every)
    assert appended[1], "the replay must compact for the comparison to mean anything"
    assert re_set == appended


async def test_an_unrelated_list_replaces_the_history_and_its_decisions() -> None:
    (conversation,) = [c for c in conversations() if c.name == NAMES[0]]
    messages = conversation.messages
    manager = SimpleContextManager()
    await manager.set_messages(copy.deepcopy(messages))
    await manager.get_messages_for_request(token_budget=2000)
    committed = manager.last_compaction_stats
    assert committed is not None
    version = manager.version
    await manager.set_messages(replaced(messages))
    assert manager.last_compaction_stats is None
    assert manager.version[0] == version[0] + 1


async def test_an_extension_admits_only_the_new_messages_and_keeps_the_version() -> None:
    messages = [{"role": "user", "content": f"turn {k}"} for k in range(5)]
    manager = SimpleContextManager()
    await manager.set_messages(copy.deepcopy(messages[:3]))
    stored = await manager.get_messages()
    version = manager.version
    await manager.set_messages([*stored, *copy.deepcopy(messages[3:])])
    assert manager.version == version
    after = await manager.get_messages()
    assert after[:3] == stored
    assert [m["content"] for m in after] == [m["content"] for m in messages]


# -- what counts as the same message ------------------------------------------------------

NEW = {"role": "user", "content": "one more thing"}
CHANGED = 7
"""The message the in-place tests change: a person's turn in the middle of the history."""


def conversation_messages() -> list[dict[str, Any]]:
    """The caller's own list: a copy of a real conversation, with metadata on one turn."""
    (conversation,) = [c for c in conversations() if c.name == NAMES[0]]
    messages = copy.deepcopy(conversation.messages)
    assert messages[CHANGED]["role"] == "user" and isinstance(messages[CHANGED]["content"], str)
    messages[CHANGED]["metadata"] = {"source": "orchestrator"}
    return messages


async def compacted(messages: list[dict[str, Any]]) -> SimpleContextManager:
    manager = SimpleContextManager()
    await manager.set_messages(messages)
    await manager.get_messages_for_request(token_budget=2000)
    assert manager.last_compaction_stats is not None
    return manager


def as_given(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored message without the store's ``_seq`` (and without metadata left empty)."""
    metadata = {k: v for k, v in stored["metadata"].items() if k != "_seq"}
    bare = {k: v for k, v in stored.items() if k != "metadata"}
    return {**bare, "metadata": metadata} if metadata else bare


async def test_the_callers_own_unchanged_dicts_extend_the_history() -> None:
    messages = conversation_messages()
    manager = await compacted(messages)
    kept = (manager.version[0], manager.last_compaction_stats, len(messages) + 1)
    await manager.set_messages([*messages, dict(NEW)])
    after = (manager.version[0], manager.last_compaction_stats, len(await manager.get_messages()))
    assert after == kept


def _replace_content(message: dict[str, Any]) -> None:
    message["content"] = "rewritten in place"


def _add_key(message: dict[str, Any]) -> None:
    message["name"] = "added in place"


def _remove_key(message: dict[str, Any]) -> None:
    del message["content"]


def _change_metadata(message: dict[str, Any]) -> None:
    message["metadata"]["source"] = "hook"


def _add_metadata_key(message: dict[str, Any]) -> None:
    message["metadata"]["ephemeral"] = True


@pytest.mark.parametrize(
    "change",
    [_replace_content, _add_key, _remove_key, _change_metadata, _add_metadata_key],
    ids=["content replaced", "key added", "key removed", "metadata changed", "metadata added"],
)
async def test_a_message_changed_in_place_is_a_different_history(change: Any) -> None:
    """The caller edits one of the very dicts it gave (the message or its metadata dict)
    and re-sets its list: the store sees the edit, replaces the history and resets its
    decisions, and shows the message as it now is - never the stale stored one."""
    messages = conversation_messages()
    manager = await compacted(messages)
    epoch = manager.version[0]
    change(messages[CHANGED])
    await manager.set_messages([*messages, dict(NEW)])
    stored = await manager.get_messages()
    after = (manager.version[0], manager.last_compaction_stats, as_given(stored[CHANGED]))
    assert after == (epoch + 1, None, messages[CHANGED])


async def test_stored_forms_and_the_callers_copies_mixed_extend_the_history() -> None:
    """Some messages as ``get_messages`` returned them (``_seq`` in their metadata), the
    others as the caller first gave them: the same history."""
    messages = conversation_messages()
    manager = await compacted(messages)
    kept = (manager.version[0], manager.last_compaction_stats)
    stored = await manager.get_messages()
    mixed = [stored[i] if i % 2 else copy.deepcopy(m) for i, m in enumerate(messages)]
    await manager.set_messages([*mixed, dict(NEW)])
    assert (manager.version[0], manager.last_compaction_stats) == kept


def _tool_history(result_bytes: int) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * result_bytes},
    ]


async def test_under_a_narrower_cap_a_result_the_cap_would_clip_is_a_different_history() -> None:
    """Compared as a provider would see it: capped. A result admitted whole that the
    narrower cap now clips is not the stored message; the history is replaced, clipped."""
    messages = _tool_history(6000)
    manager = SimpleContextManager()
    await manager.set_messages(messages)
    epoch = manager.version[0]
    manager.max_tool_result_bytes = 4096
    await manager.set_messages([*messages, dict(NEW)])
    stored = await manager.get_messages()
    assert (manager.version[0], len(stored[2]["content"].encode()) <= 4096) == (epoch + 1, True)


async def test_under_a_wider_cap_the_same_messages_extend_the_history() -> None:
    messages = _tool_history(6000)
    manager = SimpleContextManager(max_tool_result_bytes=4096)
    await manager.set_messages(messages)
    clipped = (await manager.get_messages())[2]["content"]
    epoch = manager.version[0]
    manager.max_tool_result_bytes = 8192
    await manager.set_messages([*messages[:2], {**messages[2], "content": clipped}, dict(NEW)])
    assert manager.version[0] == epoch


@pytest.mark.parametrize("bad", ["not a message", {"role": 7, "content": "x"}])
async def test_a_malformed_message_in_the_prefix_names_its_index_and_changes_nothing(
    bad: Any,
) -> None:
    messages = conversation_messages()
    manager = await compacted(messages)
    before = (manager.version, manager.last_compaction_stats, await manager.get_messages())
    offered: list[Any] = [*messages, dict(NEW)]
    offered[3] = bad
    with pytest.raises(InvalidMessageError) as raised:
        await manager.set_messages(offered)
    after = (manager.version, manager.last_compaction_stats, await manager.get_messages())
    assert (raised.value.index, after) == (3, before)
