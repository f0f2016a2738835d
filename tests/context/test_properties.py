"""Property tests over generated histories in all three tool formats (docs/design.md section 10).

Every view, at every pressure, on the ordinary, retaining and hard-fit paths, meets the
view invariants (docs/design.md section 10, items 1-7, 9: ``testing.check_view_invariants``)
- the providers' tool-use rules (runs, display order, synthesized results for calls a
later assistant turn left unanswered, and the independent provider oracle
``provider_rules`` for OpenAI and Anthropic), protected content verbatim, the budget of a
retaining or hard-fit request. A request that fails closed leaves no trace.

The histories (``strategies.histories``) draw per history: calls left unanswered
mid-history, results admitted before their call or after a later assistant turn, and
results whose content is a list of blocks (sometimes an image). What the runs exercised
is tallied in ``strategies.EXAMPLES`` and printed at the end of the session.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amplifier_module_context_simple import (
    ContextLengthError,
    RetainedContentMissingError,
    SimpleContextManager,
)
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.testing import (
    RecordingHooks,
    Slot,
    ViewReport,
    check_isolation,
    check_view_invariants,
    display_order,
    mutate_view,
    snapshot,
    strip_notice,
)
from tests.context.strategies import EXAMPLES, Generated, configs, histories

HUGE = 10**9
SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]

# Budgets as fractions of the history's size: a few tiny ones (every rung, the floor) and
# many near the history's size (the low rungs are reached only when little must go).
fractions = st.lists(
    st.one_of(
        st.sampled_from([0.01, 0.05, 0.15]),
        st.floats(0.5, 1.6),
        st.floats(0.8, 1.3),
        st.floats(0.9, 1.1),
    ),
    min_size=1,
    max_size=3,
)


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    """A history, a configuration, budgets and per-request options."""
    gen: Generated = draw(histories(orphans=True, max_turns=10))
    bodies = sorted(set(gen.bodies))
    return {
        "gen": gen,
        "config": draw(configs()),
        "fractions": draw(fractions),
        "via_add": draw(st.booleans()),
        "factory": draw(st.sampled_from([None, None, "You are a careful assistant."])),
        "retain": draw(st.lists(st.sampled_from(bodies), unique=True)) if bodies else [],
        "hard_fit": draw(st.booleans()),
    }


def check_view(
    history: list[dict[str, Any]],
    view: list[dict[str, Any]],
    seen: set[str] | None = None,
    **kwargs: Any,
) -> ViewReport:
    """The view oracle (the providers' rules for OpenAI and Anthropic included) on one
    view; what the view shows is added to ``seen``."""
    report = check_view_invariants(history, view, **kwargs)
    if report.media_dropped:
        EXAMPLES["views valid for OpenAI once the caller's images are dropped (tolerated)"] += 1
    if seen is not None:
        if report.synthesized:
            seen.add("a synthesized result")
        if report.list_results:
            seen.add("a list-content result")
        if report.truncated or report.stubbed:
            seen.add("reduced messages")
        if report.notice:
            seen.add("the compaction notice")
        if report.pending:
            seen.add("a pending call")
    return report


def tally(gen: Generated, seen: set[str], prefix: str = "views") -> None:
    """Count one example: what its history holds and what its views showed."""
    EXAMPLES[f"{prefix}: examples"] += 1
    if any(slot.synthesized for slot in display_order(gen.messages)):
        EXAMPLES[f"{prefix}: with an unanswered mid-history call"] += 1
    if gen.early or gen.late:
        EXAMPLES[f"{prefix}: with a result before its call or after a later turn"] += 1
    if gen.images:
        EXAMPLES[f"{prefix}: with an image block in a result"] += 1
    for what in sorted(seen):
        EXAMPLES[f"{prefix}: with {what} in a view"] += 1


async def _admit(manager: SimpleContextManager, gen: Generated, via_add: bool) -> None:  # noqa: ASYNC910 - a generated history is never empty
    if via_add:
        for message in gen.messages:
            await manager.add_message(message)
    else:
        await manager.set_messages(gen.messages)


async def run_scenario(case: dict[str, Any]) -> list[int]:
    """Run every request of ``case``, checking each view; return the new levels reached."""
    gen: Generated = case["gen"]
    config: dict[str, Any] = case["config"]
    hooks = RecordingHooks()
    manager = SimpleContextManager(**config, hooks=hooks)
    given_messages = copy.deepcopy(gen.messages)
    await _admit(manager, gen, case["via_add"])
    assert gen.messages == given_messages, "admission mutated the caller's messages"
    factory_text: str | None = case["factory"]
    if factory_text is not None:
        text = factory_text

        async def factory() -> str:
            await anyio.lowlevel.checkpoint()
            return text

        await manager.set_system_prompt_factory(factory)
    canonical = copy.deepcopy(await manager.get_messages())
    mutate_view(await manager.get_messages())  # get_messages returns copies too
    assert await manager.get_messages() == canonical
    check = {"factory_text": factory_text, "truncate_chars": config["truncate_chars"]}
    seen: set[str] = set()

    roomy = await manager.get_messages_for_request(token_budget=HUGE)
    check_view(gen.messages, roomy, seen, **check)
    total = sum(estimate_message(m) for m in roomy)
    levels: list[int] = []
    retain: list[str] = case["retain"]
    view: list[dict[str, Any]] = roomy
    budget = HUGE
    for fraction in case["fractions"]:
        budget = max(1, int(total * fraction))
        before = manager.last_compaction_stats
        view = await manager.get_messages_for_request(token_budget=budget)
        stats = manager.last_compaction_stats
        if stats is not None and stats is not before:
            levels.append(stats["strategy_level"])
        check_view(gen.messages, view, seen, **check)
        json.dumps(view)
        assert await manager.get_messages() == canonical

        state = snapshot(manager)
        events = len(hooks.events)
        try:
            kept = await manager.get_messages_for_request_retaining(
                retain_contents=retain, token_budget=budget, hard_fit=case["hard_fit"]
            )
        except RetainedContentMissingError:  # pragma: no cover - every body was admitted
            raise
        except ContextLengthError:
            assert snapshot(manager).identical(state), "a failed request left a trace"
            assert len(hooks.events) == events, "a failed request emitted an event"
        else:
            strict = bool(retain) or case["hard_fit"]
            check_view(
                gen.messages,
                kept,
                seen,
                retained=retain,
                budget=budget if strict else None,
                **check,
            )
            json.dumps(kept)
            await check_isolation(
                manager,
                kept,
                functools.partial(
                    manager.get_messages_for_request_retaining,
                    retain_contents=retain,
                    token_budget=budget,
                    hard_fit=case["hard_fit"],
                ),
            )
        assert await manager.get_messages() == canonical

    # Isolation (item 7); without a new commit the next identical request repeats the view.
    view = await manager.get_messages_for_request(token_budget=budget)
    again = await check_isolation(
        manager, view, lambda: manager.get_messages_for_request(token_budget=budget)
    )
    check_view(gen.messages, again, seen, **check)
    assert await manager.get_messages() == canonical
    tally(gen, seen)
    return levels


def test_views_meet_invariants_at_every_pressure(caplog: pytest.LogCaptureFixture) -> None:
    """500 generated histories (three formats, mixed, orphans, pending tails, calls left
    unanswered mid-history, early and late results, list-content results): every view
    meets the view oracle and the providers' rules, protected content is verbatim, failures
    leave no trace, and the budgets reach every rung of the ladder."""
    caplog.set_level(logging.ERROR)
    seen: set[int] = set()

    # Derandomized: the last assertion is about what the generator covers, so it must not
    # depend on the seed (a random run missed level 1 once in the deep profile). The growth
    # property below and the deep tier keep exploring with random seeds.
    @settings(max_examples=500, deadline=None, suppress_health_check=SUPPRESS, derandomize=True)
    @given(scenarios())
    def prop(case: dict[str, Any]) -> None:
        seen.update(anyio.run(run_scenario, case))

    prop()
    assert seen == set(range(1, 9)), f"budgets reached only levels {sorted(seen)}"


@pytest.mark.deep
def test_views_meet_invariants_deep(caplog: pytest.LogCaptureFixture) -> None:
    """The same property at the deep profile's example count."""
    caplog.set_level(logging.ERROR)

    @settings(max_examples=3000, deadline=None, suppress_health_check=SUPPRESS)
    @given(scenarios())
    def prop(case: dict[str, Any]) -> None:
        anyio.run(run_scenario, case)

    prop()


@st.composite
def growth_cases(draw: Any) -> dict[str, Any]:
    gen: Generated = draw(histories(orphans=True, max_turns=8, pending=False))
    return {
        "gen": gen,
        "config": draw(configs()),
        "split": draw(st.integers(1, max(1, len(gen.messages)))),
        "fraction": draw(st.sampled_from([0.05, 0.2, 0.5, 0.8])),
    }


async def run_growth(case: dict[str, Any]) -> None:  # noqa: ASYNC910 - a generated history is never empty
    gen: Generated = case["gen"]
    config: dict[str, Any] = case["config"]
    hooks = RecordingHooks()
    manager = SimpleContextManager(**config, hooks=hooks)
    twin = SimpleContextManager(**config)
    total = sum(estimate_message(m) for m in gen.messages)
    budget = max(1, int(total * case["fraction"]))
    admitted: list[dict[str, Any]] = []
    canonical: list[dict[str, Any]] = []
    previous: list[dict[str, Any]] = []
    order: list[Slot] = []
    for position, message in enumerate(gen.messages):
        await manager.add_message(message)
        await twin.add_message(message)
        admitted.append(message)
        if position % case["split"] and position != len(gen.messages) - 1:
            continue
        # appending never changes the canonical prefix
        stored = await manager.get_messages()
        assert stored[: len(canonical)] == canonical
        canonical = copy.deepcopy(stored)
        events = len(hooks.named("context:compaction"))
        view = await manager.get_messages_for_request(token_budget=budget)
        check_view(admitted, view, truncate_chars=config["truncate_chars"])
        # sticky: without a new compaction the previous view (minus notice) is a prefix,
        # unless the new messages were placed before earlier ones in the display order (a
        # result before a note admitted after its call, synthesized results once a run
        # closed with calls unanswered)
        body = strip_notice(view)
        extended = display_order(admitted)
        appended = extended[: len(order)] == order
        if len(hooks.named("context:compaction")) == events and appended:
            # system messages are hoisted: a new one extends the system block, the rest of
            # the view extends the conversation
            shown, before = split_systems(body), split_systems(previous)
            for part in (0, 1):
                assert shown[part][: len(before[part])] == before[part], (
                    "prefix rewritten without compaction"
                )
        if not appended:
            EXAMPLES["growth: requests after an insertion into the display order"] += 1
        previous = copy.deepcopy(body)
        order = extended
        # determinism: a twin fed the same requests gives the same view
        assert await twin.get_messages_for_request(token_budget=budget) == view


def split_systems(
    view: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A view's leading system block and the conversation after it."""
    count = 0
    while count < len(view) and view[count].get("role") == "system":
        count += 1
    return view[:count], view[count:]


def test_growth_keeps_invariants_and_is_deterministic(caplog: pytest.LogCaptureFixture) -> None:
    """Requests between admissions (growing history, sticky decisions): every view is valid
    (the oracle, both providers), a view extends the previous one (its system block and
    its conversation each extend the previous ones: system messages are hoisted) unless the
    request
    delivered context:compaction or the new messages were placed before earlier ones in the
    display order (results moved before a note, synthesized results once a run closed), two
    managers fed the same requests return identical views, and the canonical prefix never
    changes."""
    caplog.set_level(logging.ERROR)

    @settings(max_examples=100, deadline=None, suppress_health_check=SUPPRESS)
    @given(growth_cases())
    def prop(case: dict[str, Any]) -> None:
        anyio.run(run_growth, case)

    prop()
