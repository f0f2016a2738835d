"""The operations the sweeps enumerate, each in a fixed starting state, and the sweep runner.

Histories are small and fixed (``harness.mixed_history``: all three tool formats). The
ordinary path (compacting, pending tail, quiet, floor, sticky, without factory), hard fit
with a retained reminder, the negotiated path (every outcome), and
``RequestTransaction.commit``.
"""

from __future__ import annotations

from typing import Any

from amplifier_module_context_simple.testing import (
    BUDGET_EVENT,
    CANCEL,
    COMPACTION_EVENT,
    ERROR,
    FaultPlan,
    InjectedFault,
    Prepared,
    SweepReport,
    sweep,
)
from tests.negotiator.orchestrator import conversation, denser, fitted, proportional, unavailable
from tests.reliability.harness import (
    LIMIT,
    REMINDER,
    Operation,
    build,
    checker,
    mixed_history,
    record,
    small_history,
    track_transactions,
)

HISTORY = tuple(mixed_history(1200))
PENDING = tuple(mixed_history(1200, pending=True))
SMALL = tuple(small_history())
GROUPS = tuple(conversation(12, size=300, rounds=3))
"""36 small tool groups: the removal passes stop one group at a time."""
CONFIG = (("protected_tool_results", 1),)
MEASURED = (("protected_tool_results", 1), ("max_tokens", 3000))
EVERY_RUNG = (*MEASURED, ("count_every_rung", True))

OPERATIONS = [
    # the ordinary path: factory, then (after the commit) compaction and budget delivery
    Operation("ordinary/compacting", "ordinary", HISTORY, CONFIG, budget=2400, min_points=3),
    Operation("ordinary/pending-tail", "ordinary", PENDING, CONFIG, budget=2400, min_points=3),
    Operation("ordinary/quiet", "ordinary", SMALL, CONFIG, budget=20_000, min_points=2),
    Operation("ordinary/floor", "ordinary", HISTORY, CONFIG, budget=1000, min_points=3),
    Operation(
        "ordinary/sticky", "ordinary", HISTORY, CONFIG, budget=2400, seed_budget=3000, min_points=2
    ),
    Operation(
        "ordinary/no-factory", "ordinary", HISTORY, CONFIG, budget=2400, factory=False, min_points=2
    ),
    # hard fit with a retained reminder
    Operation(
        "hard-fit", "hard_fit", HISTORY, CONFIG, budget=1800, retain=(REMINDER,), min_points=3
    ),
    # the negotiated path: factory, counts, fit_output, then budget delivery
    Operation(
        "measured/not-needed",
        "measured",
        HISTORY,
        MEASURED,
        rule=proportional(0.05, limit=LIMIT),
        outcome="not_needed",
        min_points=3,
    ),
    Operation(
        "measured/target-reached",
        "measured",
        HISTORY,
        MEASURED,
        rule=proportional(0.3, limit=LIMIT),
        outcome="target_reached",
        min_points=4,
    ),
    Operation(
        "measured/continued",  # a count above target continues the same rung (5)
        "measured",
        GROUPS,
        (("protected_tool_results", 1), ("max_tokens", 4000)),
        rule=denser(0.3, 1.15, below=len(GROUPS), limit=LIMIT),
        outcome="target_reached",
        min_points=5,
    ),
    Operation(
        "measured/every-rung",
        "measured",
        HISTORY,
        EVERY_RUNG,
        rule=proportional(0.3, limit=LIMIT),
        outcome="target_reached",
        min_points=4,
    ),
    Operation(
        "measured/reduced-output",
        "measured",
        HISTORY,
        MEASURED,
        rule=proportional(0.3, limit=1500, oversize=True),
        fit=fitted(1400, limit=1500),
        outcome="reduced_output",
        min_points=6,
    ),
    Operation(
        "measured/unavailable",
        "measured",
        HISTORY,
        MEASURED,
        rule=unavailable(estimated=10, limit=LIMIT),
        outcome="measurement_unavailable",
        min_points=4,
    ),
    Operation(
        "measured/floor",
        "measured",
        HISTORY,
        MEASURED,
        rule=proportional(1.0, limit=LIMIT),
        outcome="protected_floor",
        min_points=4,
    ),
    Operation(
        "measured/retained",
        "measured",
        HISTORY,
        MEASURED,
        rule=proportional(0.3, limit=LIMIT),
        retain=(REMINDER,),
        outcome="target_reached",
        min_points=4,
    ),
    # RequestTransaction.commit: entry, is_cancelled, then compaction delivery
    Operation(
        "commit/target-reached",
        "commit",
        HISTORY,
        MEASURED,
        rule=proportional(0.3, limit=LIMIT),
        min_points=3,
    ),
    Operation(
        "commit/reduced-output",
        "commit",
        HISTORY,
        MEASURED,
        rule=proportional(0.3, limit=1500, oversize=True),
        fit=fitted(1400, limit=1500),
        min_points=3,
    ),
]
IDS = [op.name for op in OPERATIONS]
MODES = [(ERROR, False), (ERROR, True), (CANCEL, False), (CANCEL, True)]
MODE_IDS = ["error-transient", "error-persistent", "cancel-transient", "cancel-persistent"]


def boundary(op: Operation) -> frozenset[str]:
    """Deliveries after which a fault keeps the operation's commit.

    The ordinary and hard-fit paths commit, then deliver ``context:compaction`` and
    ``context:budget``; ``commit()`` applies, then delivers ``context:compaction``. The
    negotiated view commits nothing: it delivers ``context:budget`` *before* its return
    boundary (the meter stats), so a fault there leaves the store exactly as before.
    """
    if op.kind == "commit":
        return frozenset({COMPACTION_EVENT})
    if op.kind == "measured":
        return frozenset()
    return frozenset({COMPACTION_EVENT, BUDGET_EVENT})


async def run_sweep(
    op: Operation,
    backend: str | None,
    kind: str,
    persistent: bool,
    *,
    expected_errors: tuple[type[BaseException], ...] = (InjectedFault,),
) -> SweepReport:
    """Sweep ``op``; record the report under ``backend`` (None: a mutant run, not recorded)."""
    with track_transactions() as ledger:

        async def prepare(plan: FaultPlan) -> Prepared[Any]:
            return await build(op, plan, ledger)

        report = await sweep(
            op.name,
            prepare,
            kind=kind,
            persistent=persistent,
            boundary=boundary(op),
            expected_errors=expected_errors,
            check=checker(op, ledger),
        )
    if backend is not None:
        record(backend, report)
    assert report.trials == report.points or persistent, report.summary()
    return report


OPERATION = {op.name: op for op in OPERATIONS}
