"""Regression tests for defects the reliability suite found.

Each test states the contract it checks and carries a minimal reproduction. A defect not
fixed yet is a strict xfail (``reason="BUG: ..."``): when its fix lands the xfail turns into
a failure ("XPASS(strict)"); remove the marker then. All of them are fixed today.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import (
    ContextLengthError,
    InvalidMessageError,
    SimpleContextManager,
)
from amplifier_module_context_simple.testing import (
    FaultPlan,
    FaultyHooks,
    check_view_invariants,
    snapshot,
)
from tests.reliability.harness import openai_call

RESULTS_WITHOUT_ID = [
    pytest.param({"role": "tool", "content": "no id"}, id="tool-no-id"),
    pytest.param({"role": "tool", "tool_call_id": "", "content": "empty id"}, id="tool-empty-id"),
    pytest.param({"role": "tool", "tool_call_id": 7, "content": "int id"}, id="tool-int-id"),
    pytest.param(
        {"role": "user", "content": [{"type": "tool_result", "content": "no id"}]},
        id="block-no-id",
    ),
]


# Found by this suite and fixed (a non-string tool_call_id is rejected at admission; a
# result naming no call never reaches a view); kept as a regression test.
@pytest.mark.anyio
@pytest.mark.parametrize("result", RESULTS_WITHOUT_ID)
async def test_a_result_without_a_call_id_never_reaches_a_view(
    result: dict[str, Any], anyio_backend: str
) -> None:
    history = [{"role": "user", "content": "hi"}, result, {"role": "user", "content": "next"}]
    manager = SimpleContextManager()
    try:
        await manager.set_messages(history)
    except InvalidMessageError:
        return  # rejecting it at admission is a fix too
    view = await manager.get_messages_for_request()
    check_view_invariants(history, view)


# Found by this suite and fixed (History links only messages a view can show); kept as a
# regression test.
@pytest.mark.anyio
async def test_results_of_a_reference_only_call_never_reach_a_view(anyio_backend: str) -> None:
    history = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [openai_call("c1")],
            "metadata": {"amplifier_public_reference_only": True},
        },
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
        {"role": "user", "content": "next"},
    ]
    manager = SimpleContextManager()
    await manager.set_messages(history)
    check_view_invariants(history, await manager.get_messages_for_request())


def _clipped_tool_result() -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": "", "tool_calls": [openai_call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 5000},
    ]


# Found by this suite and fixed (ingress events are delivered before admission); kept as a
# regression test.
@pytest.mark.anyio
@pytest.mark.parametrize("operation", ["add_message", "set_messages"])
async def test_cancelled_ingress_delivery_admits_nothing(
    operation: str, anyio_backend: str
) -> None:
    plan = FaultPlan(1, "cancel")
    manager = SimpleContextManager(max_tool_result_bytes=1000, hooks=FaultyHooks(plan))
    call, result = _clipped_tool_result()
    plan.disarm()
    await manager.set_messages([{"role": "user", "content": "hi"}, call])
    plan.arm()
    before = snapshot(manager)
    with anyio.CancelScope() as scope:
        plan.scope = scope
        if operation == "add_message":
            await manager.add_message(result)
        else:
            await manager.set_messages([{"role": "user", "content": "hi"}, call, result])
    assert scope.cancelled_caught, "the delivery was cancelled"
    assert plan.labels == ["emit:context:tool_result_ingress_truncated"]
    assert snapshot(manager) == before, "cancelled, yet the message was admitted"


class PayloadMutatingHooks:
    """A hook registry that hands handlers the payload itself (no copy), and a handler that
    edits it - as a custom registry may (amplifier-core's own registry copies)."""

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        await anyio.lowlevel.checkpoint()
        data.clear()
        data["handled_by"] = "a hook that rewrites its payload"


# Found by this suite and fixed (compaction payloads are copies); kept as a regression test.
@pytest.mark.anyio
@pytest.mark.parametrize("path", ["ordinary", "commit"])
async def test_a_hook_editing_its_payload_changes_nothing_stored(
    path: str, anyio_backend: str
) -> None:
    from tests.negotiator.orchestrator import counting, proportional
    from tests.reliability.harness import LIMIT, mixed_history

    manager = SimpleContextManager(token_meter="actual", max_tokens=3000, protected_tool_results=1)
    await manager.set_messages(mixed_history(1200))
    if path == "ordinary":
        manager.hooks = PayloadMutatingHooks()
        await manager.get_messages_for_request(token_budget=2400)
    else:
        result = await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=counting(proportional(0.3, limit=LIMIT))
        )
        manager.hooks = PayloadMutatingHooks()
        assert await result["transaction"].commit() is True
    stats = manager.last_compaction_stats
    assert stats is not None and "handled_by" not in stats and stats["strategy_level"] > 0


# Found by this suite and fixed; kept as a regression test.
@pytest.mark.anyio
@pytest.mark.parametrize("move", ["clear", "shorter"])
async def test_a_reset_during_a_count_fails_typed(move: str, anyio_backend: str) -> None:
    from amplifier_module_context_simple.errors import TransactionConflictError
    from amplifier_module_context_simple.negotiator.transaction import TxnState
    from tests.negotiator.orchestrator import counted, proportional
    from tests.reliability.harness import LIMIT, mixed_history, small_history, track_transactions

    manager = SimpleContextManager(token_meter="actual", max_tokens=3000, protected_tool_results=1)
    await manager.set_messages(mixed_history(1200))
    calls = 0

    async def count_view(view: list[dict[str, Any]]) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # another task resets the store while this count is in flight
            if move == "clear":
                await manager.clear()
            else:
                await manager.set_messages(small_history())
        return counted(proportional(0.3, limit=LIMIT), view)

    with track_transactions() as ledger:
        try:
            result = await manager.get_measured_request_view(
                provider=None, retain_contents=[], count_view=count_view
            )
        except (TransactionConflictError, ContextLengthError):
            assert all(t.state is TxnState.ROLLED_BACK for t in ledger.created)
            return
    transaction = result["transaction"]
    assert transaction is None or await transaction.commit() is False


# Found by this suite and fixed; kept as a regression test.
@pytest.mark.anyio
async def test_a_result_admitted_during_a_count_never_loses_its_call(anyio_backend: str) -> None:
    from tests.negotiator.orchestrator import counted, proportional
    from tests.reliability.harness import LIMIT, mixed_history, openai_round

    call, result = openai_round(["late"], 900)
    base = mixed_history(1200)
    history = [*base[:-1], call, {"role": "user", "content": "meanwhile, a question"}, base[-1]]
    manager = SimpleContextManager(token_meter="actual", max_tokens=3000, protected_tool_results=1)
    await manager.set_messages(history)
    calls = 0

    async def count_view(view: list[dict[str, Any]]) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # the late tool result arrives while the count is in flight
            await manager.add_message(result)
            history.append(result)
        return counted(proportional(1.0, limit=LIMIT), view)

    outcome = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=count_view
    )
    assert await outcome["transaction"].commit() is True
    check_view_invariants(history, await manager.get_messages_for_request(token_budget=3000))


# Found by this suite and fixed; kept as a regression test.
@pytest.mark.anyio
async def test_a_system_message_with_tool_results_never_precedes_the_call(
    anyio_backend: str,
) -> None:
    history = [
        {"role": "user", "content": "question"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}],
        },
        {
            "role": "system",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}],
        },
        {"role": "user", "content": "next"},
    ]
    manager = SimpleContextManager()
    try:
        await manager.set_messages(history)
    except InvalidMessageError:
        return  # rejecting it at admission is a fix too
    check_view_invariants(history, await manager.get_messages_for_request())
