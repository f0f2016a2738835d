"""Fault injection at the module's seams.

The module awaits only through its *seams*: the system prompt factory, the orchestrator's
``count_view`` and ``fit_output``, and ``hooks.emit``. ``FaultPlan`` counts seam hits and,
at hit ``k`` (and every later hit when ``persistent``), raises ``InjectedFault``, cancels
the enclosing anyio ``CancelScope``, or cancels the current asyncio task natively
(``asyncio.Task.cancel()``, which pierces anyio shields - what an asyncio host really
does). ``faulty_count_view``, ``faulty_fit_output``, ``faulty_factory`` and
``FaultyHooks`` route a seam through a plan; every seam is a real checkpoint, so a
cancellation requested at hit k is delivered at hit k.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.lowlevel

from .hooks import OnEmit, RecordingHooks

__all__ = (
    "CANCEL",
    "ERROR",
    "FAULT_KINDS",
    "NATIVE",
    "CountView",
    "Factory",
    "FaultPlan",
    "FaultyHooks",
    "FitOutput",
    "InjectedFault",
    "faulty_count_view",
    "faulty_factory",
    "faulty_fit_output",
)

ERROR: Final = "error"
"""Raise ``InjectedFault`` at the hit."""
CANCEL: Final = "cancel"
"""Cancel the plan's anyio ``CancelScope`` at the hit (delivered at the seam's checkpoint)."""
NATIVE: Final = "native"
"""``asyncio.current_task().cancel()`` at the hit (asyncio only; pierces anyio shields)."""
FAULT_KINDS: Final = (ERROR, CANCEL, NATIVE)

CountView = Callable[[list[dict[str, Any]]], Awaitable[Any]]
FitOutput = Callable[[list[dict[str, Any]], Any], Awaitable[Any]]
Factory = Callable[[], Awaitable[str]]


class InjectedFault(Exception):
    """The error a ``FaultPlan`` raises at its chosen hit."""

    def __init__(self, label: str, hit: int) -> None:
        super().__init__(f"injected fault at {label}#{hit}")
        self.label = label
        self.hit = hit


@dataclass
class FaultPlan:
    """Counts seam hits; at hit ``fail_at`` raises or cancels (persistent: every later hit too).

    ``fail_at=0`` never fires: that is the reference run. ``always`` maps seam labels to a
    kind that fires at *every* hit with that label (compound faults: e.g. every hook
    delivery fails while a count is cancelled). A disarmed plan neither counts nor fires
    (use it while preparing a store), but its seams still checkpoint.
    """

    fail_at: int = 0
    kind: str = ERROR
    persistent: bool = False
    scope: anyio.CancelScope | None = None
    always: Mapping[str, str] = field(default_factory=dict)
    armed: bool = True
    hits: int = 0
    labels: list[str] = field(default_factory=list)
    fired: list[tuple[int, str, str]] = field(default_factory=list)
    """``(hit, label, kind)`` of every hit that fired."""

    def __post_init__(self) -> None:
        unknown = {self.kind, *self.always.values()} - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; use {FAULT_KINDS}")
        if self.fail_at < 0:
            raise ValueError(f"fail_at must be >= 0, got {self.fail_at}")

    @property
    def fired_label(self) -> str | None:
        """The label of the first hit that fired."""
        return self.fired[0][1] if self.fired else None

    @property
    def last_fired_label(self) -> str | None:
        """The label of the latest hit that fired (the one that raised, for a raised run)."""
        return self.fired[-1][1] if self.fired else None

    def arm(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def _due(self, label: str) -> str | None:
        if not self.armed:
            return None
        self.hits += 1
        self.labels.append(label)
        k = self.fail_at
        if k and (self.hits == k or (self.persistent and self.hits > k)):
            return self.kind
        return self.always.get(label)

    def hit_nowait(self, label: str) -> None:
        """A synchronous seam (e.g. an ``is_cancelled`` predicate): fire without a checkpoint.

        A cancellation requested here is delivered at the caller's next checkpoint.
        """
        kind = self._due(label)
        if kind is None:
            return
        self.fired.append((self.hits, label, kind))
        if kind == ERROR:
            raise InjectedFault(label, self.hits)
        if kind == CANCEL:
            if self.scope is None:
                raise RuntimeError("a cancelling FaultPlan needs its CancelScope (plan.scope)")
            self.scope.cancel()
            return
        import asyncio

        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        if task is None:
            raise RuntimeError("native cancellation needs a running asyncio task")
        task.cancel()

    async def hit(self, label: str) -> None:
        """An async seam: count the hit, fire if due, then checkpoint."""
        self.hit_nowait(label)
        await anyio.lowlevel.checkpoint()


def faulty_count_view(plan: FaultPlan, inner: CountView, *, label: str = "count_view") -> CountView:
    """``inner`` (an orchestrator's ``count_view``) with a seam hit before each call."""

    async def count_view(view: list[dict[str, Any]]) -> Any:
        await plan.hit(label)
        return await inner(view)

    return count_view


def faulty_fit_output(plan: FaultPlan, inner: FitOutput, *, label: str = "fit_output") -> FitOutput:
    """``inner`` (an orchestrator's ``fit_output``) with a seam hit before each call."""

    async def fit_output(view: list[dict[str, Any]], attempt: Any) -> Any:
        await plan.hit(label)
        return await inner(view, attempt)

    return fit_output


def faulty_factory(plan: FaultPlan, prompt: str | Factory, *, label: str = "factory") -> Factory:
    """A system prompt factory (returning ``prompt``, or awaiting it) with a seam hit."""

    async def factory() -> str:
        await plan.hit(label)
        if isinstance(prompt, str):
            return prompt
        return await prompt()

    return factory


class FaultyHooks(RecordingHooks):
    """A ``RecordingHooks`` whose ``emit`` is a seam labelled ``emit:<event>``.

    Without a plan every delivery only checkpoints. ``inner`` (optional) is a real registry
    to forward registrations and deliveries to.
    """

    def __init__(
        self, plan: FaultPlan | None = None, inner: Any = None, *, on_emit: OnEmit | None = None
    ) -> None:
        super().__init__(on_emit, inner=inner)
        self.plan = plan

    async def _seam(self, event: str) -> None:
        if self.plan is not None:
            await self.plan.hit(f"emit:{event}")
        else:
            await anyio.lowlevel.checkpoint()
