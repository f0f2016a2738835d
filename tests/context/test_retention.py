"""Request-scoped retention and hard fit (docs/design.md sections 4.2 and 9).

Named persisted reminder bodies (the newest admitted envelope per body) are kept complete
with the first and latest human prompts; a missing body and an irreducible required set
fail closed with nothing changed; ``hard_fit=True`` targets the supplied budget and its
compaction becomes real only when ``context:compaction`` delivery starts: a cancellation
at any await before that leaves no trace, one during delivery keeps the commit.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from amplifier_module_context_simple import (
    ContextLengthError,
    RequiredContentTooLargeError,
    RetainedContentMissingError,
    SimpleContextManager,
)
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.testing import (
    CANCEL,
    FaultPlan,
    FaultyHooks,
    Prepared,
    RecordingHooks,
    Trial,
    check_view_invariants,
    faulty_factory,
    is_notice,
    snapshot,
    sweep,
)
from tests.context.strategies import FORMATS, calls, fill, results

PROSE = "The build failed because the linker could not find symbol parse_config. "
LOG = "log line: compiling module ok\n"
ENVELOPE = {"ephemeral": True, "persisted": True, "source": "hook"}
BODY = (
    "<system-reminder>Active skill: release-checklist. "
    + fill("prose", 1250)
    + "</system-reminder>"
)
SYSTEM = "You are the release assistant."

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)


def human(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def envelope(body: str) -> dict[str, Any]:
    return {"role": "user", "content": body, "metadata": dict(ENVELOPE)}


def history(*, turns: int = 12, body: str = BODY) -> list[dict[str, Any]]:
    """first human, a persisted reminder, ``turns`` tool turns, latest human."""
    messages = [human("first request: ship the release " + PROSE), envelope(body)]
    for index in range(turns):
        fmt = FORMATS[index % 3]
        messages.append(calls(fmt, [f"r{index}"]))
        messages += results(fmt, {f"r{index}": LOG * 40})
        messages += [{"role": "assistant", "content": PROSE * 3}, human(f"next {index} " + PROSE)]
    messages.append(human("latest request " + PROSE))
    return messages


async def manager_for(messages: list[dict[str, Any]], **config: Any) -> SimpleContextManager:
    config.setdefault("compaction_notice_enabled", False)
    config.setdefault("protected_tool_results", 2)
    manager = SimpleContextManager(**config)
    await manager.set_messages(copy.deepcopy(messages))
    return manager


def count_body(view: list[dict[str, Any]], body: str = BODY) -> int:
    return sum(1 for m in view if m.get("content") == body)


def total(view: list[dict[str, Any]]) -> int:
    return sum(estimate_message(m) for m in view)


# -- retention (69-71, 78-82) ------------------------------------------------------------------


async def test_retained_body_kept_complete_per_request(anyio_backend: str) -> None:
    """69: under pressure the ordinary view lacks the body; the retaining view has it once,
    fits the budget, changes no history and repeats identically; withdrawing it lets it
    age out again."""
    messages = history()
    manager = await manager_for(messages, max_tokens=1_800)
    stored = await manager.get_messages()
    ordinary = await manager.get_messages_for_request()
    assert count_body(ordinary) == 0
    kept = await manager.get_messages_for_request_retaining(retain_contents=[BODY])
    check_view_invariants(messages, kept, retained=[BODY], budget=1_800)
    assert count_body(kept) == 1
    again = await manager.get_messages_for_request_retaining(retain_contents=[BODY])
    assert again == kept
    assert await manager.get_messages() == stored
    withdrawn = await manager.get_messages_for_request_retaining(retain_contents=[])
    assert count_body(withdrawn) == 0
    assert withdrawn == await manager.get_messages_for_request()


async def test_newest_copy_of_a_repeated_body_is_retained(anyio_backend: str) -> None:
    """70: two admitted copies of a body: the view shows it once (the newest copy kept,
    the older one reducible), the history keeps both; duplicates in the request collapse."""
    messages = history()
    messages.insert(-3, envelope(BODY))
    manager = await manager_for(messages, max_tokens=1_800)
    kept = await manager.get_messages_for_request_retaining(retain_contents=[BODY, BODY])
    report = check_view_invariants(messages, kept, retained=[BODY], budget=1_800)
    assert count_body(kept) == 1
    assert len(messages) - 4 in report.mapping  # the newest copy
    assert sum(m["content"] == BODY for m in await manager.get_messages()) == 2


@pytest.mark.parametrize(
    "missing",
    [
        "not admitted",
        BODY[:-1],
        "first request: ship the release " + PROSE,  # a human prompt, not an envelope
        "ephemeral only",  # admitted without persisted=True
        "reference row",  # admitted as a reference-only envelope
    ],
)
async def test_missing_body_fails_closed(anyio_backend: str, missing: str) -> None:
    """71 (docs/orchestrators.md, "Errors"): a body no admitted persisted envelope carries raises
    RetainedContentMissingError, which is both a ContextLengthError and a ValueError;
    nothing changes and nothing lingers."""
    messages = history()
    messages.insert(
        2, {"role": "user", "content": "ephemeral only", "metadata": {"ephemeral": True}}
    )
    messages.insert(
        2,
        {
            "role": "user",
            "content": "reference row",
            "metadata": {**ENVELOPE, "amplifier_public_reference_only": True},
        },
    )
    hooks = RecordingHooks()
    manager = await manager_for(messages, max_tokens=1_800, hooks=hooks)
    await manager.get_messages_for_request()
    state = snapshot(manager)
    stored = await manager.get_messages()
    events = len(hooks.events)
    with pytest.raises(RetainedContentMissingError, match="not in admitted history") as caught:
        await manager.get_messages_for_request_retaining(retain_contents=[BODY, missing])
    assert isinstance(caught.value, ContextLengthError)
    assert isinstance(caught.value, ValueError)
    assert snapshot(manager).identical(state)
    assert await manager.get_messages() == stored and len(hooks.events) == events
    view = await manager.get_messages_for_request()
    assert count_body(view) == 0
    assert await manager.get_messages_for_request_retaining(retain_contents=[]) == view


@pytest.mark.parametrize("retain", ["a body", [1], [None], b"bytes"])
async def test_retain_contents_must_be_strings(anyio_backend: str, retain: Any) -> None:
    """``retain_contents`` is a list of strings: a bare string or non-string items are
    refused with TypeError before anything happens."""
    manager = await manager_for(history())
    with pytest.raises(TypeError):
        await manager.get_messages_for_request_retaining(retain_contents=retain)
    assert manager.last_token_meter_stats is None


async def test_irreducible_required_content_fails_closed(anyio_backend: str) -> None:
    """72: retaining a reminder larger than the budget raises ContextLengthError naming
    that required content was not discarded; no decision, stats, meter or event changes;
    a later feasible retention succeeds."""
    huge = "<system-reminder>" + fill("prose", 12_000) + "</system-reminder>"
    messages = history()
    messages.insert(3, envelope(huge))
    hooks = RecordingHooks()
    manager = await manager_for(messages, max_tokens=1_800, hooks=hooks)
    stored = await manager.get_messages()
    for hard_fit in (False, True):
        state = snapshot(manager)
        with pytest.raises(ContextLengthError, match="Required content was not discarded"):
            await manager.get_messages_for_request_retaining(
                retain_contents=[huge], hard_fit=hard_fit
            )
        assert snapshot(manager).identical(state)
        assert not manager.observable_state().removed and not manager.observable_state().stubbed
        assert not hooks.events
    assert await manager.get_messages() == stored
    kept = await manager.get_messages_for_request_retaining(retain_contents=[BODY])
    assert count_body(kept) == 1


async def test_retained_body_verbatim_at_every_pressure(anyio_backend: str) -> None:
    """At every budget, a retaining request returns a view with the body, the first and
    the latest human prompts verbatim, within the budget, or fails closed unchanged."""
    messages = history()
    manager = await manager_for(messages)
    outcomes = set()
    for budget in (50_000, 4_000, 2_500, 1_800, 1_200, 900, 600, 300):
        for hard_fit in (False, True):
            state = snapshot(manager)
            try:
                view = await manager.get_messages_for_request_retaining(
                    retain_contents=[BODY], token_budget=budget, hard_fit=hard_fit
                )
            except RequiredContentTooLargeError as error:
                # fails closed exactly when what it must keep exceeds the budget
                assert snapshot(manager).identical(state)
                assert error.budget == budget and error.required is not None
                assert error.required > budget
                outcomes.add("failed")
                continue
            outcomes.add("view")
            check_view_invariants(messages, view, retained=[BODY], budget=budget)
            assert messages[0] in view and messages[-1] in view
    assert outcomes == {"view", "failed"}


async def test_hard_fit_targets_the_supplied_budget(anyio_backend: str) -> None:
    """73: with notices off, hard fit's target is the token budget itself (1500); the same
    request without hard fit targets half of it (750); the forced view is what later
    ordinary and inactive retaining requests return (sticky decisions; the learned
    provider limit, which would cap those requests, is off here: see test_learned_limit)."""
    messages = history()
    ordinary_manager = await manager_for(messages)
    await ordinary_manager.get_messages_for_request_retaining(
        retain_contents=[], token_budget=1_500
    )
    stats = ordinary_manager.last_compaction_stats
    assert stats is not None and stats["target_tokens"] == 750

    manager = await manager_for(messages, learn_provider_limits=False)
    forced = await manager.get_messages_for_request_retaining(
        retain_contents=[], token_budget=1_500, hard_fit=True
    )
    stats = manager.last_compaction_stats
    assert stats is not None and stats["target_tokens"] == 1_500
    assert total(forced) <= 1_500
    assert await manager.get_messages_for_request() == forced
    assert await manager.get_messages_for_request_retaining(retain_contents=[]) == forced


async def test_hard_fit_with_unremovable_state_fails_without_trace(anyio_backend: str) -> None:
    """74: hard fit where loaded-tool state alone exceeds the budget: ContextLengthError,
    no stats, no meter stats, no sticky decisions, level 0, no events."""
    messages = [
        human("first"),
        {
            "role": "assistant",
            "content": fill("prose", 5000),
            "metadata": {"openai:tool_search_items": [{"name": "grep"}]},
        },
        human("latest"),
    ]
    hooks = RecordingHooks()
    manager = await manager_for(messages, max_tokens=1_000, hooks=hooks)
    with pytest.raises(ContextLengthError):
        await manager.get_messages_for_request_retaining(retain_contents=[], hard_fit=True)
    assert manager.last_compaction_stats is None and manager.last_token_meter_stats is None
    assert manager.observable_state().level == 0
    assert not (
        manager.observable_state().removed
        or manager.observable_state().truncated
        or manager.observable_state().stubbed
    )
    assert not hooks.events


async def test_hard_fit_notice_that_would_break_the_budget_is_left_out(anyio_backend: str) -> None:
    """75 (budget honesty): a hard-fit view that fits only without its notice (no reserve)
    is returned without the notice, within the budget, and the compaction is committed."""
    messages = [
        human("first " + fill("prose", 2000)),
        {"role": "developer", "content": "note: keep answers short"},
        human("latest " + fill("prose", 400)),
    ]
    hooks = RecordingHooks()
    manager = await manager_for(
        messages,
        hooks=hooks,
        compaction_notice_enabled=True,
        compaction_notice_token_reserve=0,
        protected_recent=0.0,
    )
    budget = total(messages) - 1  # removing the developer note fits; the notice does not
    view = await manager.get_messages_for_request_retaining(
        retain_contents=[], token_budget=budget, hard_fit=True
    )
    assert total(view) <= budget
    assert [m["role"] for m in view] == ["user", "user"]
    assert manager.last_compaction_stats is not None
    assert [name for name, _ in hooks.events].count("context:compaction") == 1


async def test_reminders_outside_the_human_prompts(anyio_backend: str) -> None:
    """78: machine reminders before the first and after the last human prompt do not
    displace the first/last human protection: both human prompts survive."""
    messages = [envelope("<system-reminder>before</system-reminder>" + PROSE * 5)]
    messages += history()
    messages.append(envelope("<system-reminder>after</system-reminder>" + PROSE * 5))
    manager = await manager_for(messages)
    view = await manager.get_messages_for_request(token_budget=600)
    check_view_invariants(messages, view)
    assert messages[1] in view and messages[-2] in view


async def test_level_five_keeps_required_content(anyio_backend: str) -> None:  # noqa: ASYNC910 - pytest.fail raises
    """79: at the budget where the retaining request first reaches level 5, the first
    human, the retained reminder and the latest human are intact."""
    messages = history(turns=16)
    for budget in range(total(messages), 300, -100):
        manager = await manager_for(messages)
        try:
            view = await manager.get_messages_for_request_retaining(
                retain_contents=[BODY], token_budget=budget
            )
        except ContextLengthError:
            continue
        stats = manager.last_compaction_stats
        if stats is not None and stats["strategy_level"] == 5:
            check_view_invariants(messages, view, retained=[BODY], budget=budget)
            assert messages[0] in view and messages[1] in view and messages[-1] in view
            return
    pytest.fail("no budget reached level 5")


async def test_level_eight_with_a_quoting_human_prompt(anyio_backend: str) -> None:  # noqa: ASYNC910 - pytest.fail raises
    """80: a human prompt quoting ``<system-reminders>`` XML is still a human prompt: at a
    budget where retention ends at level 8 above its target, it, the retained reminder and
    the latest human are intact."""
    quoting = human(
        "Why does my agent print <system-reminders><system-reminder>x</system-reminder>"
        "</system-reminders>? " + PROSE * 20
    )
    messages = [quoting, *history()[1:]]
    for budget in range(total(messages), 300, -100):
        manager = await manager_for(messages)
        try:
            view = await manager.get_messages_for_request_retaining(
                retain_contents=[BODY], token_budget=budget
            )
        except ContextLengthError:
            continue
        stats = manager.last_compaction_stats
        if stats is not None and stats["strategy_level"] == 8:
            assert stats["after_tokens"] > stats["target_tokens"]
            check_view_invariants(messages, view, retained=[BODY], budget=budget)
            assert quoting in view and messages[1] in view and messages[-1] in view
            return
    pytest.fail("no budget reached level 8")


async def test_transcript_round_trip_keeps_retention(anyio_backend: str) -> None:
    """81: ``get_messages`` -> a new manager's ``set_messages``: retention still works."""
    manager = await manager_for(history(), max_tokens=1_800)
    await manager.get_messages_for_request()
    resumed = SimpleContextManager(
        max_tokens=1_800, compaction_notice_enabled=False, protected_tool_results=2
    )
    await resumed.set_messages(await manager.get_messages())
    kept = await resumed.get_messages_for_request_retaining(retain_contents=[BODY])
    assert count_body(kept) == 1


async def test_hard_fit_keeps_new_turns_and_old_removals(anyio_backend: str) -> None:
    """82: after an ordinary compaction, a hard fit keeps a newly appended human prompt,
    tool call and result and the retained reminder, while earlier removals stay removed."""
    messages = history()
    manager = await manager_for(messages, protected_tool_results=1)
    await manager.get_messages_for_request(token_budget=2_000)
    removed = set(manager.observable_state().removed)
    assert removed
    new = [
        human("new question " + PROSE),
        calls("anthropic", ["fresh"]),
        *results("anthropic", {"fresh": "fresh result"}),
    ]
    for message in new:
        await manager.add_message(copy.deepcopy(message))
    view = await manager.get_messages_for_request_retaining(
        retain_contents=[BODY], token_budget=1_500, hard_fit=True
    )
    check_view_invariants([*messages, *new], view, retained=[BODY], budget=1_500)
    assert all(message in view for message in new)
    assert removed <= manager.observable_state().removed


# -- the system prompt factory --------------------------------------------------------------------


async def test_factory_awaited_once_per_request(anyio_backend: str) -> None:
    """``set_system_prompt_factory``: awaited exactly once per request on every path; its
    text replaces stored system messages; hook-sourced system messages stay after it."""
    calls_made = 0

    async def factory() -> str:
        nonlocal calls_made
        calls_made += 1
        await anyio.lowlevel.checkpoint()
        return f"{SYSTEM} #{calls_made}"

    hook_system: dict[str, Any] = {
        "role": "system",
        "content": "hook context",
        "metadata": {"source": "hook"},
    }
    messages = [{"role": "system", "content": "stored system"}, hook_system, *history()]
    manager = await manager_for(messages)
    await manager.set_system_prompt_factory(factory)
    requests: list[Callable[[], Awaitable[list[dict[str, Any]]]]] = [
        lambda: manager.get_messages_for_request(),
        lambda: manager.get_messages_for_request(token_budget=1_800),
        lambda: manager.get_messages_for_request_retaining(retain_contents=[BODY]),
        lambda: manager.get_messages_for_request_retaining(
            retain_contents=[BODY], token_budget=1_800, hard_fit=True
        ),
    ]
    for number, request in enumerate(requests, start=1):
        view = await request()
        assert calls_made == number
        assert view[:2] == [{"role": "system", "content": f"{SYSTEM} #{number}"}, hook_system]
        assert all(m.get("content") != "stored system" for m in view)
        check_view_invariants(messages, view, factory_text=f"{SYSTEM} #{number}")


async def test_factory_errors_leave_no_trace(anyio_backend: str) -> None:
    """A factory that raises or returns a non-string fails the request before anything
    changes; a non-callable factory is refused."""
    manager = await manager_for(history(), max_tokens=1_800)
    await manager.get_messages_for_request()

    async def broken() -> str:
        raise RuntimeError("factory down")

    async def wrong() -> Any:
        await anyio.lowlevel.checkpoint()
        return 42

    await manager.set_system_prompt_factory(broken)
    state = snapshot(manager)  # (a factory is set: part of the observable state)
    with pytest.raises(RuntimeError, match="factory down"):
        await manager.get_messages_for_request(token_budget=900)
    assert snapshot(manager).identical(state)
    await manager.set_system_prompt_factory(wrong)
    with pytest.raises(TypeError):
        await manager.get_messages_for_request(token_budget=900)
    assert snapshot(manager).identical(state)
    with pytest.raises(TypeError):
        await manager.set_system_prompt_factory("not callable")  # type: ignore[arg-type]  # the error under test


# -- cancellation at every await point (docs/design.md section 10) -----------------------------


async def prepared(plan: FaultPlan) -> tuple[SimpleContextManager, FaultyHooks]:
    """A manager with a prior ordinary compaction (so stats and meter stats exist), its
    factory and hooks routed through ``plan`` (disarmed while preparing)."""
    hooks = FaultyHooks(plan)
    plan.disarm()
    manager = await manager_for(history(), hooks=hooks)
    await manager.set_system_prompt_factory(faulty_factory(plan, SYSTEM))
    await manager.get_messages_for_request(token_budget=4_000)
    assert manager.last_compaction_stats is not None
    assert manager.last_token_meter_stats is not None
    plan.arm()
    return manager, hooks


REQUESTS: dict[str, dict[str, Any]] = {
    "hard_fit": {"retain_contents": [BODY], "token_budget": 1_500, "hard_fit": True},
    "retaining": {"retain_contents": [BODY], "token_budget": 1_500},
}


@pytest.mark.parametrize("kind", sorted(REQUESTS))
async def test_cancellation_at_every_await_point(anyio_backend: str, kind: str) -> None:
    """T1 sweep (``testing.sweep``) over the factory and hook seams: a cancellation before
    ``context:compaction`` delivery leaves no trace (the store's whole observable state,
    the same stats and meter objects) and a clean retry emits what the uncancelled
    request did; one during delivery keeps the commit (but not the budget mark of a
    delivery it did not finish), and the kept commit is what later requests show."""
    request = REQUESTS[kind]
    reference, _ = await prepared(FaultPlan())
    expected_view = await reference.get_messages_for_request_retaining(**request)
    stats = reference.last_compaction_stats
    assert stats is not None
    assert stats["target_tokens"] == (1_500 if request.get("hard_fit") else 750)

    async def prepare(plan: FaultPlan) -> Prepared[list[dict[str, Any]]]:
        manager, hooks = await prepared(plan)

        async def run() -> list[dict[str, Any]]:
            return await manager.get_messages_for_request_retaining(**request)

        return Prepared(manager, run, hooks, follow_up=run)

    async def check(trial: Trial[list[dict[str, Any]]]) -> None:
        # run between trials: a checkpoint here moves no await point of the request
        await anyio.lowlevel.checkpoint()
        if trial.expected == "after" and not trial.returned:  # the commit stood
            trial.plan.disarm()
            manager = trial.prepared.manager
            assert await manager.get_messages_for_request_retaining(**request) == expected_view

    report = await sweep(f"retention/{kind}", prepare, kind=CANCEL, check=check)
    assert report.labels == ["factory", "emit:context:compaction", "emit:context:budget"]
    assert (report.raised_before, report.boundary, report.returned) == (1, 2, 0)


async def test_cancelled_before_delivery_then_retried(anyio_backend: str) -> None:
    """76: a hard fit cancelled in the factory, retried, gives the same view as a clean run
    and exactly one context:compaction."""
    plan = FaultPlan(1, CANCEL)
    manager, hooks = await prepared(plan)
    with anyio.CancelScope() as scope:
        plan.scope = scope
        await manager.get_messages_for_request_retaining(**REQUESTS["hard_fit"])
    assert scope.cancelled_caught and plan.fired_label == "factory"
    compactions = hooks.started.count("context:compaction")
    plan.disarm()
    view = await manager.get_messages_for_request_retaining(**REQUESTS["hard_fit"])
    assert hooks.started.count("context:compaction") == compactions + 1
    assert count_body(view) == 1 and not is_notice(view[-1])
