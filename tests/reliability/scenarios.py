"""Scenarios behind the T9/T10 properties (also run against planted mutants in
``test_mutants.py``): admit a history, request views at several pressures on the ordinary,
retaining/hard-fit and negotiated paths, and check every view."""

from __future__ import annotations

import functools
import json
from typing import Any

import anyio
from hypothesis import strategies as st

from amplifier_module_context_simple import (
    ContextLengthError,
    RequiredContentTooLargeError,
    RetainedContentMissingError,
    SimpleContextManager,
)
from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.errors import CountContractError
from amplifier_module_context_simple.negotiator.transaction import RequestTransaction, TxnState
from amplifier_module_context_simple.testing import (
    FaultyHooks,
    check_isolation,
    check_view_invariants,
    freeze,
    snapshot,
)
from tests.negotiator.orchestrator import counted, proportional
from tests.reliability.harness import EXAMPLES, LIMIT, PROMPT, mixed_history, track_transactions
from tests.reliability.strategies import History, histories

RESERVE = 800

configs = st.fixed_dictionaries(
    {
        "protected_tool_results": st.integers(0, 4),
        "protected_recent": st.sampled_from([0.0, 0.3, 0.6]),
        "truncate_chars": st.sampled_from([0, 40, 250]),
        "target_usage": st.sampled_from([0.3, 0.5, 0.8]),
        "compact_threshold": st.sampled_from([0.5, 0.92]),
        "compaction_notice_enabled": st.booleans(),
        "compaction_notice_verbosity": st.sampled_from(["minimal", "normal", "verbose"]),
    }
)
fractions = st.lists(
    st.one_of(st.sampled_from([0.02, 0.1, 0.3]), st.floats(0.4, 1.3)), min_size=1, max_size=3
)


def admitted_envelope(body: str, history: list[Any]) -> bool:
    """``body`` is the content of an admitted persisted reminder envelope (a user message
    with ``ephemeral`` and ``persisted`` true, not a history-only reference row)."""
    for message in history:
        metadata = message.get("metadata") if isinstance(message, dict) else None
        if (
            isinstance(metadata, dict)
            and message.get("role") == "user"
            and message.get("content") == body
            and metadata.get("ephemeral") is True
            and metadata.get("persisted") is True
            and metadata.get("amplifier_public_reference_only") is not True
        ):
            return True
    return False


def total_tokens(messages: list[Any]) -> int:
    return sum(estimate_message(m) for m in messages if isinstance(m, dict))


async def admit(manager: SimpleContextManager, messages: list[Any], via_add: bool) -> list[Any]:
    """Admit ``messages``; return the ones accepted (rejections must change nothing)."""
    if not via_add:
        await manager.set_messages(messages)
        return list(messages)
    accepted: list[Any] = []
    for message in messages:
        before = snapshot(manager)
        try:
            await manager.add_message(message)
        except (ValueError, TypeError):
            assert snapshot(manager) == before, "a rejected message changed the store"
            continue
        accepted.append(message)
    return accepted  # noqa: ASYNC910 - an empty batch has nothing to admit, nothing to await


def check(history: list[Any], view: Any, **kwargs: Any) -> None:
    """Every view meets the view oracle (``testing.check_view_invariants``: pairing by id,
    protected content, order, no invention, the providers' rules for OpenAI and Anthropic)
    against the admitted history or the stored one, and serialises."""
    report = check_view_invariants(history, view, **kwargs)
    json.dumps(view)  # even for a history that does not serialise (item 9 asks less)
    if report.list_results:
        EXAMPLES["views with a list-content result"] += 1
    if report.reduced:
        EXAMPLES["views with reduced messages"] += 1
    if report.notice:
        EXAMPLES["views with the compaction notice"] += 1
    if report.pending:
        EXAMPLES["views with a pending call"] += 1
    if report.synthesized:
        EXAMPLES["views with a synthesized result"] += 1


async def settle(
    manager: SimpleContextManager,
    history: list[Any],
    view: Any,
    budget: int,
    **kwargs: Any,
) -> Any:
    """Repeat the request until the view is stable (sticky decisions only grow, so it gets
    there); every view on the way is checked. Returns the stable view."""
    for _ in range(len(history) + 2):
        again = await manager.get_messages_for_request(token_budget=budget)
        if freeze(again) == freeze(view):
            return again
        EXAMPLES["identical repeat requests that compacted further"] += 1
        check(history, again, **kwargs)
        view = again
    raise AssertionError("repeating a request never reached a stable view")


async def requests(
    manager: SimpleContextManager,
    history: list[Any],
    budgets: list[int],
    *,
    factory_text: str | None,
    retain: list[str],
    hard_fit: bool,
) -> list[Any]:
    """Ordinary and retaining requests at each budget, every view checked; return the views."""
    views: list[Any] = []
    for budget in budgets:
        stored = manager.messages
        view = await manager.get_messages_for_request(token_budget=budget)
        check(history, view, factory_text=factory_text)
        check(stored, view, factory_text=factory_text, canonical=manager.messages)
        views.append(freeze(view))
        view = await settle(manager, history, view, budget, factory_text=factory_text)
        await check_isolation(
            manager, view, functools.partial(manager.get_messages_for_request, token_budget=budget)
        )
        if retain or hard_fit:
            before = snapshot(manager)
            try:
                kept = await manager.get_messages_for_request_retaining(
                    retain_contents=retain, token_budget=budget, hard_fit=hard_fit
                )
            except RetainedContentMissingError:
                # fails closed exactly when a body is no admitted envelope's content
                assert snapshot(manager).identical(before), "fail-closed left a trace"
                assert not all(admitted_envelope(body, history) for body in retain)
                views.append("RetainedContentMissingError")
                EXAMPLES["retaining requests that failed closed (body missing)"] += 1
                continue
            except RequiredContentTooLargeError as error:
                # fails closed exactly when what it must keep exceeds the budget
                assert snapshot(manager).identical(before), "fail-closed left a trace"
                assert error.budget == budget, error
                assert error.required is not None and error.required > budget, error
                views.append("RequiredContentTooLargeError")
                EXAMPLES["retaining requests that failed closed (required > budget)"] += 1
                continue
            assert all(admitted_envelope(body, history) for body in retain)
            check(history, kept, factory_text=factory_text, retained=retain, budget=budget)
            views.append(freeze(kept))
    return views  # noqa: ASYNC910 - budgets is never empty (fractions draws at least one)


async def measured(history: list[Any], config: dict[str, Any], budget: int) -> Any:
    """A negotiated request, committed; every candidate view the negotiation counts, its
    final view and the committed decisions' later views are checked."""
    manager = SimpleContextManager(**config, token_meter="actual", max_tokens=budget)
    await manager.set_messages(history)
    rule = proportional(0.3, limit=LIMIT)

    async def count_view(view: list[dict[str, Any]]) -> Any:
        await anyio.lowlevel.checkpoint()  # a provider count is an await
        check(history, view)
        EXAMPLES["negotiated candidate views"] += 1
        return counted(rule, view)

    with track_transactions() as ledger:
        result = await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=count_view
        )
    check(history, result["base_view"])
    transaction = result["transaction"]
    if transaction is not None:
        assert transaction.state is TxnState.READY
        assert await transaction.commit() is True
        assert manager._decisions is ledger.machine_of(transaction).staged.decisions
        assert manager.last_compaction_stats is transaction.stats
    check(history, await manager.get_messages_for_request(token_budget=budget))
    return freeze(result["base_view"])


async def scenario(case: dict[str, Any]) -> list[Any]:
    history: History = case["history"]
    manager = SimpleContextManager(**case["config"], hooks=FaultyHooks())
    accepted = await admit(manager, history.messages, case["via_add"])
    factory_text = PROMPT if case["factory"] else None
    if factory_text is not None:

        async def factory() -> str:
            await anyio.lowlevel.checkpoint()
            return PROMPT

        await manager.set_system_prompt_factory(factory)
    size = total_tokens(accepted) + RESERVE
    budgets = [max(1, int(size * f)) + RESERVE for f in case["fractions"]]
    views = await requests(
        manager,
        accepted,
        budgets,
        factory_text=factory_text,
        retain=case["retain"],
        hard_fit=case["hard_fit"],
    )
    views.append(await measured(accepted, case["config"], budgets[0]))
    tally(history)
    return views


def tally(history: History) -> None:
    """Count one T9 example by what its history holds."""
    if history.unanswered:
        EXAMPLES["T9 histories with a call left unanswered mid-history"] += 1
    if history.early or history.late:
        EXAMPLES["T9 histories with a result before its call or after a later turn"] += 1
    if history.list_results:
        EXAMPLES["T9 histories with a list-content result"] += 1
    if history.images:
        EXAMPLES["T9 histories with an image block in a result"] += 1


@st.composite
def cases(draw: Any, history: st.SearchStrategy[History] | None = None) -> dict[str, Any]:
    gen: History = draw(history if history is not None else histories())
    bodies = sorted(set(gen.bodies))
    return {
        "history": gen,
        "config": draw(configs),
        "fractions": draw(fractions),
        "via_add": draw(st.booleans()),
        "factory": draw(st.booleans()),
        "retain": draw(st.lists(st.sampled_from(bodies), unique=True)) if bodies else [],
        "hard_fit": draw(st.booleans()),
    }


async def corrupted_scenario(
    data: tuple[History, str, list[Any]],
    via_add: bool,
    config: dict[str, Any],
    fraction: float,
    retain: list[str],
) -> None:
    """T10 for one corrupted history: a clear rejection (store unchanged) or valid views."""
    original, kind, messages = data
    EXAMPLES[f"T10 corruption: {kind}"] += 1
    manager = SimpleContextManager(**config, hooks=FaultyHooks())
    await manager.set_messages(original.messages[:2])
    before = snapshot(manager)
    if via_add:
        accepted = await admit(manager, messages, via_add=True)
        accepted = list(original.messages[:2]) + accepted
    else:
        try:
            await manager.set_messages(messages)
        except (ValueError, TypeError):
            EXAMPLES["T10 rejected with ValueError/TypeError"] += 1
            after = snapshot(manager)
            assert after == before and after.same_objects(before), "a rejected batch left a trace"
            return
        accepted = messages
    EXAMPLES["T10 accepted"] += 1
    size = total_tokens(accepted) + RESERVE
    budget = max(1, int(size * fraction)) + RESERVE
    bodies = [
        b for b in retain if any(isinstance(m, dict) and m.get("content") == b for m in accepted)
    ]
    await requests(manager, accepted, [budget], factory_text=None, retain=bodies, hard_fit=True)
    await measured(accepted, config, budget)


# -- T6: the oracle for one negotiated request with bad seam values ------------------------------

HISTORY = mixed_history(1200)
OUTCOMES = {"not_needed", "target_reached", "protected_floor", "reduced_output"}
OUTCOMES.add("measurement_unavailable")
TYPED = (CountContractError, ContextLengthError)


def _count_field(value: Any) -> bool:
    return value is None or (type(value) is int and value >= 0)


async def measured_store(**config: Any) -> SimpleContextManager:
    settings = {"token_meter": "actual", "max_tokens": 3000, "protected_tool_results": 1}
    manager = SimpleContextManager(**{**settings, **config}, hooks=FaultyHooks())
    await manager.set_messages(HISTORY)
    return manager


async def negotiate_and_judge(
    manager: SimpleContextManager, count_view: Any, fit_output: Any = None
) -> str:
    """Run one negotiated request; check the outcome against the T6 oracle."""
    before = snapshot(manager)
    with track_transactions() as ledger:
        try:
            result = await manager.get_measured_request_view(
                provider=None, retain_contents=[], count_view=count_view, fit_output=fit_output
            )
        except TYPED as error:
            after = snapshot(manager)
            assert after == before and after.same_objects(before), error
            assert [t.state for t in ledger.created] == [TxnState.ROLLED_BACK]
            return type(error).__name__  # noqa: ASYNC910 - the awaited request raised: the result
    assert result["outcome"] in OUTCOMES, result
    assert _count_field(result["measured_before"]), result
    assert _count_field(result["measured_after"]), result
    assert type(result["count_calls"]) is int and result["count_calls"] >= 1, result
    check_view_invariants(HISTORY, result["base_view"], factory_text=None)
    transaction = result["transaction"]
    ours = None if transaction is None else ledger.machine_of(transaction)
    assert len(ledger.created) == 1 and (ours is None or ours in ledger.created)
    for created in ledger.created:
        assert created is ours or created.state is TxnState.ROLLED_BACK
    if transaction is not None:
        assert transaction.state is TxnState.READY
        assert await transaction.commit() is True
    view = await manager.get_messages_for_request(token_budget=3000)
    check_view_invariants(HISTORY, view)  # the committed decisions give valid views
    return str(result["outcome"])


# -- T12: concurrent negotiations ---------------------------------------------------------------


async def pause(n: int) -> None:  # noqa: ASYNC910 - n = 0 is a drawn interleaving: no checkpoint
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


def store() -> SimpleContextManager:
    return SimpleContextManager(token_meter="actual", max_tokens=3000, protected_tool_results=1)


def slow_count(scale: float, waits: list[int]) -> Any:
    calls = 0

    async def count_view(view: list[dict[str, Any]]) -> Any:
        nonlocal calls
        await pause(waits[calls % len(waits)])
        calls += 1
        return counted(proportional(scale, limit=LIMIT), view)

    return count_view


async def concurrent_negotiations(
    waits: list[list[int]], commit_waits: list[int], scales: list[float]
) -> None:
    """Negotiate concurrently, then commit concurrently: the first commit wins."""
    manager = store()
    await manager.set_messages(HISTORY)
    base = snapshot(manager)
    results: list[dict[str, Any]] = []

    async def negotiate(i: int) -> None:
        results.append(
            await manager.get_measured_request_view(
                provider=None,
                retain_contents=[],
                count_view=slow_count(scales[i], waits[i]),
            )
        )

    with track_transactions() as ledger:
        async with anyio.create_task_group() as group:
            for i in range(len(waits)):
                group.start_soon(negotiate, i)
    assert snapshot(manager).decisions_ref == base.decisions_ref  # nothing applied yet
    transactions = [r["transaction"] for r in results if r["transaction"] is not None]
    assert all(t.state is TxnState.READY for t in transactions)
    outcomes: dict[int, bool] = {}
    order: list[int] = []

    async def commit(i: int, transaction: RequestTransaction) -> None:
        await pause(commit_waits[i])
        outcomes[i] = await transaction.commit()
        order.append(i)

    async with anyio.create_task_group() as group:
        for i, transaction in enumerate(transactions):
            group.start_soon(commit, i, transaction)
    winners = [i for i, ok in outcomes.items() if ok]
    assert len(winners) == min(1, len(transactions)), f"commits won: {outcomes}"
    if winners:
        (winner,) = winners
        assert order[0] == winner  # the first commit wins
        assert manager._decisions is ledger.machine_of(transactions[winner]).staged.decisions
        assert manager.last_compaction_stats is transactions[winner].stats
        assert manager.version == (base.version[0], base.version[1] + 1)
    for i, transaction in enumerate(transactions):
        if i not in winners:
            assert transaction.conflict and transaction.state is TxnState.ROLLED_BACK
    check_view_invariants(HISTORY, await manager.get_messages_for_request(token_budget=3000))
