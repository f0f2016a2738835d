"""Fault sweeps over every await point of a negotiated request (docs/design.md section 10).

Each sweep is ``amplifier_module_context_simple.testing.sweep``: it first runs the request
with no faults (the reference run: the expected ``after`` snapshot, the events the store
emits and the number N of seam hits), then, for k = 1, 2, ... rebuilds the same store and
runs the same request with a fault at hit k, until a run completes without reaching k
(which must be k = N + 1). A request is driven the way an orchestrator does
(``orchestrator.Orchestrator``): negotiation, validation and report, then
``await transaction.commit(...)`` immediately before dispatch.

Oracle (C1/C2, ``testing.sweep``): a run that raised leaves the store's observable state
exactly as before (history, sticky decisions, the *same* stats and meter objects, the
budget mark, version), except when the fault landed during the ``context:compaction``
delivery inside ``commit``, after the commit step: then the commit stands and the store
equals the no-fault ``after``. A run that returned equals ``after``. After a run that raised
with the store unchanged, a clean request on the same store reaches ``after`` and emits
what the reference run emitted (the store stays usable; nothing is sticky). Per trial,
the orchestrator's transaction is rolled back (raised, before) or committed (the commit
stood), and a rolled-back one never commits later.

Modes: ``error`` (``InjectedFault``; hooks swallow it, other seams propagate it),
``cancel`` (cancel the enclosing anyio ``CancelScope``) - each transient (hit k only) and
persistent (every hit >= k), on asyncio (real ``ModuleCoordinator``) and trio
(``LocalCoordinator``) - and ``native`` (``asyncio.current_task().cancel()`` at hit k,
the request running in its own asyncio task; asyncio only).

Await points per case (seam hits of the no-fault run; identical on both backends and in
every mode; ``-s`` prints one ``SWEEP`` line per test with the labels and how the k runs
ended: raised->before, boundary->after (the one cancellation landing in
``context:compaction`` delivery after the commit step), returned->after)::

    case                 points  seams (report = emit:orchestrator:provider_budget)
    not_needed              4    factory, count_view, emit:context:budget, report
    target_reached          6    factory, count_view x2, budget, report, compaction
    continued               7    factory, count_view x3 (rung 5 stops above the target
                                 and continues), budget, report, compaction
    target_every           10    factory, count_view x6, budget, report, compaction
    protected_floor         6    factory, count_view x2, budget, report, compaction
    floor_every            10    factory, count_view x6, budget, report, compaction
    reduced_output          7    factory, count_view x2, fit_output, budget, report, compaction
    reduced_every          11    factory, count_view x6, fit_output, budget, report, compaction
    recount_unavailable     5    factory, count_view x2, budget, report
    retained                6    factory, count_view x2, budget, report, compaction
    fallback                6    factory, count_view x2, budget, report, compaction
    seeded                  6    count_view x3, budget, report, compaction
    oversize_no_fit         2    factory, count_view (the request fails closed)

86 await points per (mode, backend); 10 sweeps per case (error/cancel x transient/persistent
x asyncio/trio, native x transient/persistent) = 860 faulted runs. ``CASES`` asserts each
count as a minimum. The deep tier adds a 48-case grid in every mode (each case with its
exact no-fault outcome, explained in ``GRID_FIRST_COUNTS``) and the trio
scheduler-step sweep (T5, ``testing.step_sweep``), which finds at least as many steps as
seam hits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import anyio.lowlevel
import pytest

from amplifier_module_context_simple import ContextLengthError
from amplifier_module_context_simple.negotiator.transaction import TxnState
from amplifier_module_context_simple.testing import (
    CANCEL,
    COMPACTION_EVENT,
    ERROR,
    NATIVE,
    FaultPlan,
    FaultyHooks,
    InjectedFault,
    Prepared,
    SweepReport,
    Trial,
    faulty_factory,
    step_sweep,
    sweep,
)
from tests.negotiator.orchestrator import (
    FakeProvider,
    FitRule,
    Orchestrator,
    Outcome,
    Rule,
    conversation,
    denser,
    fitted,
    mount_context,
    proportional,
    unavailable,
    view_chars,
)

SUMMARY: list[str] = []
PROMPT = "You are a careful assistant. Answer briefly and cite the files you read."
SEAM_ORDER = [
    "factory",
    "count_view",
    "fit_output",
    "emit:context:budget",
    "emit:orchestrator:provider_budget",
    f"emit:{COMPACTION_EVENT}",
]
"""The documented order of the seams of one negotiated request and its commit."""


@dataclass(frozen=True)
class Case:
    """One history/config/provider combination and what its no-fault run must do."""

    name: str
    config: dict[str, Any]
    history: list[dict[str, Any]]
    rule: Rule
    outcome: str | None
    """The no-fault outcome (None: the request fails closed with ``error``)."""
    min_points: int
    fit: FitRule | None = None
    factory: bool = True
    seed_budget: int | None = None
    """Commit an ordinary compaction at this budget before the measured request."""
    error: type[BaseException] | None = None
    committed: bool = True
    """Whether the no-fault run commits a transaction."""
    retain: tuple[str, ...] = ()
    counts: int | None = None
    """The no-fault run's provider counts, when the case depends on them."""
    first_count: int | None = None
    """The no-fault run's first count (``measured_before``), when the case pins it."""


BUSY = conversation(6, size=1200, rounds=2)
FLOOR = [
    {"role": "user", "content": "Read the attached specification carefully. " * 180},
    *conversation(6, size=1200, rounds=1),
]
REMINDER = "<system-reminders>Keep the answers short; cite file names.</system-reminders>"
SMALL = conversation(12, size=300, rounds=3)
RETAINED = [
    *conversation(6, size=1200, rounds=1)[:-1],
    {"role": "user", "content": REMINDER, "metadata": {"ephemeral": True, "persisted": True}},
    *conversation(4, size=1200, rounds=1),
]


def first_count_only(scale: float, *, limit: int) -> Rule:
    """Counts the untouched view; any reduced view loses its measurement."""
    counted = proportional(scale, limit=limit)

    def rule(view: list[dict[str, Any]]) -> Any:
        reduced = any("compaction" in (m.get("metadata") or {}) for m in view)
        if reduced or len(view) < len(BUSY):
            return unavailable(estimated=10, limit=limit)(view)
        return counted(view)

    return rule


CASES = [
    Case(
        "not_needed",
        {"max_tokens": 20_000},
        conversation(2, size=200),
        proportional(0.25, limit=20_000),
        "not_needed",
        min_points=4,
        committed=False,
    ),
    Case(
        "target_reached",
        {"max_tokens": 4000, "protected_tool_results": 1},
        BUSY,
        proportional(0.3, limit=4000),
        "target_reached",
        min_points=6,
    ),
    Case(
        "continued",  # a count above target continues the same rung
        {"max_tokens": 4000, "protected_tool_results": 1},
        SMALL,
        denser(0.3, 1.15, below=len(SMALL), limit=100_000),
        "target_reached",
        min_points=7,
        counts=3,
    ),
    Case(
        "target_every",
        {"max_tokens": 4000, "protected_tool_results": 1, "count_every_rung": True},
        BUSY,
        proportional(0.3, limit=4000),
        "target_reached",
        min_points=10,
    ),
    Case(
        "protected_floor",
        {"max_tokens": 4000, "protected_tool_results": 1},
        FLOOR,
        proportional(0.3, limit=10_000),
        "protected_floor",
        min_points=6,
    ),
    Case(
        "reduced_output",
        {"max_tokens": 4000, "protected_tool_results": 1},
        FLOOR,
        proportional(0.3, limit=3000, oversize=True),
        "reduced_output",
        min_points=7,
        fit=fitted(2900, calls=2, limit=3000),
    ),
    Case(
        "floor_every",
        {"max_tokens": 4000, "protected_tool_results": 1, "count_every_rung": True},
        FLOOR,
        proportional(0.3, limit=10_000),
        "protected_floor",
        min_points=10,
    ),
    Case(
        "reduced_every",
        {"max_tokens": 4000, "protected_tool_results": 1, "count_every_rung": True},
        FLOOR,
        proportional(0.3, limit=3000, oversize=True),
        "reduced_output",
        min_points=11,
        fit=fitted(2900, calls=2, limit=3000),
    ),
    Case(
        "recount_unavailable",
        {"max_tokens": 4000, "protected_tool_results": 1},
        BUSY,
        first_count_only(0.3, limit=10_000),
        "measurement_unavailable",
        min_points=5,
        committed=False,
    ),
    Case(
        "retained",
        {"max_tokens": 4000, "protected_tool_results": 1},
        RETAINED,
        proportional(0.3, limit=4000),
        "target_reached",
        min_points=6,
        retain=(REMINDER,),
    ),
    Case(
        "fallback",
        {"max_tokens": 4000, "protected_tool_results": 1},
        BUSY,
        unavailable(estimated=10, limit=4000),
        "measurement_unavailable",
        min_points=6,
    ),
    Case(
        "seeded",
        {"max_tokens": 4000, "protected_tool_results": 1},
        conversation(6, size=1200, rounds=3),
        proportional(0.4, limit=4000),
        "target_reached",
        min_points=6,
        factory=False,
        seed_budget=9000,
    ),
    Case(
        "oversize_no_fit",
        {"max_tokens": 4000},
        [{"role": "user", "content": "one prompt " * 40}],
        proportional(0.3, limit=10, oversize=True),
        None,
        min_points=2,
        error=ContextLengthError,
        committed=False,
    ),
]


@dataclass
class Run(Prepared[Outcome]):
    """One prepared request: the store, the orchestrator that drives it, its retry."""

    orchestrator: Orchestrator | None = None


async def build(case: Case, backend: str, plan: FaultPlan) -> Run:
    """A fresh mounted store with ``case``'s history, its seams routed through ``plan``
    (disarmed while the store is prepared)."""
    coordinator, context, _ = await mount_context(backend, case.config)
    plan.disarm()
    await context.set_messages(case.history)
    if case.seed_budget is not None:
        await context.get_messages_for_request(token_budget=case.seed_budget)
        assert context.last_compaction_stats is not None, "the seed must commit a compaction"
    hooks = FaultyHooks(plan, context.hooks)
    context.hooks = hooks
    if case.factory:
        await context.set_system_prompt_factory(faulty_factory(plan, PROMPT))
    orchestrator = Orchestrator(
        coordinator, FakeProvider(case.rule), fit=case.fit, plan=plan, retain=case.retain
    )

    async def follow_up() -> Outcome:
        """A clean request on the same store (a fresh orchestrator, no fault plan)."""
        again = Orchestrator(coordinator, FakeProvider(case.rule), fit=case.fit, retain=case.retain)
        return await again.run()

    prepared = Run(context, orchestrator.run, hooks, follow_up, orchestrator=orchestrator)
    orchestrator.on_result = lambda: prepared.reached("measured view returned")
    plan.arm()
    return prepared


def check_order(labels: list[str]) -> None:
    """Seams are hit in the documented order."""
    ranks = [SEAM_ORDER.index(label) for label in labels]
    assert ranks == sorted(ranks), labels
    assert labels.count("factory") <= 1 and labels.count("fit_output") <= 1, labels
    assert 1 <= labels.count("count_view") <= 9, labels


def checker(case: Case) -> Any:
    """Per-trial checks beyond the store oracle: the orchestrator's transaction, and what
    the unfaulted run did."""

    async def check(trial: Trial[Outcome]) -> None:
        await anyio.lowlevel.checkpoint()
        prepared = trial.prepared
        assert isinstance(prepared, Run) and prepared.orchestrator is not None
        transaction = prepared.orchestrator.transaction
        where = trial.describe()
        if trial.k > 0 and not trial.plan.fired:  # the unfaulted run
            check_order(trial.plan.labels)
            if case.error is not None:
                assert isinstance(trial.error, case.error), where
                return
            outcome = trial.value
            assert trial.returned and outcome is not None, where
            assert outcome.result["outcome"] == case.outcome, where
            assert outcome.dispatched, where
            assert case.counts in (None, trial.plan.labels.count("count_view")), where
            if case.first_count is not None:
                assert outcome.result["measured_before"] == case.first_count, where
            committed = outcome.committed is True
            assert committed is case.committed, where
            if committed:
                assert trial.plan.labels[-1] == f"emit:{COMPACTION_EVENT}", where
            return
        if trial.expected in ("before", "stage") and transaction is not None:
            assert transaction.state is TxnState.ROLLED_BACK, where
            assert await transaction.commit() is False, where
            assert transaction.state is TxnState.ROLLED_BACK, where
        elif trial.expected == "after" and not trial.returned:  # the commit stood
            assert transaction is not None and transaction.state is TxnState.COMMITTED, where

    return check


async def run_sweep(case: Case, backend: str, kind: str, persistent: bool) -> SweepReport:
    """Inject at every await point of ``case``'s request; return the sweep's report."""
    errors: tuple[type[BaseException], ...] = (InjectedFault,)
    if case.error is not None:
        errors += (case.error,)

    async def prepare(plan: FaultPlan) -> Prepared[Outcome]:
        return await build(case, backend, plan)

    report = await sweep(
        case.name,
        prepare,
        kind=kind,
        persistent=persistent,
        boundary={COMPACTION_EVENT},
        expected_errors=errors,
        check=checker(case),
    )
    committed = f"emit:{COMPACTION_EVENT}" in report.labels
    if committed and kind in (CANCEL, NATIVE):
        assert report.boundary == 1, report.summary()  # the one fault after the commit step
    SUMMARY.append(f"SWEEP {backend:<7} {report.summary()}")
    print(SUMMARY[-1])
    return report


MODES = [(ERROR, False), (ERROR, True), (CANCEL, False), (CANCEL, True)]


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "persistent"), MODES, ids=[f"{k}-{p}" for k, p in MODES])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_sweep(case: Case, kind: str, persistent: bool, anyio_backend: str) -> None:
    """An error or anyio cancellation at any await point leaves the store as before (or fully
    committed when it landed in ``context:compaction`` delivery); a run that returns equals
    the no-fault after; the store stays usable. Enumerates ``case.min_points``+ points."""
    report = await run_sweep(case, anyio_backend, kind, persistent)
    assert report.points >= case.min_points


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # a native asyncio mechanism
@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_native_sweep(case: Case, persistent: bool, anyio_backend: str) -> None:
    """Native ``Task.cancel()`` at any await point (asyncio, real coordinator): raised ->
    store as before, or committed when it landed in delivery after the commit step;
    returned -> the no-fault after. Enumerates ``case.min_points``+ points."""
    report = await run_sweep(case, anyio_backend, NATIVE, persistent)
    assert report.points >= case.min_points


# -- deep tier ------------------------------------------------------------------------------

GRID_TRIGGER = 2944
"""The grid's trigger: ``compact_threshold`` 0.92 of the policy budget, ``max_tokens`` 4000
less the 800-token notice reserve (3200); its target is ``target_usage`` 0.5 of it, 1600."""

GRID_FIRST_COUNTS = {
    # (turns, size, scale): the first count, int(view_chars(system prompt + history) *
    # scale), and why the no-fault outcome is what it is (without ``oversize``: provider
    # limit 10,000; ``count_every_rung`` changes which candidates are counted, not the
    # outcome: the candidate returned is always counted).
    (2, 300, 0.2): 611,  # under the trigger 2944: not_needed, nothing staged
    (2, 300, 0.5): 1528,  # under the trigger: not_needed
    (2, 1500, 0.2): 1571,  # under the trigger: not_needed
    (2, 1500, 0.5): 3928,  # over the trigger: the older tool results reduce it under the
    # target 1600 (measured_after 1178): target_reached
    (6, 300, 0.2): 1449,  # under the trigger: not_needed
    (6, 300, 0.5): 3624,  # over the trigger: target_reached (1364)
    (6, 1500, 0.2): 4329,  # over the trigger: target_reached (1505)
    (6, 1500, 0.5): 10824,  # over the trigger and the limit 10,000: the rungs stop at the
    # target, under both (1518): target_reached
    (10, 300, 0.2): 2288,  # under the trigger: not_needed
    (10, 300, 0.5): 5720,  # over the trigger: target_reached (1364)
    (10, 1500, 0.2): 7088,  # over the trigger: target_reached (1297)
    (10, 1500, 0.5): 17720,  # over the trigger and the limit: target_reached (1178)
}
"""The grid without ``oversize``: not_needed under the trigger (no transaction: nothing
commits), else target_reached (committed). With ``oversize`` (provider limit 3000, every
count reports ``estimated = max(count, 3001)``) no count ever fits: the first is not
``not_needed`` whatever its size, no rung reaches ``target_reached``, every rung runs and
``fit_output`` (2900 at an output cap, limit 3000) fits once: reduced_output, committed
(the rungs staged the older tool results' reductions)."""


def grid_case(turns: int, size: int, scale: float, every: bool, oversize: bool) -> Case:
    """One grid case with the outcome ``GRID_FIRST_COUNTS`` explains."""
    first = GRID_FIRST_COUNTS[(turns, size, scale)]
    outcome = "target_reached" if first >= GRID_TRIGGER else "not_needed"
    if oversize:
        outcome = "reduced_output"
    return Case(
        f"grid-t{turns}-s{size}-x{scale}-{'every' if every else 'skip'}"
        f"{'-oversize' if oversize else ''}",
        {"max_tokens": 4000, "protected_tool_results": 1, "count_every_rung": every},
        conversation(turns, size=size, rounds=2),
        proportional(scale, limit=3000 if oversize else 10_000, oversize=oversize),
        outcome,
        min_points=3,
        fit=fitted(2900, calls=2, limit=3000) if oversize else None,
        committed=outcome != "not_needed",
        first_count=first,
    )


GRID = [
    grid_case(*combination)
    for combination in itertools.product(
        (2, 6, 10), (300, 1500), (0.2, 0.5), (False, True), (False, True)
    )
]
GRID_OUTCOMES = {"not_needed": 10, "target_reached": 14, "reduced_output": 24}
"""How many grid cases end each way (``test_grid_outcomes_follow_from_the_cases``)."""


def test_grid_outcomes_follow_from_the_cases() -> None:
    """The grid's table is the cases' arithmetic: each first count is the fake provider's
    count of the system prompt and the history, and the outcomes split as stated."""
    for (turns, size, scale), first in GRID_FIRST_COUNTS.items():
        view = [{"role": "system", "content": PROMPT}, *conversation(turns, size=size, rounds=2)]
        assert int(view_chars(view) * scale) == first, (turns, size, scale)
    assert int(0.92 * (4000 - 800)) == GRID_TRIGGER and len(GRID) == 48
    outcomes = [case.outcome for case in GRID]
    assert {name: outcomes.count(name) for name in GRID_OUTCOMES} == GRID_OUTCOMES


DEEP_MODES = [*MODES, (NATIVE, False), (NATIVE, True)]


@pytest.mark.deep
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("case", GRID, ids=[case.name for case in GRID])
async def test_sweep_grid(case: Case, anyio_backend: str) -> None:
    """Every mode of the sweep over a grid of histories, budgets and provider scales, each
    with the no-fault outcome ``GRID_FIRST_COUNTS`` explains: the same oracle as
    ``test_sweep``."""
    for kind, persistent in DEEP_MODES:
        if kind != NATIVE or anyio_backend == "asyncio":
            report = await run_sweep(case, anyio_backend, kind, persistent)
            assert report.points >= case.min_points
    await anyio.lowlevel.checkpoint()  # (the loop always sweeps; flake8-async cannot tell)


@pytest.mark.deep
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_step_sweep(case: Case, anyio_backend: str) -> None:
    """(T5) Cancel before every scheduler step of the request's task (trio,
    ``testing.step_sweep``): catches awaits outside the seams. Raised -> before, or after
    when the transaction had committed; returned -> after. Enumerates at least as many
    steps as seam hits (no unseen await escapes)."""
    errors: tuple[type[BaseException], ...] = () if case.error is None else (case.error,)

    async def prepare(plan: FaultPlan) -> Prepared[Outcome]:
        return await build(case, anyio_backend, plan)

    report = await step_sweep(
        case.name, prepare, boundary={COMPACTION_EVENT}, expected_errors=errors
    )
    line = f"STEPS {case.name:<18} trio {report.points:>2} scheduler steps, {len(report.labels)} seam hits"
    SUMMARY.append(line)
    print(line)
    assert report.points >= len(report.labels)
