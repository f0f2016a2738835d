"""Fault injection at the negotiated path's seams, and a comparable store snapshot.

``FaultPlan`` is RELIABILITY.md section 4's prototype, grown a third kind: it counts the
hits of every seam (the orchestrator's ``count_view`` and ``fit_output``, the hooks' ``emit``
that delivers ``context:budget`` / ``context:compaction`` / the orchestrator's report,
and the system prompt factory) and, at hit ``fail_at`` (and every later hit when
``persistent``), raises ``InjectedFault``, cancels the enclosing anyio ``CancelScope``,
or cancels the current asyncio task natively. Every seam is a real checkpoint, so a
cancellation requested at hit k is delivered at hit k.

``Snapshot`` is what the sweeps compare: the canonical history, the committed sticky
decisions, the committed stats (by value here; tests compare identity separately) and
the store version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.lowlevel

from amplifier_module_context_simple import SimpleContextManager

ERROR: Final = "error"
CANCEL: Final = "cancel"
NATIVE: Final = "native"
KINDS: Final = (ERROR, CANCEL, NATIVE)

COMPACTION_DELIVERY: Final = "emit:context:compaction"
"""The label of the one seam that runs after the commit step (inside ``commit``)."""


class InjectedFault(Exception):
    """The error a ``FaultPlan`` raises at its chosen hit."""


@dataclass
class FaultPlan:
    """Counts seam hits; at hit ``fail_at`` raises or cancels (persistent: every later hit too).

    ``fail_at=0`` never fires: that is the reference (no-fault) run, which tells the sweep
    how many await points there are.
    """

    fail_at: int = 0
    kind: str = ERROR
    persistent: bool = False
    scope: anyio.CancelScope | None = None
    hits: int = 0
    fired: int = 0
    armed: bool = True
    labels: list[str] = field(default_factory=list)
    fired_label: str | None = None
    """The label of the first hit that fired."""
    last_fired: str | None = None
    """The label of the latest hit that fired (the one that raised, for a raised run)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")

    def disarm(self) -> None:
        """Stop counting and firing (for a follow-up run on the same store)."""
        self.armed = False

    async def hit(self, label: str) -> None:
        if self.armed:
            self.hits += 1
            self.labels.append(label)
            k = self.fail_at
            if k and (self.hits == k or (self.persistent and self.hits > k)):
                self.fired += 1
                if self.fired_label is None:
                    self.fired_label = label
                self.last_fired = label
                if self.kind == ERROR:
                    raise InjectedFault(f"{label}#{self.hits}")
                if self.kind == CANCEL:
                    assert self.scope is not None, "a cancel plan needs its CancelScope"
                    self.scope.cancel()
                else:
                    task = asyncio.current_task()
                    assert task is not None
                    task.cancel()
        await anyio.lowlevel.checkpoint()  # every seam is a real checkpoint

    # -- wrappers ---------------------------------------------------------------

    def wrap(self, label: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """``fn`` with a hit before each call."""

        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            await self.hit(label)
            return await fn(*args, **kwargs)

        return wrapped


class FaultyHooks:
    """A hook registry proxy whose ``emit`` is a seam (labelled ``emit:<event>``)."""

    def __init__(self, inner: Any, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan

    def register(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.register(*args, **kwargs)

    async def emit(self, event: str, data: dict[str, Any]) -> Any:
        await self.plan.hit(f"emit:{event}")
        return await self.inner.emit(event, data)


async def install(
    context: SimpleContextManager,
    plan: FaultPlan,
    factory: Callable[[], Awaitable[str]] | None = None,
) -> None:
    """Route the context's hooks (and ``factory``, as its system prompt) through ``plan``."""
    context.hooks = FaultyHooks(context.hooks, plan)
    if factory is not None:
        await context.set_system_prompt_factory(plan.wrap("factory", factory))


# -- the store snapshot -----------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Everything a negotiated request may change, as comparable values."""

    messages: list[dict[str, Any]]
    removed: frozenset[int]
    truncated: frozenset[int]
    stubbed: frozenset[int]
    level: int
    stats: dict[str, Any] | None
    version: tuple[int, int]


def snapshot(context: SimpleContextManager) -> Snapshot:
    stats = context.last_compaction_stats
    return Snapshot(
        messages=context.messages,
        removed=context._removed_seqs,
        truncated=context._truncated_seqs,
        stubbed=context._stubbed_seqs,
        level=context._sticky_level,
        stats=dict(stats) if stats is not None else None,
        version=context.version,
    )
