"""Planning in slices: CPU work that grows with the history, paced for the event loop.

A host that serves many sessions runs them on one event loop. The work of a request that
grows with the history (rendering a view, building and climbing the ladder, the stats of a
compaction) is plain synchronous code, written as a *generator of steps*: it ``yield``s
(nothing) at points where it may pause, every ``STRIDE`` items of a loop and between
phases, and ``return``s its result. Nothing in a step awaits, and a step never changes the
store: it reads the request's snapshot and builds private state (caches excepted, which
are keyed so a stale plan cannot poison them). So the same code runs

- to completion, without pausing (``run_through``: synchronous callers and tests), or
- paced (``Pacer.run``): after each step the pacer looks at the clock, and once the
  slice's time budget has elapsed it checkpoints (``anyio.lowlevel.checkpoint``) and
  starts a new slice. Work shorter than one slice never checkpoints, so a small history
  yields exactly as often as it did before.

A paced plan may go stale while it is paused (``set_messages``, ``clear``, an admission,
another commit); the caller decides what happens then (see the store's and the
negotiator's docstrings). A checkpoint is a cancellation point: a cancelled plan is simply
dropped, since nothing it built was the store's yet.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from typing import Final, TypeVar

import anyio.lowlevel

__all__ = ("SLICE_SECONDS", "STRIDE", "Pacer", "Steps", "run_through")

T = TypeVar("T")

Steps = Generator[None, None, T]
"""Planning work that yields where it may pause and returns its result."""

SLICE_SECONDS: Final = 0.004
"""Work between two checkpoints of a paced plan (seconds): one slice plus at most one step
stays well under the 10 ms a request may hold the loop."""

STRIDE: Final = 64
"""Items a loop handles between two pause points (a step stays far below a slice)."""


def run_through(steps: Steps[T]) -> T:
    """Run ``steps`` to completion without pausing; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


class Pacer:
    """Runs planning steps, checkpointing once a slice's time budget has elapsed.

    Args:
        budget: seconds of work per slice; 0 checkpoints at every pause point (the sweeps
            use that to reach every await point deterministically).
        checkpoint: the await between slices (``anyio.lowlevel.checkpoint``; tests route
            it through a fault plan).
    """

    __slots__ = ("budget", "checkpoint")

    def __init__(
        self,
        budget: float = SLICE_SECONDS,
        checkpoint: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint,
    ) -> None:
        if budget < 0:
            raise ValueError(f"a slice budget must be >= 0 seconds, got {budget!r}")
        self.budget = budget
        self.checkpoint = checkpoint

    async def run(self, steps: Steps[T]) -> T:
        """Run ``steps`` to completion, checkpointing between slices; its result.

        An exception from a step, or a cancellation at a checkpoint, propagates; the
        steps are closed either way.
        """
        clock = time.perf_counter
        budget = self.budget
        deadline = clock() + budget
        try:
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]  # noqa: ASYNC910
                if clock() >= deadline:
                    await self.checkpoint()
                    deadline = clock() + budget
        finally:
            steps.close()
