"""Fault sweeps over every await point of a negotiated request (RELIABILITY T1, T2, T4).

Each sweep first runs the request with no faults (the reference run): that gives the
expected ``after`` snapshot and the number N of seam hits (await points). Then, for
k = 1, 2, ... it rebuilds the same store and runs the same request with a fault at hit k,
until a run completes without reaching k (which must be k = N + 1). A request is driven
the way an orchestrator does (``orchestrator.Orchestrator``): negotiation, validation and
report, then ``await transaction.commit(...)`` immediately before dispatch.

Oracle (C1/C2): a run that raised leaves the store exactly as before (history, sticky
decisions, the *same* stats object, version), except when the fault landed during the
``context:compaction`` delivery inside ``commit``, after the commit step: then the commit
stands and the store equals the no-fault ``after``. A run that returned equals ``after``.
After a run that raised with the store unchanged, a clean follow-up request on the same
store reaches ``after`` (the store stays usable; nothing is sticky).

Modes: ``error`` (``InjectedFault``; hooks swallow it, other seams propagate it),
``cancel`` (cancel the enclosing anyio ``CancelScope``) - each transient (hit k only) and
persistent (every hit >= k), on asyncio (real ``ModuleCoordinator``) and trio
(``LocalCoordinator``) - and ``native`` (``asyncio.current_task().cancel()`` at hit k,
the request running in ``asyncio.create_task``; asyncio only).

Await points per case (seam hits of the no-fault run; identical on both backends and in
every mode; ``-s`` prints one ``SWEEP`` line per test with the labels and how the k runs
ended: raised/before, raised/committed (the one cancellation landing in
``context:compaction`` delivery after the commit step), returned)::

    case                 points  seams (report = emit:orchestrator:provider_budget)
    not_needed              4    factory, count_view, emit:context:budget, report
    target_reached          7    factory, count_view x3, budget, report, compaction
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

80 await points per (mode, backend); 10 sweeps per case (error/cancel x transient/persistent
x asyncio/trio, native x transient/persistent) = 800 faulted runs. ``CASES`` asserts each
count as a minimum. The deep tier adds a 48-case grid in every mode and the trio
scheduler-step sweep (T5), which finds exactly as many steps as seam hits.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from amplifier_module_context_simple import ContextLengthError, SimpleContextManager
from amplifier_module_context_simple.negotiator.transaction import TxnState
from tests.negotiator.faults import (
    CANCEL,
    COMPACTION_DELIVERY,
    ERROR,
    NATIVE,
    FaultPlan,
    InjectedFault,
    Snapshot,
    install,
    snapshot,
)
from tests.negotiator.orchestrator import (
    FakeProvider,
    FitRule,
    Orchestrator,
    Outcome,
    Rule,
    conversation,
    fitted,
    mount_context,
    proportional,
    unavailable,
)

SUMMARY: list[str] = []
ANY = "*"


async def system_prompt() -> str:
    return "You are a careful assistant. Answer briefly and cite the files you read."


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
    committed: bool | None = True
    """Whether the no-fault run commits a transaction (None: whatever it does)."""
    retain: tuple[str, ...] = ()


BUSY = conversation(6, size=1200, rounds=2)
FLOOR = [
    {"role": "user", "content": "Read the attached specification carefully. " * 180},
    *conversation(6, size=1200, rounds=1),
]
REMINDER = "<system-reminders>Keep the answers short; cite file names.</system-reminders>"
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
        min_points=7,
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
class Trial:
    plan: FaultPlan
    context: SimpleContextManager
    orchestrator: Orchestrator
    before: Snapshot
    stats_before: dict[str, Any] | None
    outcome: Outcome | None = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.outcome is None


async def build(case: Case, backend: str, plan: FaultPlan) -> Trial:
    """A fresh mounted store with ``case``'s history, seams routed through ``plan``."""
    coordinator, context, _ = await mount_context(backend, case.config)
    await context.set_messages(case.history)
    if case.seed_budget is not None:
        await context.get_messages_for_request(token_budget=case.seed_budget)
        assert context.last_compaction_stats is not None, "the seed must commit a compaction"
    await install(context, plan, system_prompt if case.factory else None)
    orchestrator = Orchestrator(
        coordinator, FakeProvider(case.rule), fit=case.fit, plan=plan, retain=case.retain
    )
    return Trial(plan, context, orchestrator, snapshot(context), context.last_compaction_stats)


async def run_trial(case: Case, backend: str, plan: FaultPlan) -> Trial:
    trial = await build(case, backend, plan)
    allowed: tuple[type[BaseException], ...] = (InjectedFault,)
    if case.error is not None:
        allowed += (case.error,)
    if plan.kind == NATIVE:
        task = asyncio.create_task(trial.orchestrator.run())
        await asyncio.wait([task])
        if not task.cancelled():
            error = task.exception()
            if error is None:
                trial.outcome = task.result()
            elif isinstance(error, allowed):
                trial.error = error
            else:
                raise error
        return trial
    with anyio.CancelScope() as scope:
        plan.scope = scope
        try:
            trial.outcome = await trial.orchestrator.run()
        except allowed as error:
            trial.error = error
    return trial


def check_order(labels: list[str]) -> None:
    """Seams are hit in the documented order."""
    order = [
        "factory",
        "count_view",
        "fit_output",
        "emit:context:budget",
        "emit:orchestrator:provider_budget",
        COMPACTION_DELIVERY,
    ]
    ranks = [order.index(label) for label in labels]
    assert ranks == sorted(ranks), labels
    assert labels.count("factory") <= 1 and labels.count("fit_output") <= 1, labels
    assert 1 <= labels.count("count_view") <= 9, labels


@dataclass(frozen=True)
class Reference:
    after: Snapshot
    labels: list[str]
    committed: bool


async def reference(case: Case, backend: str) -> Reference:
    """The no-fault run: the expected ``after``, the seam labels, whether it committed."""
    trial = await run_trial(case, backend, FaultPlan())
    check_order(trial.plan.labels)
    after = snapshot(trial.context)
    assert after.messages == trial.before.messages  # the canonical history never changes
    if case.error is not None:
        assert isinstance(trial.error, case.error), trial.error
        assert after == trial.before
        return Reference(after, trial.plan.labels, committed=False)
    assert trial.outcome is not None, trial.error
    assert case.outcome in (ANY, trial.outcome.result["outcome"])
    assert trial.outcome.dispatched
    committed = trial.outcome.committed is True
    assert case.committed in (None, committed)
    if committed:
        assert after != trial.before and after.version != trial.before.version
        assert trial.plan.labels[-1] == COMPACTION_DELIVERY
    else:
        assert after == trial.before
    return Reference(after, trial.plan.labels, committed)


async def sweep(case: Case, backend: str, kind: str, persistent: bool) -> int:
    """Inject at every await point; return the number of await points enumerated."""
    ref = await reference(case, backend)
    after, labels = ref.after, ref.labels
    points = len(labels)
    tally = {"raised/before": 0, "raised/committed": 0, "returned": 0}
    for k in itertools.count(1):
        plan = FaultPlan(k, kind, persistent)
        trial = await run_trial(case, backend, plan)
        state = snapshot(trial.context)
        where = (k, plan.fired_label, plan.labels, trial.error)
        assert state.messages == trial.before.messages, where
        if plan.fired == 0:  # the run completed without reaching k
            assert k == points + 1, where
            assert not trial.raised or case.error is not None, where
            assert state == after, where
            break
        assert k <= points, where
        assert plan.labels[: k - 1] == labels[: k - 1], where  # deterministic up to the fault
        transaction = trial.orchestrator.transaction
        if not trial.raised:
            assert state == after, where
            tally["returned"] += 1
        elif plan.last_fired == COMPACTION_DELIVERY and ref.committed:
            assert state == after, where  # the commit stands once delivery started
            assert transaction.state is TxnState.COMMITTED, where
            tally["raised/committed"] += 1
        else:
            assert kind != ERROR or trial.error is not None, where
            assert state == trial.before, where
            assert trial.context.last_compaction_stats is trial.stats_before, where
            if transaction is not None:
                assert transaction.state is TxnState.ROLLED_BACK, where
                assert await transaction.commit() is False, where
                assert transaction.state is TxnState.ROLLED_BACK, where
            await follow_up(case, trial, after)
            tally["raised/before"] += 1
    if ref.committed and kind in (CANCEL, NATIVE):
        assert tally["raised/committed"] == 1  # the one fault after the commit step
    SUMMARY.append(
        f"SWEEP {case.name:<18} {backend:<7} {kind:<6} "
        f"{'persistent' if persistent else 'transient':<10} {points:>2} await points "
        f"{tally} {labels}"
    )
    print(SUMMARY[-1])
    return points


async def follow_up(case: Case, trial: Trial, after: Snapshot) -> None:
    """A clean request on the same store after a raised one reaches the no-fault ``after``."""
    trial.plan.disarm()
    again = Orchestrator(
        trial.orchestrator.coordinator, FakeProvider(case.rule), fit=case.fit, retain=case.retain
    )
    if case.error is not None:
        with pytest.raises(case.error):
            await again.run()
    else:
        await again.run()
    assert snapshot(trial.context) == after


MODES = [(ERROR, False), (ERROR, True), (CANCEL, False), (CANCEL, True)]


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "persistent"), MODES, ids=[f"{k}-{p}" for k, p in MODES])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_sweep(case: Case, kind: str, persistent: bool, anyio_backend: str) -> None:
    """An error or anyio cancellation at any await point leaves the store as before (or fully
    committed when it landed in ``context:compaction`` delivery); a run that returns equals
    the no-fault after; the store stays usable. Enumerates ``case.min_points``+ points."""
    points = await sweep(case, anyio_backend, kind, persistent)
    assert points >= case.min_points


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # a native asyncio mechanism
@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_native_sweep(case: Case, persistent: bool, anyio_backend: str) -> None:
    """Native ``Task.cancel()`` at any await point (asyncio, real coordinator): raised ->
    store as before, or committed when it landed in delivery after the commit step;
    returned -> the no-fault after. Enumerates ``case.min_points``+ points."""
    points = await sweep(case, anyio_backend, NATIVE, persistent)
    assert points >= case.min_points


# -- deep tier ------------------------------------------------------------------------------

GRID = [
    Case(
        f"grid-t{turns}-s{size}-x{scale}-{'every' if every else 'skip'}"
        f"{'-oversize' if oversize else ''}",
        {"max_tokens": 4000, "protected_tool_results": 1, "count_every_rung": every},
        conversation(turns, size=size, rounds=2),
        proportional(scale, limit=3000 if oversize else 10_000, oversize=oversize),
        ANY,
        min_points=3,
        fit=fitted(2900, calls=2, limit=3000) if oversize else None,
        committed=None,
    )
    for turns, size, scale, every, oversize in itertools.product(
        (2, 6, 10), (300, 1500), (0.2, 0.5), (False, True), (False, True)
    )
]
DEEP_MODES = [*MODES, (NATIVE, False), (NATIVE, True)]


@pytest.mark.deep
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("case", GRID, ids=[case.name for case in GRID])
async def test_sweep_grid(case: Case, anyio_backend: str) -> None:
    """Every mode of the sweep over a grid of histories, budgets and provider scales (any
    outcome): the same oracle as ``test_sweep``."""
    for kind, persistent in DEEP_MODES:
        if kind == NATIVE and anyio_backend != "asyncio":
            continue
        assert await sweep(case, anyio_backend, kind, persistent) >= case.min_points


class CancelAfterSteps:
    """A trio ``Instrument`` that cancels ``scope`` before the task's k-th scheduler step."""

    def __init__(self, task: Any, scope: anyio.CancelScope, k: int) -> None:
        self.task, self.scope, self.k, self.steps = task, scope, k, 0

    def before_task_step(self, task: Any) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps == self.k:
                self.scope.cancel()


@pytest.mark.deep
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_step_sweep(case: Case, anyio_backend: str) -> None:
    """(T5) Cancel before every scheduler step of the request's task (trio; k = 0 cancels
    before the first checkpoint): catches awaits outside the seams. Raised -> before, or
    after when the transaction had committed; returned -> after. Enumerates as many steps
    as seam hits (no unseen await)."""
    import trio
    import trio.lowlevel

    ref = await reference(case, anyio_backend)
    allowed: tuple[type[BaseException], ...] = (InjectedFault,)
    if case.error is not None:
        allowed += (case.error,)
    for k in itertools.count(0):
        trial = await build(case, anyio_backend, FaultPlan())
        task = trio.lowlevel.current_task()
        with anyio.CancelScope() as scope:
            if k == 0:
                scope.cancel()
            instrument = CancelAfterSteps(task, scope, k)
            trio.lowlevel.add_instrument(instrument)  # type: ignore[arg-type]
            try:
                trial.outcome = await trial.orchestrator.run()
            except allowed as error:
                trial.error = error
            finally:
                trio.lowlevel.remove_instrument(instrument)  # type: ignore[arg-type]
        state = snapshot(trial.context)
        transaction = trial.orchestrator.transaction
        committed = transaction is not None and transaction.state is TxnState.COMMITTED
        expected = ref.after if not trial.raised or committed else trial.before
        if case.error is not None and trial.error is not None:
            expected = trial.before
        assert state == expected, (k, instrument.steps)
        if k == 0:
            assert trial.raised and state == trial.before
        elif instrument.steps < k:
            steps = k - 1
            break
    line = f"STEPS {case.name:<18} trio {steps:>2} scheduler steps, {len(ref.labels)} seam hits"
    SUMMARY.append(line)
    print(line)
    assert steps >= len(ref.labels)
