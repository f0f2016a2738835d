"""Planning in slices: CPU work that grows with the history, paced for the event loop.

A host that serves many sessions runs them on one event loop. The work of a request that
grows with the history (rendering a view, building and climbing the ladder, the stats of a
compaction) is plain synchronous code, written as a *generator of steps*: it ``yield``s
(nothing) at points where it may pause, every ``STRIDE`` items of a loop and between
phases, and ``return``s its result. A long loop is written with one of two helpers, which
own its pause points: ``walking`` (an action per item, a pause every ``stride`` items,
stopped and resumed at an item) and ``chunking`` (an action per chunk of a list, a pause
after each). Nothing in a step awaits, and a step never changes the
store: it reads the request's snapshot and builds private state (caches excepted, which
are keyed so a stale plan cannot poison them). So the same code runs

- to completion, without pausing (``run_through``: synchronous callers and tests), or
- paced (``Pacer.run``): after each step the pacer looks at the clock, and once the
  slice's time budget has elapsed it yields to the loop (``yield_to_the_loop``: two
  anyio checkpoints) and starts a new slice. Work shorter than one slice never yields,
  so a small history yields exactly as often as it did before. The clock is this
  thread's CPU time (``time.thread_time``): time the operating system gives other
  processes does not count, so how often a request yields does not depend on what else
  the machine runs.

One paced plan at a time per event loop: a plan that needs a second slice first takes
the loop's *planning lock* (``anyio.Lock``, one per event loop run), in the order the plans
asked for it, and keeps it until it is done. Ten sessions compacting at once then run one
after another, each yielding between its slices, instead of all at once: the loop is held
no longer than with one session, and only one plan's working state (its ladder, its
candidate views) is alive at a time, so the memory it takes, and the part of the
collector's full passes it causes, do not grow with the number of sessions. Work that fits
in one slice never touches the lock; while the lock is taken, a new plan's first slice is
short (``QUEUED_SLICE_SECONDS``) before it queues.

A paced plan may go stale while it is paused (``set_messages``, ``clear``, an admission,
another commit); the caller decides what happens then (see the store's and the
negotiator's docstrings). A checkpoint is a cancellation point: a cancelled plan is simply
dropped (and the lock released), since nothing it built was the store's yet.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from typing import Final, TypeVar

import anyio
import anyio.lowlevel

__all__ = (
    "CHUNK",
    "HEAVY_STRIDE",
    "LIGHT_CHUNK",
    "QUEUED_SLICE_SECONDS",
    "SLICE_SECONDS",
    "STRIDE",
    "Pacer",
    "Steps",
    "chunking",
    "planning_lock",
    "run_through",
    "walking",
    "yield_to_the_loop",
)

T = TypeVar("T")

Steps = Generator[None, None, T]
"""Planning work that yields where it may pause and returns its result."""

SLICE_SECONDS: Final = 0.0015
"""Work between two yields of a paced plan (CPU seconds). One slice plus at most one step
(about a millisecond at most) stays far under the 10 ms a request may hold the loop."""

QUEUED_SLICE_SECONDS: Final = 0.0005
"""A plan's first slice while another plan holds the planning lock."""

STRIDE: Final = 64
"""Items a loop handles between two pause points (a step stays far below a slice)."""

HEAVY_STRIDE: Final = 16
"""Items between two pause points in a loop that may compute a reduced form, or a call's
facts, for each (tens of microseconds apiece)."""

CHUNK: Final = 8 * STRIDE
"""Items a cheap whole-list pass (a filter, an index, a merge) handles between two pause
points."""

LIGHT_CHUNK: Final = 16 * STRIDE
"""Items copied, or merely looked at, between two pause points."""

_LOCK: anyio.lowlevel.RunVar[anyio.Lock] = anyio.lowlevel.RunVar("context_simple_planning")


async def yield_to_the_loop() -> None:
    """Two checkpoints, so that the loop runs whatever became ready while the plan worked
    (a due timer, a woken task) before the plan's next slice: an asyncio loop runs every
    callback that was ready when an iteration began before it looks at its timers again,
    so after a single checkpoint a timer that fell due during a slice would wait for the
    next slice too."""
    await anyio.lowlevel.checkpoint()
    await anyio.lowlevel.checkpoint()


def planning_lock() -> anyio.Lock:
    """The current event loop's planning lock (see the module docstring)."""
    try:
        return _LOCK.get()
    except LookupError:
        lock = anyio.Lock()
        _LOCK.set(lock)
        return lock


def run_through(steps: Steps[T]) -> T:
    """Run ``steps`` to completion without pausing; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def walking(
    items: Iterable[T],
    act: Callable[[T], object],
    *,
    stride: int = STRIDE,
    start: int = 0,
) -> Steps[int | None]:
    """``act`` on each item of ``items``, in order, from index ``start`` on (``items`` must
    then be a sequence), pausing before every ``stride``-th item, as steps.

    The walk stops at the first item ``act`` returns a true value for, and that item counts
    as not done: the result is its index, where a later walk resumes (``start``), or None
    when the walk went through. The pause points are counted from the beginning of
    ``items``, not from ``start`` (before each item whose index is ``stride - 1`` modulo
    ``stride``): a walk resumed where it stopped pauses where the whole walk would have.
    """
    if start:
        if not isinstance(items, Sequence):
            raise TypeError("a walk resumed at an index needs a sequence")
        items = map(items.__getitem__, range(start, len(items)))
    last = stride - 1
    for index, item in enumerate(items, start):
        if index % stride == last:
            yield
        if act(item):
            return index
    return None


def chunking(
    items: Sequence[T],
    act: Callable[[Sequence[T], int], object],
    *,
    size: int = CHUNK,
    start: int = 0,
    between: bool = False,
) -> Steps[None]:
    """``act(chunk, offset)`` on ``items[start:]`` in chunks of ``size`` items (``offset``:
    the index of the chunk's first item), pausing after each chunk (``between``: only
    between two chunks), as steps."""
    for offset in range(start, len(items), size):
        if between and offset > start:
            yield
        act(items[offset : offset + size], offset)
        if not between:
            yield


class Pacer:
    """Runs planning steps, checkpointing once a slice's time budget has elapsed.

    Args:
        budget: CPU seconds of work per slice; 0 checkpoints at every pause point (the
            sweeps use that to reach every await point deterministically).
        checkpoint: the await between slices (``yield_to_the_loop``; tests route it
            through a fault plan).
    """

    __slots__ = ("budget", "checkpoint")

    def __init__(
        self,
        budget: float = SLICE_SECONDS,
        checkpoint: Callable[[], Awaitable[None]] = yield_to_the_loop,
    ) -> None:
        if budget < 0:
            raise ValueError(f"a slice budget must be >= 0 seconds, got {budget!r}")
        self.budget = budget
        self.checkpoint = checkpoint

    async def run(self, steps: Steps[T]) -> T:
        """Run ``steps`` to completion, checkpointing between slices; its result.

        At its first checkpoint the plan takes the planning lock (waiting its turn while
        another plan holds it) and keeps it to the end. An exception from a step, or a
        cancellation at a checkpoint, propagates; the steps are closed and the lock
        released either way.
        """
        clock = time.thread_time
        budget = self.budget
        lock: anyio.Lock | None = None
        first = budget
        if planning_lock().locked():
            first = min(budget, QUEUED_SLICE_SECONDS)
        deadline = clock() + first
        try:
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]  # noqa: ASYNC910
                if clock() >= deadline:
                    if lock is None:
                        # taken before the checkpoint, so that a plan starting meanwhile
                        # sees it taken and queues after a short first slice
                        waiting = planning_lock()
                        try:
                            waiting.acquire_nowait()
                        except anyio.WouldBlock:
                            await self.checkpoint()
                            await waiting.acquire()
                            lock = waiting
                        else:
                            lock = waiting  # (before the await: released if cancelled there)
                            await self.checkpoint()
                    else:
                        await self.checkpoint()
                    deadline = clock() + budget
        finally:
            steps.close()
            if lock is not None:
                lock.release()
