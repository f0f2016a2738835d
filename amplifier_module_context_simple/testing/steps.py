"""The trio step sweep (docs/design.md section 10): cancel before every scheduler step.

``step_sweep`` applies ``sweep``'s oracle over every scheduler step of an operation: a
trio ``Instrument`` (``StepCanceller``) cancels the operation's task before its k-th
step, which also reaches awaits that are *not* seams (anyio on the trio backend only).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import anyio

from .faults import FaultPlan
from .hooks import BOUNDARY_EVENTS
from .state import snapshot
from .sweeps import Prepare, SweepFailure, SweepReport, Trial, _judge, _reference

if TYPE_CHECKING:
    import trio

__all__ = (
    "StepCanceller",
    "StepRun",
    "run_cancelling_after_step",
    "step_sweep",
)

T = TypeVar("T")


class StepCanceller:
    """A trio ``Instrument``: cancels ``scope`` before the ``k``-th step of the watched task.

    The watched task is any task whose parent nursery is ``nursery`` (set by
    ``run_cancelling_after_step``). The cancellation is delivered at the task's next
    checkpoint in that step, so k = 1, 2, ... reaches every checkpoint of the task -
    seams, anyio-internal checkpoints and any await someone added outside the seams.
    """

    def __init__(self, k: int, scope: anyio.CancelScope) -> None:
        self.k = k
        self.scope = scope
        self.steps = 0
        self.nursery: object = None

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.nursery is not None and task.parent_nursery is self.nursery:
            self.steps += 1
            if self.steps == self.k:
                self.scope.cancel()


@dataclass
class StepRun(Generic[T]):
    """The outcome of ``run_cancelling_after_step``."""

    steps: int = 0
    returned: bool = False
    value: T | None = None
    error: Exception | None = None
    cancelled: bool = False


async def run_cancelling_after_step(k: int, run: Callable[[], Awaitable[T]]) -> StepRun[T]:
    """Run ``run()`` in its own trio task, cancelling it before its ``k``-th scheduler step.

    anyio on the trio backend only. ``steps`` is how many steps the task took; when
    ``steps < k`` the run finished before the cancellation was requested.
    """
    import trio

    scope = anyio.CancelScope()
    canceller = StepCanceller(k, scope)
    outcome: StepRun[T] = StepRun()

    async def worker() -> None:  # noqa: ASYNC910 - no extra step after the operation
        with scope:
            try:
                outcome.value = await run()
                outcome.returned = True
            except Exception as error:
                outcome.error = error
        outcome.cancelled = scope.cancelled_caught

    trio.lowlevel.add_instrument(cast("trio.abc.Instrument", canceller))
    try:
        async with trio.open_nursery() as nursery:
            canceller.nursery = nursery
            nursery.start_soon(worker)
    finally:
        trio.lowlevel.remove_instrument(cast("trio.abc.Instrument", canceller))
    outcome.steps = canceller.steps
    return outcome


async def step_sweep(
    name: str,
    prepare: Prepare[T],
    *,
    boundary: Collection[str] = BOUNDARY_EVENTS,
    expected_errors: tuple[type[BaseException], ...] = (),
    check: Callable[[Trial[T]], Awaitable[None]] | None = None,
    max_steps: int = 10_000,
) -> SweepReport:
    """``sweep``'s oracle over every scheduler step of the operation (trio backend).

    The plan handed to ``prepare`` never fires (its seams only checkpoint); a trio
    ``Instrument`` cancels the operation's task before its k-th step instead, for
    k = 1, 2, ... until a run takes fewer than k steps.
    """
    reference = await _reference(name, prepare, None)
    after = reference.state
    assert after is not None
    report = SweepReport(name, "trio steps", 0, list(reference.plan.labels))
    for k in itertools.count(1):
        if k > max_steps + 1:
            raise AssertionError(f"{name}: more than {max_steps} steps")
        plan = FaultPlan()
        prepared = await prepare(plan)
        trial = Trial(k, plan, prepared, snapshot(prepared.manager))
        outcome = await run_cancelling_after_step(k, prepared.run)
        trial.returned, trial.value = outcome.returned, outcome.value
        trial.error, trial.cancelled = outcome.error, outcome.cancelled
        trial.state = snapshot(prepared.manager)
        if outcome.steps < k:
            if trial.returned != reference.returned or trial.state != after:
                raise SweepFailure(
                    name,
                    trial,
                    "the uncancelled run differs from the reference",
                    code="unfaulted-differs",
                    fields=trial.state.differences(after, objects=False),
                )
            report.points = k - 1
            break
        verdict = _judge(name, trial, reference, boundary, expected_errors)
        report.record(trial, verdict)
        if check is not None:
            await check(trial)
    return report
