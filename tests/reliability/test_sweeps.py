"""Fault sweeps over every await point of the store's request operations (T1, T2, T4, T5).

Each sweep (``amplifier_module_context_simple.testing.sweep``) first runs the operation
without faults: that gives the expected ``after`` snapshot and the N seam hits (await
points). Then, for k = 1, 2, ..., it rebuilds the same store and runs the operation with a
fault at hit k until a run completes without reaching k (k = N + 1). Oracle:

- raised -> the store equals ``before`` (values and the very same decisions, stats and
  meter-stats objects), every transaction created is rolled back, and a clean retry on the
  same store reaches ``after`` (the store stays usable);
- raised while a boundary delivery was interrupted (``context:compaction`` after the
  ordinary/hard-fit commit or inside ``RequestTransaction.commit``; ``context:budget`` at
  the return boundary) -> the store equals the no-fault ``after`` (the commit stands);
- returned -> the store equals ``after`` and the view meets the view invariants.

Modes: ``error`` (``InjectedFault``; hook delivery swallows it, the other seams propagate
it) and ``cancel`` (the enclosing anyio ``CancelScope``), each transient (hit k only) and
persistent (every hit >= k), on asyncio and trio; ``native`` (``Task.cancel()`` at hit k,
asyncio only); and the trio step sweep (cancel before the operation task's k-th scheduler
step), which also reaches awaits that are not seams. The number of await points of every
sweep is printed in the session summary.
"""

from __future__ import annotations

from typing import Any

import pytest

from amplifier_module_context_simple.testing import (
    BUDGET_EVENT,
    COMPACTION_EVENT,
    NATIVE,
    FaultPlan,
    Prepared,
    step_sweep,
)
from tests.reliability.harness import Operation, build, checker, record, track_transactions
from tests.reliability.operations import IDS, MODE_IDS, MODES, OPERATIONS, boundary, run_sweep


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "persistent"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("op", OPERATIONS, ids=IDS)
async def test_sweep(op: Operation, kind: str, persistent: bool, anyio_backend: str) -> None:
    """T1/T2: an error or anyio cancellation at every await point, transient and persistent."""
    report = await run_sweep(op, anyio_backend, kind, persistent)
    assert report.points >= op.min_points


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
@pytest.mark.parametrize("op", OPERATIONS, ids=IDS)
async def test_native_sweep(op: Operation, persistent: bool, anyio_backend: str) -> None:
    """T4: native ``asyncio.Task.cancel()`` at every await point (what an asyncio host does)."""
    report = await run_sweep(op, anyio_backend, NATIVE, persistent)
    assert report.points >= op.min_points


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("op", OPERATIONS, ids=IDS)
async def test_step_sweep(op: Operation, anyio_backend: str) -> None:
    """T5: cancel before every scheduler step of the operation's task (trio Instrument)."""
    with track_transactions() as ledger:

        async def prepare(plan: FaultPlan) -> Prepared[Any]:
            return await build(op, plan, ledger)

        report = await step_sweep(
            op.name, prepare, boundary=boundary(op), check=checker(op, ledger)
        )
    record(anyio_backend, report)
    # every async seam is a checkpoint: one step before each, and one after the last
    awaited = [label for label in report.labels if label not in ("entry", "is_cancelled")]
    assert report.points >= len(awaited) + 1, report.summary()


@pytest.mark.anyio
@pytest.mark.parametrize("op", OPERATIONS, ids=IDS)
async def test_labels_follow_the_documented_order(op: Operation, anyio_backend: str) -> None:
    """The reference run hits the seams in the documented order, the same on both backends."""
    plan = FaultPlan()
    prepared = await build(op, plan)
    await prepared.run()
    labels = plan.labels
    order = [
        "entry",
        "is_cancelled",
        "factory",
        "count_view",
        "fit_output",
        f"emit:{COMPACTION_EVENT}",
        f"emit:{BUDGET_EVENT}",
    ]
    ranks = [order.index(label) for label in labels]
    assert ranks == sorted(ranks), labels
    assert labels.count("factory") == (op.factory and op.kind != "commit"), labels
    assert labels.count("fit_output") <= 1 and labels.count("count_view") <= 9, labels
    if op.kind == "commit":
        assert labels == ["entry", "is_cancelled", f"emit:{COMPACTION_EVENT}"], labels
