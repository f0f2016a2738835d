"""Time and concurrency (docs/design.md section 8).

- Concurrent negotiations against one store, committed concurrently: the first commit
  wins, every later one (staged on the same version) returns False with ``conflict`` set
  and applies nothing.
- Negotiations, ordinary requests and admissions racing in one task group: every view
  returned corresponds to a history prefix that existed during the call (admission is
  append-only), and every commit either applies or conflicts cleanly.
- ``set_messages``/``clear`` or another commit landing inside a negotiation make its commit
  a conflict (a forced interleaving).
- A deadline on a hanging count, under trio's ``MockClock``: cancelled, store unchanged.

Interleavings come from Hypothesis-drawn delays (numbers of checkpoints per task); on trio
the scheduler's own randomness is seeded by Hypothesis, so failures replay.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from amplifier_module_context_simple.errors import TransactionConflictError
from amplifier_module_context_simple.negotiator.transaction import RequestTransaction, TxnState
from amplifier_module_context_simple.testing import (
    check_view_invariants,
    snapshot,
)
from tests.negotiator.orchestrator import counted, proportional
from tests.reliability.harness import EXAMPLES, LIMIT, hsettings, mixed_history, openai_round
from tests.reliability.scenarios import concurrent_negotiations, pause, slow_count, store
from tests.support import replaced

HISTORY = mixed_history(1200)
delays = st.lists(st.integers(0, 4), min_size=1, max_size=6)


@pytest.mark.anyio
@hsettings()
@given(
    waits=st.lists(delays, min_size=2, max_size=4),
    commit_waits=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    scales=st.lists(st.sampled_from([0.3, 0.5, 1.0]), min_size=4, max_size=4),
)
async def test_concurrent_negotiations_first_commit_wins(
    waits: list[list[int]], commit_waits: list[int], scales: list[float], anyio_backend: str
) -> None:
    EXAMPLES["T12 concurrent negotiations"] += 1
    await concurrent_negotiations(waits, commit_waits, scales)


def prefix_of(history: list[dict[str, Any]], view: Any, low: int, high: int, **kw: Any) -> int:
    """The length L in [low, high] of a history prefix ``view`` is a valid view of."""
    errors = []
    for length in range(high, low - 1, -1):
        try:
            check_view_invariants(history[:length], view, **kw)
        except AssertionError as error:
            errors.append(error)
            continue
        return length
    raise AssertionError(f"no prefix of length {low}..{high} explains the view: {errors[0]}")


@pytest.mark.anyio
@hsettings()
@given(
    plan=st.lists(
        st.tuples(
            st.sampled_from(["negotiate", "ordinary", "admit", "admit"]),
            delays,
            st.sampled_from([0.3, 1.0]),
        ),
        min_size=2,
        max_size=7,
    ),
    budgets=st.lists(st.integers(1500, 5000), min_size=1, max_size=3),
)
async def test_requests_racing_admissions_see_a_real_prefix(
    plan: list[tuple[str, list[int], float]], budgets: list[int], anyio_backend: str
) -> None:
    EXAMPLES["T12 racing requests and admissions"] += 1
    manager = store()
    await manager.set_messages(HISTORY)
    views: list[tuple[Any, int, int]] = []
    transactions: list[RequestTransaction] = []

    def admitted() -> int:
        return len(manager.messages)

    async def run(i: int, kind: str, waits: list[int], scale: float) -> None:
        await pause(waits[0])
        low = admitted()  # the store's own history is the reference (tasks interleave)
        if kind == "admit":
            messages = [
                {"role": "user", "content": f"follow-up {i}"},
                *openai_round([f"race_{i}"], 900),
            ]
            for message in messages:
                await manager.add_message(message)
                await pause(waits[-1])
        elif kind == "ordinary":
            view = await manager.get_messages_for_request(token_budget=budgets[i % len(budgets)])
            views.append((view, low, admitted()))
        else:
            result = await manager.get_measured_request_view(
                provider=None, retain_contents=[], count_view=slow_count(scale, waits)
            )
            views.append((result["base_view"], low, admitted()))
            if result["transaction"] is not None:
                transactions.append(result["transaction"])

    async with anyio.create_task_group() as group:
        for i, (kind, waits, scale) in enumerate(plan):
            group.start_soon(run, i, kind, waits, scale)
    history = manager.messages  # as stored: the oracle ignores the store's bookkeeping
    for view, low, high in views:
        prefix_of(history, view, low, high)
    for transaction in transactions:
        version = manager.version
        before = snapshot(manager)
        committed = await transaction.commit()
        if committed:
            assert manager.version == (version[0], version[1] + 1)
            EXAMPLES["T12 racing commits applied"] += 1
        else:
            assert transaction.conflict
            assert snapshot(manager) == before and snapshot(manager).same_objects(before)
            EXAMPLES["T12 racing commits in conflict"] += 1
    final = await manager.get_messages_for_request(token_budget=budgets[0])
    check_view_invariants(history, final)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "move", ["set_messages", "set_messages-different", "ordinary-commit", "other-commit"]
)
async def test_a_store_move_during_a_negotiation_makes_its_commit_a_conflict(
    move: str, anyio_backend: str
) -> None:
    """A forced interleaving: the store moves while the negotiation's count is in flight.
    (A move to a *shorter* history crashes the negotiation: see test_defects.py.)"""
    manager = store()
    await manager.set_messages(HISTORY)
    counting_started = anyio.Event()
    moved = anyio.Event()

    async def count_view(view: list[dict[str, Any]]) -> Any:
        counting_started.set()
        await moved.wait()
        return counted(proportional(0.3, limit=LIMIT), view)

    async def mover() -> None:
        await counting_started.wait()
        if move == "set_messages":
            await manager.set_messages(replaced(HISTORY))
        elif move == "set_messages-different":
            await manager.set_messages([*HISTORY[:-1], {"role": "user", "content": "other"}])
        elif move == "ordinary-commit":
            await manager.get_messages_for_request(token_budget=2000)
        else:
            other = await manager.get_measured_request_view(
                provider=None, retain_contents=[], count_view=_quick
            )
            assert await other["transaction"].commit() is True
        moved.set()

    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    async def negotiate() -> None:  # noqa: ASYNC910 - a task body: its error is the outcome
        try:
            results.append(
                await manager.get_measured_request_view(
                    provider=None, retain_contents=[], count_view=count_view
                )
            )
        except TransactionConflictError as error:
            errors.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(negotiate)
        group.start_soon(mover)
    if move.startswith("set_messages"):
        # The history the request was planned on is gone: the negotiation stops, typed,
        # before reading the new history under the old plan; nothing is applied.
        assert errors and not results
        return
    transaction = results[0]["transaction"]
    assert isinstance(transaction, RequestTransaction)
    before = snapshot(manager)
    assert await transaction.commit() is False
    assert transaction.conflict and transaction.state is TxnState.ROLLED_BACK
    assert snapshot(manager) == before and snapshot(manager).same_objects(before)


async def _quick(view: list[dict[str, Any]]) -> Any:
    await anyio.lowlevel.checkpoint()
    return counted(proportional(0.3, limit=LIMIT), view)


def test_a_deadline_on_a_hanging_count_under_a_mock_clock() -> None:
    """``move_on_after`` around a count that sleeps an hour: cancelled at the deadline in
    virtual time, nothing applied, and the store serves the next request."""
    manager = store()

    async def main() -> None:
        await manager.set_messages(HISTORY)
        before = snapshot(manager)

        async def hanging(view: list[dict[str, Any]]) -> Any:
            await anyio.sleep(3600)
            return counted(proportional(0.3, limit=LIMIT), view)

        started = anyio.current_time()
        with anyio.move_on_after(30) as scope:
            await manager.get_measured_request_view(
                provider=None, retain_contents=[], count_view=hanging
            )
        assert scope.cancelled_caught
        assert anyio.current_time() - started == pytest.approx(30)
        assert snapshot(manager) == before and snapshot(manager).same_objects(before)
        result = await manager.get_measured_request_view(
            provider=None, retain_contents=[], count_view=_quick
        )
        assert await result["transaction"].commit() is True

    wall = time.monotonic()
    anyio.run(
        main,
        backend="trio",
        backend_options={"clock": trio.testing.MockClock(autojump_threshold=0)},
    )
    assert time.monotonic() - wall < 5
