"""Fault sweeps over the pause points of planning in slices (issue 14; T1, T2, T4, T5).

The operations of ``test_sweeps.py`` (ordinary, hard-fit and negotiated requests in every
starting state; ``RequestTransaction.commit`` paces nothing and is left out), with the
store's pacer at a zero budget, so that *every* pause point of the planning is an await
point (``context/slices.py``), routed through the fault plan as the seam ``slice``. The
same sweeps and the same oracle: a fault at any await point - a slice or a seam - either
raised and left the store exactly as before (same values, same objects; a clean retry
then reaches the no-fault ``after``), or interrupted a boundary delivery after the commit
(the commit stands), or the operation returned and the store equals ``after``.

Modes: ``error`` and ``cancel``, transient and persistent, on asyncio and trio;
``native`` (``Task.cancel()``), transient and persistent, on asyncio; and the trio step
sweep (cancel before each scheduler step of the operation's task), with the pacer's own
checkpoint. The number of await points of every sweep is printed in the session summary.
"""

from __future__ import annotations

from typing import Any

import pytest

from amplifier_module_context_simple.context.counting.estimate import estimate_message
from amplifier_module_context_simple.context.slices import Pacer
from amplifier_module_context_simple.testing import (
    CANCEL,
    ERROR,
    NATIVE,
    FaultPlan,
    InjectedFault,
    Prepared,
    SweepReport,
    step_sweep,
    sweep,
)
from benchmarks import histories
from tests.negotiator.orchestrator import proportional
from tests.reliability.harness import (
    LIMIT,
    Operation,
    build,
    checker,
    record,
    track_transactions,
)
from tests.reliability.operations import MODE_IDS, MODES, OPERATIONS, boundary

SLICED = [op for op in OPERATIONS if op.kind != "commit"]
IDS = [op.name for op in SLICED]
SLICE = "slice"


async def sliced_sweep(op: Operation, backend: str, kind: str, persistent: bool) -> SweepReport:
    """``op`` swept with every pause point of its planning a ``slice`` seam."""
    with track_transactions() as ledger:

        async def prepare(plan: FaultPlan) -> Prepared[Any]:
            prepared = await build(op, plan, ledger)
            prepared.manager._pacer = Pacer(0.0, lambda: plan.hit(SLICE))
            return prepared

        report = await sweep(
            f"{op.name} (sliced)",
            prepare,
            kind=kind,
            persistent=persistent,
            boundary=boundary(op),
            expected_errors=(InjectedFault,),
            check=checker(op, ledger),
        )
    record(backend, report)
    assert report.trials == report.points or persistent, report.summary()
    # the planning paused (and every pause was an await point the sweep reached)
    assert report.labels.count(SLICE) >= 1, report.summary()
    return report


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "persistent"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("op", SLICED, ids=IDS)
async def test_sliced_sweep(op: Operation, kind: str, persistent: bool, anyio_backend: str) -> None:
    """T1/T2: an error or anyio cancellation at every slice and seam, transient and
    persistent."""
    await sliced_sweep(op, anyio_backend, kind, persistent)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
@pytest.mark.parametrize("op", SLICED, ids=IDS)
async def test_sliced_native_sweep(op: Operation, persistent: bool, anyio_backend: str) -> None:
    """T4: native ``asyncio.Task.cancel()`` at every slice and seam."""
    await sliced_sweep(op, anyio_backend, NATIVE, persistent)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("op", SLICED, ids=IDS)
async def test_sliced_step_sweep(op: Operation, anyio_backend: str) -> None:
    """T5: cancel before every scheduler step of the operation's task, the pacer
    yielding at every pause point with its own checkpoints (``yield_to_the_loop``)."""
    with track_transactions() as ledger:

        async def prepare(plan: FaultPlan) -> Prepared[Any]:
            prepared = await build(op, plan, ledger)
            prepared.manager._pacer = Pacer(0.0)
            return prepared

        report = await step_sweep(
            f"{op.name} (sliced)", prepare, boundary=boundary(op), check=checker(op, ledger)
        )
    record(anyio_backend, report)
    # every seam and every pause point is a checkpoint: more steps than seams
    awaited = [label for label in report.labels if label not in ("entry", "is_cancelled")]
    assert report.points >= len(awaited) + 3, report.summary()


# -- deep tier: pause points inside the loops ---------------------------------------------------

LONG = tuple(histories.history(300))
"""300 benchmark messages: long enough that the loops pause inside (every ``STRIDE``
items), not only between phases."""
LONG_TOKENS = sum(estimate_message(m) for m in LONG)
LONG_OPERATIONS = [
    Operation(
        "long/ordinary",
        "ordinary",
        LONG,
        (("protected_tool_results", 1),),
        budget=LONG_TOKENS // 2,
        min_points=3,
    ),
    Operation(
        "long/measured",
        "measured",
        LONG,
        (("protected_tool_results", 1), ("max_tokens", LONG_TOKENS // 2)),
        rule=proportional(0.3, limit=LIMIT),
        outcome="target_reached",
        min_points=3,
    ),
]


@pytest.mark.deep
@pytest.mark.anyio
@pytest.mark.parametrize("op", LONG_OPERATIONS, ids=[op.name for op in LONG_OPERATIONS])
async def test_sliced_sweep_inside_the_loops(  # noqa: ASYNC910 - modes is never empty
    op: Operation, anyio_backend: str
) -> None:
    """T1/T2/T4 on a 300-message history: pause points inside the loops too (at least 40,
    twice the small history's), each an await point."""
    modes = [(ERROR, False), (CANCEL, False), (CANCEL, True)]
    if anyio_backend == "asyncio":
        modes.append((NATIVE, False))
    for kind, persistent in modes:
        report = await sliced_sweep(op, anyio_backend, kind, persistent)
        assert report.labels.count(SLICE) >= 40, report.summary()
