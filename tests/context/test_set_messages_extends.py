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

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.estimate import estimate_message
from tests.realdata import conversations
from tests.support import replaced

pytestmark = pytest.mark.anyio

NAMES = ("openai_tau_airline_052", "anthropic_entire_4", "amplifier_geminicli_1")


class Hooks:
    def __init__(self) -> None:
        self.compactions: list[dict[str, Any]] = []

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        await checkpoint()
        if event == "context:compaction":
            self.compactions.append(data)


async def replay(messages: list[dict[str, Any]], budget: int, reset_every: int | None) -> Any:
    """Views before each assistant turn; with ``reset_every``, the whole list so far is
    re-set with ``set_messages`` every that many messages instead of appended."""
    hooks = Hooks()
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
    return views, hooks.compactions


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
