"""Sweeps: inject a fault at every await point of an operation and judge each outcome.

``sweep`` runs an operation once without faults (the reference: the expected ``after``
snapshot, the events it delivers and the number of await points), then once per await
point with a fault there, and checks the outcome against the store:

- an operation that returned left the store equal to the no-fault ``after``;
- an operation that raised left it exactly as before (same values, same objects), except
  when the fault interrupted a *boundary delivery* (an event delivered after the
  operation's commit, see ``hooks.BOUNDARY_EVENTS``): then the commit stands and the store
  equals ``after``, but for the marks of the deliveries that did not complete
  (``DELIVERY_MARKS``: the ``context:budget`` payload is recorded as delivered only once
  its delivery completed, so the next request delivers it again);
- after a run that raised and left the store as before, a clean retry (``follow_up``)
  ends like the reference run, reaches ``after`` and emits the same events (names and
  payloads) as the reference run did;
- a *composite* run (an orchestrator's request: the measured getter, then the
  orchestrator's own awaits, then the commit) records with ``Prepared.reached(stage)``
  each inner store operation that returned; a run that raised after one returned leaves
  the store as the reference run had it at that stage (what returned fully happened: its
  meter stats and budget payload stand), nothing more.

Snapshots are ``ContextStore.observable_state()`` (``state.snapshot``): every mark that
changes a later request is compared. A disagreement raises ``SweepFailure`` whose
``code`` names the failed check and ``fields`` the snapshot fields that differ.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import anyio
import anyio.lowlevel

from .faults import NATIVE, FaultPlan, InjectedFault
from .hooks import BOUNDARY_EVENTS, BUDGET_EVENT, RecordingHooks
from .state import Snapshot, freeze, snapshot

if TYPE_CHECKING:
    from ..context.store import ContextStore

__all__ = (
    "DELIVERY_MARKS",
    "Prepare",
    "Prepared",
    "SweepFailure",
    "SweepReport",
    "Trial",
    "after_interruption",
    "sweep",
)

T = TypeVar("T")

DELIVERY_MARKS: Final[Mapping[str, str]] = {BUDGET_EVENT: "budget_mark"}
"""Event -> the snapshot field that records its delivery. A store records the mark only
once the delivery completed, so a run interrupted before then keeps the mark it had."""


@dataclass
class Prepared(Generic[T]):
    """A fresh store with its seams routed through a plan, and the operation to run."""

    manager: ContextStore
    run: Callable[[], Awaitable[T]]
    hooks: RecordingHooks | None = None
    follow_up: Callable[[], Awaitable[object]] | None = None
    """A clean retry after a run that raised and left the store unchanged."""
    stages: dict[str, Snapshot] = field(default_factory=dict)
    """The inner store operations of a composite run that returned, in order, with the
    store's state right then (see ``reached``)."""

    def reached(self, stage: str) -> None:
        """Record that an inner store operation of the run returned (e.g. an orchestrator's
        measured getter, before the orchestrator's own awaits and the commit)."""
        self.stages[stage] = snapshot(self.manager)


Prepare = Callable[[FaultPlan], Awaitable[Prepared[T]]]


@dataclass
class Trial(Generic[T]):
    """One run of an operation with a fault at hit (or step) ``k``."""

    k: int
    plan: FaultPlan
    prepared: Prepared[T]
    before: Snapshot
    state: Snapshot | None = None
    returned: bool = False
    value: T | None = None
    error: BaseException | None = None
    cancelled: bool = False
    expected: str = ""
    """Which reference the oracle compared against: ``before``, ``after`` or ``stage``."""
    start: tuple[int, int, int] = (0, 0, 0)
    """How many events the hooks had been handed, had delivered and had failed when the run
    started."""

    def __post_init__(self) -> None:
        hooks = self.prepared.hooks
        if hooks is not None:
            self.start = (len(hooks.emitted), len(hooks.events), len(hooks.failed))

    @property
    def interrupted(self) -> list[str]:
        hooks = self.prepared.hooks
        return hooks.interrupted if hooks is not None else []

    @property
    def emitted(self) -> list[tuple[str, dict[str, Any]]]:
        """The events the run handed the hooks (``(event, data)``, in order)."""
        hooks = self.prepared.hooks
        return hooks.emitted[self.start[0] :] if hooks is not None else []

    @property
    def delivered(self) -> list[tuple[str, dict[str, Any]]]:
        """The deliveries the run completed (``(event, data)``, in order)."""
        hooks = self.prepared.hooks
        return hooks.events[self.start[1] :] if hooks is not None else []

    @property
    def finished(self) -> set[str]:
        """Events whose delivery in this run ended without a cancellation: completed, or
        failed with an error (the store logs it and counts the event as delivered)."""
        hooks = self.prepared.hooks
        if hooks is None:
            return set()
        return {event for event, _ in self.delivered} | set(hooks.failed[self.start[2] :])

    def describe(self) -> str:
        outcome = "returned" if self.returned else ("cancelled" if self.cancelled else "raised")
        return (
            f"k={self.k} kind={self.plan.kind} persistent={self.plan.persistent} "
            f"fired={self.plan.fired} labels={self.plan.labels} outcome={outcome} "
            f"error={self.error!r} interrupted={self.interrupted}"
        )


class SweepFailure(AssertionError):
    """A sweep found a run whose outcome and store state disagree.

    ``code`` names the check that failed: ``reference-changed`` (the no-fault run raised
    and changed the store), ``seam-order``, ``unreached`` (a run reached fewer await
    points than the reference), ``unfaulted-differs``, ``returned-not-after``,
    ``undocumented-error``, ``boundary-not-after`` (a fault in a boundary delivery did not
    keep the commit, or set the mark of a delivery it interrupted), ``stage-not-kept``
    (a composite run raised after an inner operation returned and the store is not as
    the reference run had it then), ``raised-not-before``
    (a run that raised changed the store), ``retry-outcome``, ``retry-state`` or
    ``retry-events`` (a clean retry ended, left the store or emitted events unlike the
    reference run). ``fields`` are the snapshot fields that differ, when states differ.
    """

    def __init__(
        self,
        name: str,
        trial: Trial[Any],
        problem: str,
        *,
        code: str,
        fields: Sequence[str] = (),
    ) -> None:
        super().__init__(f"{name}: {problem}\n  {trial.describe()}")
        self.trial = trial
        self.problem = problem
        self.code = code
        self.fields = tuple(fields)


@dataclass
class SweepReport:
    """How many await points (or scheduler steps) a sweep enumerated, and what happened."""

    name: str
    mode: str
    points: int
    labels: list[str]
    trials: int = 0
    raised_before: int = 0
    boundary: int = 0
    returned: int = 0
    staged: int = 0
    """Runs that raised after an inner store operation returned (judged at its stage)."""

    def record(self, trial: Trial[Any], verdict: str) -> None:
        """Tally one faulted run and note on ``trial`` which state it was judged against."""
        self.trials += 1
        trial.expected = {"before": "before", "stage": "stage"}.get(verdict, "after")
        if verdict == "before":
            self.raised_before += 1
        elif verdict == "boundary":
            self.boundary += 1
        elif verdict == "stage":
            self.staged += 1
        else:
            self.returned += 1

    def summary(self) -> str:
        unit = "scheduler steps" if self.mode == "trio steps" else "await points"
        staged = f", raised->stage {self.staged}" if self.staged else ""
        return (
            f"{self.name} [{self.mode}]: {self.points} {unit}, {self.trials} faulted runs "
            f"(raised->before {self.raised_before}{staged}, boundary->after {self.boundary}, "
            f"returned->after {self.returned}) {self.labels}"
        )


def after_interruption(after: Snapshot, trial: Trial[Any]) -> Snapshot:
    """The state a run interrupted in a boundary delivery must leave: the no-fault
    ``after``, except that a mark whose delivery did not finish in this run (it was
    cancelled, or never started) keeps the value it had before the run."""
    finished = trial.finished
    kept = {
        field: getattr(trial.before, field)
        for event, field in DELIVERY_MARKS.items()
        if event not in finished
    }
    return dataclasses.replace(after, **kept)


def _judge(
    name: str,
    trial: Trial[Any],
    reference: Trial[Any],
    boundary: Collection[str],
    expected_errors: tuple[type[BaseException], ...],
) -> str:
    """Check one finished trial against the oracle; return ``before``, ``stage``,
    ``boundary`` or ``after``."""
    after = reference.state
    assert after is not None
    state = trial.state
    assert state is not None
    if trial.returned:
        if state != after:
            fields = state.differences(after, objects=False)
            raise SweepFailure(
                name,
                trial,
                f"returned but store != no-fault after: {fields}",
                code="returned-not-after",
                fields=fields,
            )
        return "after"
    if trial.error is not None and not isinstance(trial.error, expected_errors):
        raise SweepFailure(
            name,
            trial,
            f"undocumented error type {type(trial.error).__name__}",
            code="undocumented-error",
        )
    if any(event in boundary for event in trial.interrupted):
        expected = after_interruption(after, trial)
        if state != expected:
            fields = state.differences(expected, objects=False)
            raise SweepFailure(
                name,
                trial,
                "a fault interrupting a boundary delivery must keep the commit: store != "
                f"no-fault after: {fields}",
                code="boundary-not-after",
                fields=fields,
            )
        return "boundary"
    reached = list(trial.prepared.stages)
    if reached:
        stage = reached[-1]
        at_stage = reference.prepared.stages.get(stage)
        if at_stage is None or state != at_stage:
            fields = state.differences(at_stage, objects=False) if at_stage is not None else []
            raise SweepFailure(
                name,
                trial,
                f"raised after {stage!r} returned, but store != the reference's state at "
                f"{stage!r}: {fields}",
                code="stage-not-kept",
                fields=fields,
            )
        return "stage"
    if state != trial.before or not state.same_objects(trial.before):
        fields = state.differences(trial.before)
        raise SweepFailure(
            name,
            trial,
            f"raised but store != before: {fields}",
            code="raised-not-before",
            fields=fields,
        )
    return "before"


async def _run_trial(trial: Trial[T]) -> None:  # noqa: ASYNC910 - the scope may absorb it
    plan = trial.plan
    run = trial.prepared.run
    if plan.kind == NATIVE or NATIVE in plan.always.values():
        import asyncio

        async def body() -> T:
            return await run()

        task = asyncio.ensure_future(body())
        await asyncio.wait([task])
        if task.cancelled():
            trial.cancelled = True
        elif task.exception() is not None:
            trial.error = task.exception()
        else:
            trial.value = task.result()
            trial.returned = True
        return
    with anyio.CancelScope() as scope:
        plan.scope = scope
        try:
            trial.value = await run()
            trial.returned = True
        except Exception as error:
            trial.error = error
    if not trial.returned and trial.error is None:
        trial.cancelled = True


async def _retry(
    name: str,
    trial: Trial[T],
    reference: Trial[T],
    after: Snapshot,
    expected_errors: tuple[type[BaseException], ...],
) -> None:
    """A clean retry after a run that left the store as before ends like the reference
    run, reaches ``after`` and emits the same events (handed to the hooks: a delivery the
    reference's ``always`` faults failed counts too)."""
    prepared = trial.prepared
    assert prepared.follow_up is not None
    await anyio.lowlevel.checkpoint()  # the retry starts on a fresh scheduling round
    trial.plan.disarm()
    hooks = prepared.hooks
    start = len(hooks.emitted) if hooks is not None else 0
    try:
        await prepared.follow_up()
        retried = True
    except expected_errors:
        retried = False
    if retried != reference.returned:
        raise SweepFailure(
            name, trial, "a clean retry ended unlike the reference run", code="retry-outcome"
        )
    state = snapshot(prepared.manager)
    if state != after:
        fields = state.differences(after, objects=False)
        raise SweepFailure(
            name,
            trial,
            f"a clean retry did not reach after: {fields}",
            code="retry-state",
            fields=fields,
        )
    if hooks is not None and reference.prepared.hooks is not None:
        emitted = hooks.emitted[start:]
        if freeze(emitted) != freeze(reference.emitted):
            raise SweepFailure(
                name,
                trial,
                "a clean retry emitted other events than the reference run: "
                f"{[event for event, _ in emitted]} != "
                f"{[event for event, _ in reference.emitted]}",
                code="retry-events",
            )


async def sweep(
    name: str,
    prepare: Prepare[T],
    *,
    kind: str,
    persistent: bool = False,
    boundary: Collection[str] = BOUNDARY_EVENTS,
    expected_errors: tuple[type[BaseException], ...] = (InjectedFault,),
    always: Mapping[str, str] | None = None,
    check: Callable[[Trial[T]], Awaitable[None]] | None = None,
    max_points: int = 10_000,
) -> SweepReport:
    """Inject a fault at every await point of an operation; check each outcome.

    ``prepare(plan)`` builds a fresh store whose seams go through ``plan`` and returns the
    operation. The reference run (a plan that never fires) gives the expected ``after``,
    the events it delivers and the number N of seam hits; then for k = 1, 2, ... the
    operation runs with a fault of ``kind`` at hit k (and every later hit when
    ``persistent``) until a run finishes without reaching k, which must be k = N + 1.
    Oracle per run (see the module docstring):

    - returned -> the store equals the no-fault ``after`` (values);
    - raised (an ``expected_errors`` error or a cancellation) with a ``boundary`` event's
      delivery interrupted -> the store equals ``after`` (the commit stands), except for
      the ``DELIVERY_MARKS`` of deliveries the run did not complete, which keep their
      value from before;
    - raised after an inner store operation of a composite run returned
      (``Prepared.reached``) -> the store equals the reference run's state at that stage;
    - any other raise -> the store equals ``before`` (values and the same objects); then
      ``follow_up`` (if any), run without faults, must end like the reference run, reach
      ``after`` and emit the same events (names and payloads).

    ``check(trial)`` runs after every trial for caller-specific assertions (views, leaked
    transactions). Raises ``SweepFailure`` at the first disagreement.
    """
    reference = await _reference(name, prepare, always)
    after = reference.state
    assert after is not None
    labels = list(reference.plan.labels)
    report = SweepReport(
        name, f"{kind} {'persistent' if persistent else 'transient'}", len(labels), labels
    )
    for k in itertools.count(1):
        if k > max_points + 1:
            raise AssertionError(f"{name}: more than {max_points} await points")
        plan = FaultPlan(k, kind, persistent, always=dict(always or {}))
        prepared = await prepare(plan)
        trial = Trial(k, plan, prepared, snapshot(prepared.manager))
        await _run_trial(trial)
        trial.state = snapshot(prepared.manager)
        if plan.labels[: k - 1] != labels[: k - 1]:
            raise SweepFailure(
                name, trial, f"seam order differs from the reference {labels}", code="seam-order"
            )
        if not any(hit == k for hit, _, _ in plan.fired):
            if k != len(labels) + 1:
                raise SweepFailure(
                    name,
                    trial,
                    f"reached no hit {k} but the reference had {labels}",
                    code="unreached",
                )
            if trial.returned != reference.returned or trial.state != after:
                raise SweepFailure(
                    name,
                    trial,
                    "the unfaulted run differs from the reference",
                    code="unfaulted-differs",
                    fields=trial.state.differences(after, objects=False),
                )
            if check is not None:
                await check(trial)
            break
        verdict = _judge(name, trial, reference, boundary, expected_errors)
        report.record(trial, verdict)
        if check is not None:
            await check(trial)
        if verdict == "before" and prepared.follow_up is not None:
            await _retry(name, trial, reference, after, expected_errors)
    return report


async def _reference(name: str, prepare: Prepare[T], always: Mapping[str, str] | None) -> Trial[T]:
    plan = FaultPlan(always=dict(always or {}))
    prepared = await prepare(plan)
    trial = Trial(0, plan, prepared, snapshot(prepared.manager))
    await _run_trial(trial)
    trial.state = snapshot(prepared.manager)
    if not trial.returned and trial.state != trial.before:
        raise SweepFailure(
            name,
            trial,
            "the no-fault run raised and changed the store",
            code="reference-changed",
            fields=trial.state.differences(trial.before),
        )
    return trial
