"""Checkpoint discipline (docs/design.md sections 3.5 and 10), on anyio's trio backend.

- The transaction's synchronous API (the machine's driver methods, its transition
  function ``_fire`` with the commit step, ``rollback``, and the handle's ``rollback`` and
  read-only properties) never checkpoints: the commit step cannot be interrupted.
- Every public async operation notices a cancelled caller at entry, before any effect
  (the "cancel point" half of a checkpoint), on both backends.
- A fast-path call (no factory, no hooks, nothing to deliver) is a full trio checkpoint
  (cancel point *and* schedule point), so a loop of them still yields to other tasks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import trio
import trio.testing

from amplifier_module_context_simple import SimpleContextManager
from amplifier_module_context_simple.context.slices import run_through
from amplifier_module_context_simple.negotiator.transaction import (
    TERMINAL,
    RequestTransaction,
    TxnEvent,
    TxnState,
    _Machine,
)
from amplifier_module_context_simple.testing import snapshot
from tests.negotiator.orchestrator import counted, counting, proportional
from tests.reliability.harness import LIMIT, PROMPT, mixed_history, small_history

pytestmark = pytest.mark.anyio


async def ready_transaction() -> tuple[SimpleContextManager, RequestTransaction]:
    manager = SimpleContextManager(token_meter="actual", max_tokens=3000, protected_tool_results=1)
    await manager.set_messages(mixed_history(1200))
    result = await manager.get_measured_request_view(
        provider=None, retain_contents=[], count_view=counting(proportional(0.3, limit=LIMIT))
    )
    transaction = result["transaction"]
    assert isinstance(transaction, RequestTransaction)
    return manager, transaction


def state_now(machine: _Machine) -> TxnState:
    """``machine.state`` read afresh: mypy keeps an asserted state across a transition."""
    return machine.state


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_synchronous_transaction_api_never_checkpoints(anyio_backend: str) -> None:
    """The machine's synchronous API (every driver method, the transition function with
    its commit step, ``rollback``) and the handle's ``rollback`` and read-only properties
    never checkpoint."""
    manager, ready = await ready_transaction()
    seam = await manager._open_negotiation(None, [])
    finishing = await manager._open_negotiation(None, [])
    with trio.testing.assert_no_checkpoints():
        # a fresh machine walked through every legal non-terminal event, staging on the way
        candidates = [
            c for rung in seam.rungs if (c := run_through(seam.stepping(rung))) is not None
        ]
        assert candidates
        machine = _Machine(seam)
        machine.counting()
        machine.counted()
        machine.stage(candidates[0])
        machine.stage(candidates[-1])
        machine.counting()
        machine.counted()
        machine.fitting()
        machine.no_fit()
        machine.fitting()
        machine.fitted(run_through(seam.finalising(candidates[-1], outcome="reduced_output")))
        assert machine.state is TxnState.READY and machine.has_changes
        assert machine.state not in TERMINAL
        other = _Machine(finishing)
        other.finish(finishing.base)
        assert other.state is TxnState.READY and not other.has_changes
        other.rollback()
        # the synchronous commit step: the table's COMMIT entry (check, then apply)
        machine._fire(TxnEvent.COMMIT)
        assert state_now(machine) is TxnState.COMMITTED
        assert manager._decisions is machine.staged.decisions
        # rollback of the now stale READY transaction (and of a terminal one) is synchronous
        ready.rollback()
        ready.rollback()
        machine.rollback()
        machine._fire(TxnEvent.COMMIT)
        assert ready.state is TxnState.ROLLED_BACK and state_now(machine) is TxnState.COMMITTED
        assert state_now(other) is TxnState.ROLLED_BACK
        _ = (ready.stats, ready.conflict, ready.has_changes, repr(ready), manager.version)
        _ = (machine.staged, machine.conflict, machine.has_changes)


Call = Callable[[SimpleContextManager], Awaitable[Any]]


async def _factory() -> str:
    await anyio.lowlevel.checkpoint()
    return PROMPT


async def _count(view: list[dict[str, Any]]) -> Any:
    return counted(proportional(0.3, limit=LIMIT), view)  # noqa: ASYNC910 - the store's entry, not this seam, must see the cancel


CALLS: dict[str, Call] = {
    "add_message": lambda m: m.add_message({"role": "user", "content": "more"}),
    "set_messages": lambda m: m.set_messages(small_history()),
    "clear": lambda m: m.clear(),
    "get_messages": lambda m: m.get_messages(),
    "get_messages_for_request": lambda m: m.get_messages_for_request(token_budget=2400),
    "retaining": lambda m: m.get_messages_for_request_retaining(
        retain_contents=[], token_budget=2400, hard_fit=True
    ),
    "measured": lambda m: m.get_measured_request_view(
        provider=None, retain_contents=[], count_view=_count
    ),
    "set_system_prompt_factory": lambda m: m.set_system_prompt_factory(_factory),
    "should_compact": lambda m: m.should_compact(),
    "compact": lambda m: m.compact(),
}


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_every_operation_notices_a_cancelled_caller_before_any_effect(
    name: str, anyio_backend: str
) -> None:
    manager = SimpleContextManager(token_meter="actual", max_tokens=3000, protected_tool_results=1)
    await manager.set_messages(mixed_history(1200))
    before = snapshot(manager)
    factory = manager._factory
    with anyio.CancelScope() as scope:
        scope.cancel()
        await CALLS[name](manager)
    assert scope.cancelled_caught, f"{name} did not notice the cancellation"
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)
    assert manager._factory is factory


async def test_commit_notices_a_cancelled_caller_before_applying(anyio_backend: str) -> None:
    manager, transaction = await ready_transaction()
    before = snapshot(manager)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await transaction.commit()
    assert scope.cancelled_caught
    assert transaction.state is TxnState.READY
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)
    assert await transaction.commit() is True  # still committable afterwards


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_request_with_a_seam_is_a_full_checkpoint(anyio_backend: str) -> None:
    manager = SimpleContextManager()
    await manager.set_messages(small_history())
    await manager.set_system_prompt_factory(_factory)
    with trio.testing.assert_checkpoints():
        await manager.get_messages_for_request()


# Found by this suite and fixed (request, admission and commit entries are full
# checkpoints); kept as a regression test.
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("name", ["get_messages_for_request", "get_messages", "add_message"])
async def test_a_fast_path_call_is_a_full_checkpoint(name: str, anyio_backend: str) -> None:
    manager = SimpleContextManager()
    await manager.set_messages(small_history())
    with trio.testing.assert_checkpoints():
        await CALLS[name](manager)
