"""Bad values from every seam, and bad arguments (docs/design.md sections 5.4 and 9).

``count_view`` envelopes with negative, bool, float, NaN, huge, string or missing counts and
non-dict shapes; ``fit_output`` garbage; seams that mutate the view they are given; a
factory returning a non-string or not being async; hooks that raise, return garbage or are
not callable; bad request arguments. Each ends either in a typed error
(``CountContractError``/``TypeError``, ``ContextLengthError``, ``ValueError``) with the store
exactly as before and every transaction rolled back, or in a valid result whose view meets
the invariants and whose commit yields valid later views - never an ``AttributeError``,
``KeyError``, ``IndexError`` or any other error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from amplifier_module_context_simple import (
    ContextLengthError,
    RetainedContentMissingError,
    SimpleContextManager,
)
from amplifier_module_context_simple.negotiator.transaction import TxnState
from amplifier_module_context_simple.testing import (
    RecordingHooks,
    check_view_invariants,
    mutate_view,
    snapshot,
)
from tests.negotiator.orchestrator import counted, counting, proportional
from tests.reliability.harness import (
    EXAMPLES,
    LIMIT,
    PROMPT,
    REMINDER,
    hsettings,
    track_transactions,
)
from tests.reliability.scenarios import HISTORY, measured_store, negotiate_and_judge
from tests.reliability.strategies import envelopes, fit_results


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@hsettings()
@given(
    answers=st.lists(envelopes, min_size=1, max_size=9),
    good_first=st.booleans(),
    every_rung=st.booleans(),
)
async def test_garbage_count_envelopes(
    answers: list[Any], good_first: bool, every_rung: bool, anyio_backend: str
) -> None:
    """Each count_view call answers the next garbage envelope (a valid first count, when
    drawn, takes the request deep into the ladder first); then valid counts."""
    EXAMPLES["T6 count_view envelopes"] += 1
    manager = await measured_store(count_every_rung=every_rung)
    script = list(answers)
    good = proportional(0.3, limit=LIMIT)

    async def count_view(view: list[dict[str, Any]]) -> Any:
        await anyio.lowlevel.checkpoint()
        if good_first and not getattr(count_view, "started", False):
            count_view.started = True  # type: ignore[attr-defined]  # a flag on the function
            return counted(good, view)
        return script.pop(0) if script else counted(good, view)

    outcome = await negotiate_and_judge(manager, count_view)
    EXAMPLES[f"T6 count_view -> {outcome}"] += 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@hsettings()
@given(result=fit_results)
async def test_garbage_fit_output_results(result: Any, anyio_backend: str) -> None:
    EXAMPLES["T6 fit_output results"] += 1
    manager = await measured_store()

    async def fit_output(view: list[dict[str, Any]], attempt: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        return result

    outcome = await negotiate_and_judge(
        manager, counting(proportional(0.3, limit=1500, oversize=True)), fit_output
    )
    EXAMPLES[f"T6 fit_output -> {outcome}"] += 1


COUNTS = [-1, 0, True, False, 1.5, math.nan, math.inf, 10**18, "12", None, [3], {"n": 3}]


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["input_tokens", "estimated_input_tokens", "input_limit_tokens"])
@pytest.mark.parametrize("value", COUNTS, ids=[repr(v) for v in COUNTS])
async def test_each_bad_count_value(field: str, value: Any, anyio_backend: str) -> None:
    manager = await measured_store()

    async def count_view(view: list[dict[str, Any]]) -> Any:
        await anyio.lowlevel.checkpoint()
        envelope = counted(proportional(0.3, limit=LIMIT), view)
        decision = envelope["budget_decision"]
        if field == "input_tokens":
            decision["measurement"][field] = value
        else:
            decision[field] = value
        return envelope

    await negotiate_and_judge(manager, count_view)


NOT_ENVELOPES: list[Any] = [
    None,
    5,
    "x",
    [],
    {},
    {"budget_decision": None},
    {"dispatch": 1, "budget_decision": 5},
]


@pytest.mark.anyio
@pytest.mark.parametrize("envelope", NOT_ENVELOPES, ids=[repr(e) for e in NOT_ENVELOPES])
async def test_non_envelopes_fail_typed(envelope: Any, anyio_backend: str) -> None:
    manager = await measured_store()

    async def count_view(view: list[dict[str, Any]]) -> Any:
        await anyio.lowlevel.checkpoint()
        return envelope

    assert await negotiate_and_judge(manager, count_view) == "CountContractError"


@pytest.mark.anyio
async def test_a_sync_count_view_fails_typed(anyio_backend: str) -> None:
    manager = await measured_store()
    before = snapshot(manager)
    with track_transactions() as ledger, pytest.raises(TypeError):
        await manager.get_measured_request_view(
            provider=None,
            retain_contents=[],
            count_view=proportional(0.3, limit=LIMIT),  # type: ignore[arg-type]  # sync: the error under test
        )
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)
    assert [t.state for t in ledger.created] == [TxnState.ROLLED_BACK]


Mutation = Callable[[list[dict[str, Any]]], None]
MUTATIONS: dict[str, Mutation] = {
    "mutate-keys": mutate_view,
    "drop-tool-results": lambda view: view.__setitem__(
        slice(None), [m for m in view if m.get("role") != "tool"]
    ),
    "grow": lambda view: view.extend(dict(m) for m in list(view)),
    "clear": lambda view: view.clear(),
}


@pytest.mark.anyio
@pytest.mark.parametrize("seam", ["count_view", "fit_output"])
@pytest.mark.parametrize("name", sorted(MUTATIONS))
async def test_a_seam_mutating_its_view_changes_nothing_stored(
    seam: str, name: str, anyio_backend: str
) -> None:
    """Views handed to seams are the orchestrator's: mutating them in place (setting and
    deleting keys, dropping results, growing, clearing) changes neither the history nor the
    decisions; later views stay valid. The returned ``base_view`` is the very list the seam
    was given (so an orchestrator that trims it in place sees its own edit)."""
    manager = await measured_store()
    stored = manager.messages
    mutate = MUTATIONS[name]
    given: list[list[dict[str, Any]]] = []
    rule = proportional(0.3, limit=1500, oversize=seam == "fit_output")

    async def count_view(view: list[dict[str, Any]]) -> Any:
        await anyio.lowlevel.checkpoint()
        envelope = counted(rule, view)
        if seam == "count_view":
            given.append(view)
            mutate(view)
        return envelope

    async def fit_output(view: list[dict[str, Any]], attempt: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        given.append(view)
        mutate(view)
        return {
            "dispatch": {},
            "budget_decision": {
                "estimated_input_tokens": 1400,
                "input_limit_tokens": 1500,
                "measurement": {"kind": "provider_count", "source": "t", "input_tokens": 1400},
            },
            "count_calls": 1,
        }

    result = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=count_view, fit_output=fit_output
    )
    assert manager.messages == stored
    assert any(result["base_view"] is view for view in given)
    transaction = result["transaction"]
    if transaction is not None:
        assert await transaction.commit() is True
    for _ in range(2):
        check_view_invariants(HISTORY, await manager.get_messages_for_request(token_budget=3000))
    assert manager.messages == stored


NON_STRINGS = [None, 5, b"prompt", ["prompt"], {"prompt": 1}, 1.5, True]


@pytest.mark.anyio
@pytest.mark.parametrize("value", NON_STRINGS, ids=[repr(v) for v in NON_STRINGS])
@pytest.mark.parametrize("path", ["ordinary", "hard_fit", "measured"])
async def test_a_factory_returning_a_non_string(value: Any, path: str, anyio_backend: str) -> None:
    manager = await measured_store()

    async def factory() -> Any:
        await anyio.lowlevel.checkpoint()
        return value

    await manager.set_system_prompt_factory(factory)
    before = snapshot(manager)
    with pytest.raises(TypeError, match="system prompt factory"):
        if path == "ordinary":
            await manager.get_messages_for_request(token_budget=2400)
        elif path == "hard_fit":
            await manager.get_messages_for_request_retaining(
                retain_contents=[], token_budget=2400, hard_fit=True
            )
        else:
            await manager.get_measured_request_view(
                provider=None,
                retain_contents=[],
                count_view=counting(proportional(0.3, limit=LIMIT)),
            )
    after = snapshot(manager)
    assert after == before and after.same_objects(before)


@pytest.mark.anyio
async def test_a_sync_factory_fails_typed(anyio_backend: str) -> None:
    manager = await measured_store()
    await manager.set_system_prompt_factory(lambda: PROMPT)  # type: ignore[arg-type,return-value]  # sync: the error under test
    before = snapshot(manager)
    with pytest.raises(TypeError):
        await manager.get_messages_for_request(token_budget=2400)
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)
    with pytest.raises(TypeError):
        await manager.set_system_prompt_factory("not callable")  # type: ignore[arg-type]  # the error under test


class RaisingHooks:
    async def emit(self, event: str, data: dict[str, Any]) -> Any:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError(event)


class GarbageHooks:
    async def emit(self, event: str, data: dict[str, Any]) -> Any:
        await anyio.lowlevel.checkpoint()
        return {"action": "deny", "garbage": object()}


class SyncHooks:
    def emit(self, event: str, data: dict[str, Any]) -> Any:
        return None


class JunkEmitHooks:
    emit = 5


HOOKS: dict[str, Any] = {
    "raising": RaisingHooks(),
    "garbage": GarbageHooks(),
    "sync-emit": SyncHooks(),
    "emit-not-callable": JunkEmitHooks(),
    "no-emit": object(),
    "none": None,
}


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(HOOKS))
async def test_bad_hooks_never_break_a_request(name: str, anyio_backend: str) -> None:
    """Delivery failures are logged, never raised; the request commits as without hooks."""
    reference = SimpleContextManager(protected_tool_results=1)
    await reference.set_messages(HISTORY)
    expected = await reference.get_messages_for_request(token_budget=2400)
    manager = SimpleContextManager(protected_tool_results=1, hooks=HOOKS[name])
    await manager.set_messages(HISTORY)
    view = await manager.get_messages_for_request(token_budget=2400)
    assert view == expected
    assert snapshot(manager) == snapshot(reference)
    check_view_invariants(HISTORY, view)
    stats = manager.last_compaction_stats
    assert stats is not None and stats["strategy_level"] > 0  # the payload is still intact


BAD_BUDGETS = [0, -1, True, 1.5, "100", math.nan, [100]]


@pytest.mark.anyio
@pytest.mark.parametrize("budget", BAD_BUDGETS, ids=[repr(b) for b in BAD_BUDGETS])
async def test_bad_token_budgets(budget: Any, anyio_backend: str) -> None:
    manager = await measured_store()
    before = snapshot(manager)
    with pytest.raises(ValueError, match="token_budget"):
        await manager.get_messages_for_request(token_budget=budget)
    with pytest.raises(ValueError, match="token_budget"):
        await manager.get_messages_for_request_retaining(
            retain_contents=[], token_budget=budget, hard_fit=True
        )
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)


@pytest.mark.anyio
async def test_bad_request_arguments(anyio_backend: str) -> None:
    manager = await measured_store()
    before = snapshot(manager)
    count_view = counting(proportional(0.3, limit=LIMIT))
    for retain in ("body", [1], [None], None):
        with pytest.raises(TypeError):
            await manager.get_messages_for_request_retaining(retain_contents=retain)  # type: ignore[arg-type]  # bad on purpose
        with pytest.raises(TypeError):
            await manager.get_measured_request_view(
                provider=None,
                retain_contents=retain,  # type: ignore[arg-type]  # bad on purpose
                count_view=count_view,
            )
    with pytest.raises(TypeError):
        await manager.get_messages_for_request_retaining(retain_contents=[], hard_fit="yes")  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(TypeError):
        await manager.get_measured_request_view(
            provider=None,
            retain_contents=[],
            count_view=5,  # type: ignore[arg-type]  # bad on purpose
        )
    with pytest.raises(TypeError):
        await manager.get_measured_request_view(
            provider=None,
            retain_contents=[],
            count_view=count_view,
            fit_output="fit",  # type: ignore[arg-type]  # bad on purpose
        )
    with pytest.raises(RetainedContentMissingError):
        await manager.get_messages_for_request_retaining(retain_contents=["not admitted"])
    with pytest.raises(ContextLengthError):
        await manager.get_measured_request_view(
            provider=None, retain_contents=["not admitted"], count_view=count_view
        )
    estimate = SimpleContextManager()  # token_meter "estimate"
    with pytest.raises(RuntimeError):
        await estimate.get_measured_request_view(
            provider=None, retain_contents=[], count_view=count_view
        )
    after = snapshot(manager)
    assert after == before and after.same_objects(before)


class BrokenProvider:
    def get_model_info(self) -> Any:
        raise RuntimeError("model info unavailable")

    def get_info(self) -> Any:
        return type("Info", (), {"defaults": {"context_window": "big", "max_output_tokens": -5}})()


class JunkInfoProvider:
    def get_model_info(self) -> Any:
        return type("Info", (), {"context_window": 1.5, "max_output_tokens": True})()

    get_info = 5


FALLBACK_BUDGET = {
    "source": "max_tokens_fallback",
    "derived_budget": 2400,
    "max_tokens": None,
    "max_tokens_fallback": 2400,
    "capped": False,
    "effective_budget": 2400,
}


@pytest.mark.anyio
@pytest.mark.parametrize("provider", [BrokenProvider(), JunkInfoProvider(), object(), 5])
async def test_a_broken_provider_falls_back_to_the_configured_budget(
    provider: Any, anyio_backend: str
) -> None:
    """A provider whose window cannot be read (its methods raise, return junk, are missing,
    or it is not a provider at all) is ignored: the budget is ``max_tokens_fallback``
    (2400), reported once on ``context:budget`` with that source; the views fit it, meet
    the invariants and equal the views of the same store asked without a provider."""
    hooks = RecordingHooks()
    manager = SimpleContextManager(max_tokens_fallback=2400, protected_tool_results=1, hooks=hooks)
    twin = SimpleContextManager(max_tokens_fallback=2400, protected_tool_results=1)
    await manager.set_messages(HISTORY)
    await twin.set_messages(HISTORY)
    view = await manager.get_messages_for_request(provider=provider)
    assert hooks.named("context:budget") == [FALLBACK_BUDGET]
    meter = manager.last_token_meter_stats
    assert meter is not None and meter["budget"] == 2400 - 2400 // 4  # less the notice reserve
    check_view_invariants(HISTORY, view, budget=2400)
    assert view == await twin.get_messages_for_request()
    kept = await manager.get_messages_for_request_retaining(
        retain_contents=[REMINDER], provider=provider, hard_fit=True
    )
    check_view_invariants(HISTORY, kept, retained=[REMINDER], budget=2400)
    assert kept == await twin.get_messages_for_request_retaining(
        retain_contents=[REMINDER], hard_fit=True
    )
    assert hooks.named("context:budget") == [FALLBACK_BUDGET]  # unchanged: not delivered again
