"""Compactions worth the cache they break: the floor rules, on both paths.

A compaction rewrites every cached message after its first change. When the protected
floor keeps the view above the target, re-running the ladder as the view creeps past the
trigger could only shave what the history added since, for a rewrite of the whole view on
every request. So a reported floor holds (no ladder, no event, the view's prefix unchanged)
until the view no longer fits the budget, on the ordinary path (with room for the minimal
notice) and on the negotiated one (the provider's count against the budget). And a floor
over the whole budget is reduced to the target, not merely under the budget, so that the
next request does not reduce it again.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio.lowlevel
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.rendering.notice import notice_message
from amplifier_module_context_simple.testing import RecordingHooks, is_notice, strip_notice
from tests.context.strategies import calls, fill, results
from tests.context.test_sticky import LOG, human
from tests.negotiator.orchestrator import counted, proportional


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)


def tokens(view: list[dict[str, Any]]) -> int:
    return sum(map(estimate_message, view))


def floored_history() -> list[dict[str, Any]]:
    """A protected human prompt larger than the target, then six reducible tool turns."""
    messages: list[dict[str, Any]] = [human("do this: " + fill("prose", 12_000))]
    for index in range(6):
        messages.append(calls("openai", [f"s{index}"]))
        messages += results("openai", {f"s{index}": LOG * 60})
    return messages


def floored_budget(messages: list[dict[str, Any]]) -> int:
    """A budget whose trigger the whole history is over, and whose target (half of
    budget - 800) the prompt alone is over, with room above the floor for a few turns."""
    return tokens(messages) + 1100


def tool_turn(index: int) -> list[dict[str, Any]]:
    """One short tool round: a call and its result."""
    return [calls("openai", [f"g{index}"]), *results("openai", {f"g{index}": LOG * 8})]


def fits_bound(budget: int, view: list[dict[str, Any]] | None = None, margin: float = 0.0) -> int:
    """The most a view may weigh while a reported floor holds: the budget less the margin
    kept for our estimate's error (``estimate_margin``, with no usage reported), less the
    notice it shows (made with the decision: it stays), or less the minimal notice."""
    ceiling = int(budget / (1.0 + margin))
    shown = [message for message in view or () if is_notice(message)]
    if shown:
        return ceiling - estimate_message(shown[0])
    return ceiling - min(estimate_message(notice_message({}, "minimal")), budget // 4)


@pytest.mark.anyio
@pytest.mark.parametrize("margin", [0.0, 0.06, 0.12])
async def test_a_reported_floor_holds_until_the_view_no_longer_fits_the_budget(
    margin: float,
) -> None:
    """After the floor is reported, each request compacts exactly when the view it would
    send (the previous view plus the new message) no longer fits the budget less the
    margin; until then the view only grows at its end."""
    messages = floored_history()
    budget = floored_budget(messages)
    hooks = RecordingHooks()
    context = SimpleContextManager(max_tokens=budget, hooks=hooks, estimate_margin=margin)
    await context.set_messages(messages)
    view = await context.get_messages_for_request()
    reported = context.last_compaction_stats
    assert reported is not None and reported["floor_tokens"] is not None
    events = len(hooks.named("context:compaction"))
    held = 0
    for index in range(40):
        turn = tool_turn(index)
        would = tokens(strip_notice(view)) + tokens(turn)
        view_before = view
        for message in turn:
            await context.add_message(message)
        before = strip_notice(view)
        view = await context.get_messages_for_request()
        emitted = len(hooks.named("context:compaction")) - events
        events += emitted
        bound = fits_bound(budget, view_before, margin)
        assert emitted == int(would > bound), f"request {index}"
        meter = context.last_token_meter_stats
        assert meter is not None
        past_trigger = meter["used_tokens"] >= 0.92 * (budget - 800)
        assert meter["floor_held"] is (past_trigger and not emitted), "the reason, in the stats"
        if emitted:
            break
        held += past_trigger
        assert strip_notice(view)[: len(before)] == before, "a held floor keeps the prefix"
    assert held >= 2, "the floor held over several requests past the trigger"
    assert emitted == 1, "the view outgrew the budget within 40 requests"


def big_results_history() -> list[dict[str, Any]]:
    """A short prompt, five tool results (all protected by count), a short prompt."""
    messages: list[dict[str, Any]] = [human("Read the five logs.")]
    for index in range(5):
        messages.append(calls("openai", [f"r{index}"]))
        messages += results("openai", {f"r{index}": LOG * 300})
    messages.append(human("Summarise them."))
    return messages


@pytest.mark.anyio
async def test_a_floor_over_the_whole_budget_is_reduced_to_the_target() -> None:
    """Protected results alone over the whole budget: the floor is reduced to the target
    (not merely under the budget), and the next request, one short message later, fits
    without compacting again."""
    messages = big_results_history()
    budget = tokens(messages) // 2
    hooks = RecordingHooks()
    context = SimpleContextManager(max_tokens=budget, hooks=hooks)
    await context.set_messages(messages)
    await context.get_messages_for_request()
    stats = context.last_compaction_stats
    assert stats is not None
    assert stats["protected_results_truncated"] > 0
    assert stats["after_tokens"] <= stats["target_tokens"]
    await context.add_message(human("And the sixth?"))
    await context.get_messages_for_request()
    assert len(hooks.named("context:compaction")) == 1


def floored_conversation() -> list[dict[str, Any]]:
    """A protected prompt, 8 small tool turns, a last prompt."""
    messages = [human("Plan this carefully: " + fill("prose", 6_000))]
    for index in range(8):
        messages.append(calls("openai", [f"n{index}"]))
        messages += results("openai", {f"n{index}": LOG * 20})
    messages.append(human("go on"))
    return messages


class Counting:
    """A ``count_view``: characters of the view x 0.25 (shares nothing with the estimator),
    with a hard limit far above the budget."""

    def __init__(self) -> None:
        self.rule = proportional(0.25, limit=1_000_000)
        self.views: list[list[dict[str, Any]]] = []

    async def __call__(self, view: list[dict[str, Any]]) -> dict[str, Any]:
        self.views.append(view)
        await anyio.lowlevel.checkpoint()
        return counted(self.rule, view)

    @staticmethod
    def tokens(view: list[dict[str, Any]]) -> int:
        envelope = counted(proportional(0.25, limit=1_000_000), view)
        return int(envelope["budget_decision"]["measurement"]["input_tokens"])


@pytest.mark.anyio
async def test_a_reported_floor_holds_on_the_negotiated_path() -> None:
    """A negotiation that ended at the protected floor is committed; while later requests'
    counts still fit the budget, each returns ``protected_floor`` after one count, stages
    nothing, and sends the committed view plus what was added; the first request counted
    over the budget climbs the rungs again."""
    messages = floored_conversation()
    first = Counting.tokens(messages)
    budget = int(first * 0.9)  # the first count is over the trigger, the prompt over target
    context = SimpleContextManager(token_meter="actual", max_tokens=budget)
    await context.set_messages(messages)
    counting = Counting()
    result = await context.get_measured_request_view(
        provider=None, retain_contents=[], count_view=counting
    )
    assert result["outcome"] == "protected_floor"
    assert result["transaction"] is not None and await result["transaction"].commit()
    view = result["base_view"]
    outcomes: list[tuple[str, int, bool]] = []
    for index in range(30):
        for message in tool_turn(index):
            await context.add_message(message)
        counting = Counting()
        result = await context.get_measured_request_view(
            provider=None, retain_contents=[], count_view=counting
        )
        over = counting.tokens(counting.views[0]) > budget
        outcomes.append((result["outcome"], result["count_calls"], over))
        if over:
            break
        assert result["transaction"] is None
        meter = context.last_token_meter_stats
        assert meter is not None and meter["floor_held"] is True, "the reason, in the stats"
        assert strip_notice(result["base_view"])[: len(strip_notice(view))] == strip_notice(view)
        view = result["base_view"]
    held = outcomes[:-1]
    assert held and all(outcome == ("protected_floor", 1, False) for outcome in held)
    assert outcomes[-1][2] and outcomes[-1][1] > 1, "over the budget, the rungs run again"
