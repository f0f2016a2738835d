"""Compound faults (docs/design.md section 10): a fault while the store is already failing.

The module's failure paths are synchronous (rollback discards the staged transaction), so
a second fault can only come from a seam that is still reached: hook delivery, the
caller's ``is_cancelled`` predicate, or an error raised inside an already cancelled scope.
In every case the ORIGINAL error is what propagates (the very same object) and the store is
exactly as before - or, past a boundary delivery, exactly the no-fault after.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.negotiator.transaction import RequestTransaction, TxnState
from amplifier_module_context_simple.testing import (
    CANCEL,
    ERROR,
    FaultPlan,
    FaultyHooks,
    InjectedFault,
    Prepared,
    Trial,
    snapshot,
    sweep,
)
from tests.negotiator.orchestrator import counted, counting, proportional
from tests.reliability.harness import (
    LIMIT,
    PROMPT,
    Operation,
    build,
    checker,
    mixed_history,
    record,
    track_transactions,
)
from tests.reliability.operations import OPERATIONS, boundary

pytestmark = pytest.mark.anyio

FAILING_DELIVERY = {"emit:context:compaction": ERROR, "emit:context:budget": ERROR}
SUBSET = [
    op
    for op in OPERATIONS
    if op.name
    in {
        "ordinary/compacting",
        "hard-fit",
        "measured/target-reached",
        "measured/reduced-output",
        "commit/target-reached",
    }
]


class Crash(BaseException):
    """A non-``Exception`` error from a hook (hooks swallow ``Exception`` only)."""


@pytest.mark.parametrize("kind", [ERROR, CANCEL])
@pytest.mark.parametrize("op", SUBSET, ids=[op.name for op in SUBSET])
async def test_faults_while_every_delivery_fails(
    op: Operation, kind: str, anyio_backend: str
) -> None:
    """A fault at every await point while every hook delivery also fails: the injected fault
    (hit k) is what propagates, never a delivery error; the store oracle holds."""
    with track_transactions() as ledger:
        base_check = checker(op, ledger)

        async def check(trial: Trial[Any]) -> None:
            await base_check(trial)
            if isinstance(trial.error, InjectedFault):
                assert trial.error.hit == trial.plan.fail_at, trial.describe()
                assert not trial.error.label.startswith("emit:"), trial.describe()

        async def prepare(plan: FaultPlan) -> Prepared[Any]:
            return await build(op, plan, ledger)

        report = await sweep(
            f"{op.name} +failing delivery",
            prepare,
            kind=kind,
            boundary=boundary(op),
            always=FAILING_DELIVERY,
            check=check,
        )
    record(anyio_backend, report)
    assert report.points >= 2


async def measured_store(hooks: Any = None) -> SimpleContextManager:
    manager = SimpleContextManager(
        token_meter="actual", max_tokens=3000, protected_tool_results=1, hooks=hooks
    )
    await manager.set_messages(mixed_history(1200))
    return manager


class FailingHooks:
    """Every delivery fails: ``Exception`` for some events, ``Crash`` for others."""

    def __init__(self, crash: frozenset[str] = frozenset()) -> None:
        self.crash = crash
        self.attempts: list[str] = []

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        self.attempts.append(event)
        await anyio.lowlevel.checkpoint()
        if event in self.crash:
            raise Crash(event)
        raise RuntimeError(f"hook failed on {event}")


async def test_a_count_error_is_not_replaced_by_failing_hooks(anyio_backend: str) -> None:
    hooks = FailingHooks(crash=frozenset({"context:budget", "context:compaction"}))
    manager = await measured_store(hooks)
    before = snapshot(manager)
    original = InjectedFault("count_view", 2)
    calls = 0

    async def count_view(view: list[dict[str, Any]]) -> Any:
        nonlocal calls
        await anyio.lowlevel.checkpoint()  # a provider count is an await
        calls += 1
        if calls == 2:
            raise original
        return counted(proportional(0.3, limit=LIMIT), view)

    with track_transactions() as ledger, pytest.raises(InjectedFault) as raised:
        await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=count_view
        )
    assert raised.value is original
    assert hooks.attempts == []  # the failure path delivers nothing
    assert [t.state for t in ledger.created] == [TxnState.ROLLED_BACK]
    after = snapshot(manager)
    assert after == before and after.same_objects(before)


async def test_an_error_raised_inside_a_cancelled_scope_propagates_as_itself(
    anyio_backend: str,
) -> None:
    """``count_view`` sees its scope cancelled and raises its own error from the cancellation."""
    manager = await measured_store(FaultyHooks())
    before = snapshot(manager)
    original = ValueError("count failed while cancelled")
    scope = anyio.CancelScope()

    async def count_view(view: list[dict[str, Any]]) -> Any:
        scope.cancel()
        try:
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            raise original from None
        raise AssertionError("not cancelled")

    with track_transactions() as ledger, scope, pytest.raises(ValueError) as raised:
        await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=count_view
        )
    assert raised.value is original
    assert [t.state for t in ledger.created] == [TxnState.ROLLED_BACK]
    after = snapshot(manager)
    assert after == before and after.same_objects(before)


async def test_fit_output_failing_after_cancelling_its_scope(anyio_backend: str) -> None:
    manager = await measured_store(FaultyHooks())
    before = snapshot(manager)
    original = RuntimeError("fit failed")
    scope = anyio.CancelScope()

    async def fit_output(view: list[dict[str, Any]], attempt: Any) -> Any:
        scope.cancel()
        raise original

    with track_transactions() as ledger, scope, pytest.raises(RuntimeError) as raised:
        await manager.get_measured_request_view(
            provider=None,
            retain_contents=[],
            count_view=counting(proportional(0.3, limit=1500, oversize=True)),
            fit_output=fit_output,
        )
    assert raised.value is original
    assert [t.state for t in ledger.created] == [TxnState.ROLLED_BACK]
    after = snapshot(manager)
    assert after == before and after.same_objects(before)


async def test_a_crashing_budget_delivery_rolls_the_negotiation_back(anyio_backend: str) -> None:
    """A non-Exception from ``context:budget`` delivery propagates as itself; the staged
    transaction is rolled back and the store is exactly as before (the meter stats are
    published only at the return boundary, after that delivery)."""
    manager = await measured_store(FailingHooks(crash=frozenset({"context:budget"})))
    before = snapshot(manager)
    with track_transactions() as ledger, pytest.raises(Crash):
        await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=counting(proportional(0.3, limit=LIMIT))
        )
    assert [t.state for t in ledger.created] == [TxnState.ROLLED_BACK]
    after = snapshot(manager)
    assert after == before and after.same_objects(before)


async def test_a_crashing_compaction_delivery_keeps_the_commit(anyio_backend: str) -> None:
    hooks = FailingHooks(crash=frozenset({"context:compaction"}))
    manager = await measured_store(FaultyHooks())
    with track_transactions() as ledger:
        result = await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=counting(proportional(0.3, limit=LIMIT))
        )
    transaction: RequestTransaction = result["transaction"]
    manager.hooks = hooks
    before = snapshot(manager)
    with pytest.raises(Crash):
        await transaction.commit()
    assert transaction.state is TxnState.COMMITTED
    assert manager._decisions is ledger.machine_of(transaction).staged.decisions
    assert manager.last_compaction_stats is transaction.stats
    assert snapshot(manager).version == (before.version[0], before.version[1] + 1)
    transaction.rollback()  # a no-op once committed
    assert await transaction.commit() is True
    assert hooks.attempts == ["context:compaction"]  # delivered once, not again


async def test_a_raising_predicate_with_failing_hooks_leaves_the_transaction_ready(
    anyio_backend: str,
) -> None:
    manager = await measured_store(FaultyHooks())
    result = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=counting(proportional(0.3, limit=LIMIT))
    )
    transaction: RequestTransaction = result["transaction"]
    hooks = FailingHooks(crash=frozenset({"context:compaction"}))
    manager.hooks = hooks
    before = snapshot(manager)
    original = InjectedFault("is_cancelled", 1)

    def is_cancelled() -> bool:
        raise original

    with pytest.raises(InjectedFault) as raised:
        await transaction.commit(is_cancelled=is_cancelled)
    assert raised.value is original
    assert transaction.state is TxnState.READY and hooks.attempts == []
    after = snapshot(manager)
    assert after == before and after.same_objects(before)
    transaction.rollback()
    assert await transaction.commit() is False


async def test_a_factory_error_with_failing_hooks(anyio_backend: str) -> None:
    manager = SimpleContextManager(
        protected_tool_results=1, hooks=FailingHooks(crash=frozenset({"context:compaction"}))
    )
    await manager.set_messages(mixed_history(1200))
    original = InjectedFault("factory", 1)

    async def factory() -> str:
        await anyio.lowlevel.checkpoint()
        raise original

    await manager.set_system_prompt_factory(factory)
    before = snapshot(manager)
    with pytest.raises(InjectedFault) as raised:
        await manager.get_messages_for_request(token_budget=2400)
    assert raised.value is original
    after = snapshot(manager)
    assert after == before and after.same_objects(before)

    async def good() -> str:
        await anyio.lowlevel.checkpoint()
        return PROMPT

    await manager.set_system_prompt_factory(good)
    with pytest.raises(Crash):  # the commit happened; the crash came from its delivery
        await manager.get_messages_for_request(token_budget=2400)
    assert snapshot(manager).level > 0
