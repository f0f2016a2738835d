"""Regression tests for defects the reliability suite found.

Each test states the contract it checks and carries a minimal reproduction. A defect not
fixed yet is a strict xfail (``reason="BUG: ..."``): when its fix lands the xfail turns into
a failure ("XPASS(strict)"); remove the marker then. All of them are fixed today.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import InvalidMessageError, SimpleContextManager
from amplifier_module_context_simple.errors import TransactionConflictError
from amplifier_module_context_simple.negotiator.transaction import TxnState
from amplifier_module_context_simple.testing import (
    FaultPlan,
    FaultyHooks,
    Snapshot,
    check_view_invariants,
    snapshot,
)
from tests.negotiator.orchestrator import counted, counting, proportional
from tests.reliability.harness import (
    LIMIT,
    mixed_history,
    openai_call,
    openai_round,
    small_history,
    track_transactions,
)

RESULTS_WITHOUT_ID = [
    pytest.param({"role": "tool", "content": "no id"}, id="tool-no-id"),
    pytest.param({"role": "tool", "tool_call_id": "", "content": "empty id"}, id="tool-empty-id"),
    pytest.param(
        {"role": "user", "content": [{"type": "tool_result", "content": "no id"}]},
        id="block-no-id",
    ),
]


# Found by this suite and fixed (a result naming no call never reaches a view); kept as a
# regression test.
@pytest.mark.anyio
@pytest.mark.parametrize("result", RESULTS_WITHOUT_ID)
async def test_a_result_without_a_call_id_never_reaches_a_view(
    result: dict[str, Any], anyio_backend: str
) -> None:
    """A result whose id is missing or empty is well-formed (admitted and kept in the
    history) but answers no call: no view shows it."""
    history = [{"role": "user", "content": "hi"}, result, {"role": "user", "content": "next"}]
    manager = SimpleContextManager()
    await manager.set_messages(history)
    assert len(await manager.get_messages()) == 3
    view = await manager.get_messages_for_request()
    assert view == [history[0], history[2]]
    check_view_invariants(history, view)


# Found by this suite and fixed (a non-string tool_call_id is rejected at admission); kept as
# a regression test.
@pytest.mark.anyio
@pytest.mark.parametrize("operation", ["add_message", "set_messages"])
async def test_a_result_with_a_non_string_call_id_is_rejected(
    operation: str, anyio_backend: str
) -> None:
    """A bad message (docs/design.md section 3.1): a bad message shape raises a ``ValueError`` naming the problem and the
    history stays as it was."""
    manager = SimpleContextManager()
    await manager.set_messages([{"role": "user", "content": "hi"}])
    before = snapshot(manager)
    result = {"role": "tool", "tool_call_id": 7, "content": "int id"}
    with pytest.raises(InvalidMessageError, match="'tool_call_id' must be a string, got int"):
        if operation == "add_message":
            await manager.add_message(result)
        else:
            await manager.set_messages([{"role": "user", "content": "hi"}, result])
    assert snapshot(manager).identical(before)


# Found by this suite and fixed (History links only messages a view can show); kept as a
# regression test.
@pytest.mark.anyio
async def test_results_of_a_reference_only_call_never_reach_a_view(anyio_backend: str) -> None:
    history: list[dict[str, Any]] = [
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
    """The history replaced (``clear``, or ``set_messages`` with an unrelated list) while a
    negotiated request is being counted: the request raises ``TransactionConflictError``
    (docs/design.md section 5.3, docs/orchestrators.md "Errors"), its one transaction is rolled back, and nothing of it
    reaches the store."""
    manager = SimpleContextManager(token_meter="actual", max_tokens=3000, protected_tool_results=1)
    await manager.set_messages(mixed_history(1200))
    calls = 0
    reset: Snapshot | None = None

    async def count_view(view: list[dict[str, Any]]) -> Any:
        nonlocal calls, reset
        await anyio.lowlevel.checkpoint()  # a provider count is an await
        calls += 1
        if calls == 1:  # another task resets the store while this count is in flight
            if move == "clear":
                await manager.clear()
            else:
                await manager.set_messages(small_history())
            reset = snapshot(manager)
        return counted(proportional(0.3, limit=LIMIT), view)

    with (
        track_transactions() as ledger,
        pytest.raises(TransactionConflictError, match=r"replaced .* while this request"),
    ):
        await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=count_view
        )
    assert calls == 1
    assert [machine.state for machine in ledger.created] == [TxnState.ROLLED_BACK]
    assert reset is not None and snapshot(manager).identical(reset)


# Found by this suite and fixed; kept as a regression test.
@pytest.mark.anyio
async def test_a_result_admitted_during_a_count_never_loses_its_call(anyio_backend: str) -> None:

    call, result = openai_round(["late"], 900)
    base = mixed_history(1200)
    history = [*base[:-1], call, {"role": "user", "content": "meanwhile, a question"}, base[-1]]
    manager = SimpleContextManager(token_meter="actual", max_tokens=3000, protected_tool_results=1)
    await manager.set_messages(history)
    calls = 0

    async def count_view(view: list[dict[str, Any]]) -> Any:
        nonlocal calls
        await anyio.lowlevel.checkpoint()  # a provider count is an await
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


# Found by this suite and fixed (admission rejects it); kept as a regression test.
@pytest.mark.anyio
async def test_a_system_message_carrying_tool_results_is_rejected(
    anyio_backend: str,
) -> None:
    """A system message carrying ``tool_result`` blocks would be hoisted before the call it
    answers: admission refuses it with a typed error naming the problem, and the history
    stays as it was."""
    history: list[dict[str, Any]] = [
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
    await manager.set_messages(history[:2])
    before = snapshot(manager)
    with pytest.raises(
        InvalidMessageError, match="a system message cannot carry tool_use/tool_result blocks"
    ):
        await manager.set_messages(history)
    assert snapshot(manager).identical(before)
    with pytest.raises(InvalidMessageError, match="a system message cannot carry"):
        await manager.add_message(history[2])
    assert snapshot(manager).identical(before)
