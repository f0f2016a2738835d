"""Testing the thinking tests: each rule of append-only views, reverted, is caught.

Each test plants one deliberate bug into the package (monkeypatched for the test only),
replays a real conversation with thinking blocks under the oracle, and asserts the one
failure the oracle must report; the unmutated replay reports none
(``test_views.py``).

==================================================  =========================================
planted mutant                                      caught as
==================================================  =========================================
the notice is re-placed at the tail of every view   requests with an invalid block
a compaction keeps the thinking after its change    requests with an invalid block
a compaction drops the thinking before its change   valid blocks left out (none invalid)
a changed system part keeps the earlier thinking    requests with an invalid block
==================================================  =========================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import amplifier_module_context_simple.context.policy.policy as policy_module
from amplifier_module_context_simple.context.ladder.ladder import Ladder
from amplifier_module_context_simple.context.policy.plan import RequestPlan
from amplifier_module_context_simple.context.policy.policy import RequestPolicy
from amplifier_module_context_simple.context.rendering.notice import tail_is_safe
from amplifier_module_context_simple.context.rendering.render import Rendered
from tests.realdata import conversations
from tests.thinking.sessions import ordinary, replay_checked, thinking_session
from tests.thinking.test_views import with_system_changes

pytestmark = pytest.mark.anyio

CONVERSATION = next(conv for conv in conversations() if conv.name == "anthropic_entire_1")
BUDGET = 8_000


async def test_the_unmutated_replay_is_clean(anyio_backend: str) -> None:
    tally = await replay_checked(CONVERSATION.messages, ordinary(BUDGET))
    assert tally.compactions >= 2 and tally.shown > 0
    assert (tally.invalid_requests, tally.left_out) == (0, 0)


async def test_a_notice_moved_to_every_tail_is_caught(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def at_the_tail(
        view: Sequence[Mapping[str, Any]], body_seqs: Sequence[int], system_count: int, at: int
    ) -> int | None:
        return len(view) if tail_is_safe(view) else None

    monkeypatch.setattr(policy_module, "notice_position", at_the_tail)
    tally = await replay_checked(CONVERSATION.messages, ordinary(BUDGET))
    assert tally.invalid_requests > 0


async def test_a_compaction_that_keeps_later_thinking_is_caught(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Ladder, "_changing", lambda self, row: None)
    tally = await replay_checked(CONVERSATION.messages, ordinary(BUDGET))
    assert tally.invalid_requests > 0


async def test_a_compaction_that_drops_earlier_thinking_is_caught(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    changing = Ladder._changing

    def from_the_start(self: Ladder, row: int) -> None:
        changing(self, 0)

    monkeypatch.setattr(Ladder, "_changing", from_the_start)
    tally = await replay_checked(CONVERSATION.messages, ordinary(BUDGET))
    assert (tally.invalid_requests, tally.left_out > 0) == (0, True)


async def test_a_system_change_that_keeps_earlier_thinking_is_caught(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def blind(self: RequestPolicy, plan: RequestPlan, rendered: Rendered) -> RequestPlan:
        # what it shows is recorded, but never compared with the last view's
        return based(self, dataclasses.replace(plan, sent_systems=None), rendered)

    based = RequestPolicy.based
    messages = with_system_changes(thinking_session("anthropic", 30, 301), every=5)
    assert (await replay_checked(messages, ordinary(200_000))).invalid_requests == 0
    monkeypatch.setattr(RequestPolicy, "based", blind)
    tally = await replay_checked(messages, ordinary(200_000))
    assert tally.invalid_requests > 0
