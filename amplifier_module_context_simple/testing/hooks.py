"""A recording hook registry, and the events the module emits.

``RecordingHooks`` stands in for a hook registry (``coordinator.hooks``): it records every
registration and every delivery, and optionally forwards both to a real registry. Its
``emit`` is a real checkpoint, as a real registry's is, so a delivery is an await point
of the operation that emits. ``faults.FaultyHooks`` is the same registry whose ``emit`` is
a fault seam.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio.lowlevel

__all__ = (
    "BOUNDARY_EVENTS",
    "BUDGET_EVENT",
    "COMPACTION_EVENT",
    "INGRESS_EVENT",
    "RecordingHooks",
    "Registration",
)

COMPACTION_EVENT: Final = "context:compaction"
BUDGET_EVENT: Final = "context:budget"
INGRESS_EVENT: Final = "context:tool_result_ingress_truncated"
BOUNDARY_EVENTS: Final = frozenset({COMPACTION_EVENT, BUDGET_EVENT})
"""Events an ordinary or hard-fit request delivers after its commit: a fault interrupting
them keeps the commit. For ``RequestTransaction.commit`` use ``{COMPACTION_EVENT}``; the
negotiated view commits nothing and delivers ``context:budget`` before its return boundary,
so use an empty set (a fault anywhere leaves the store as before)."""

Handler = Callable[..., Any]
OnEmit = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Registration:
    """One ``register(event, handler, priority, name)`` call."""

    event: str
    handler: Handler
    priority: int
    name: str | None


class RecordingHooks:
    """A hook registry that records registrations and deliveries.

    - ``register(event, handler, priority=0, name=None)`` records a ``Registration`` and
      returns an unregister callable; each call of one counts in ``unregistered``. With
      ``inner`` (a real registry) the registration is forwarded too.
    - ``emit(event, data)`` records that the delivery *started* (``started``, and
      ``emitted`` with its payload, synchronously, before any await), checkpoints
      (``_seam``), forwards to ``inner`` when given, records the *completed* delivery in
      ``events`` and finally calls ``on_emit(event, data)``; a delivery that raises an
      ``Exception`` is recorded in ``failed`` (and re-raised).
      ``interrupted`` lists the deliveries that started and did not complete (a fault or a
      cancellation landed inside them). It returns what ``inner.emit`` returned (None
      without ``inner``).
    """

    def __init__(self, on_emit: OnEmit | None = None, *, inner: Any = None) -> None:
        self.on_emit = on_emit
        self.inner = inner
        self.started: list[str] = []
        self.emitted: list[tuple[str, dict[str, Any]]] = []
        """``(event, data)`` of every ``emit`` call, completed or not, in order."""
        self.events: list[tuple[str, dict[str, Any]]] = []
        """``(event, data)`` of every completed delivery, in order."""
        self.failed: list[str] = []
        """Deliveries that raised an ``Exception`` (a cancellation is not a failure)."""
        self.registrations: list[Registration] = []
        self.unregistered = 0

    def register(
        self, event: str, handler: Handler, priority: int = 0, name: str | None = None
    ) -> Callable[[], None]:
        self.registrations.append(Registration(event, handler, priority, name))
        register = getattr(self.inner, "register", None)
        inner_unregister = register(event, handler, priority, name) if callable(register) else None

        def unregister() -> None:
            self.unregistered += 1
            if callable(inner_unregister):
                inner_unregister()

        return unregister

    async def _seam(self, event: str) -> None:
        """The await point of a delivery (a fault seam in ``FaultyHooks``)."""
        await anyio.lowlevel.checkpoint()

    async def emit(self, event: str, data: dict[str, Any]) -> Any:
        self.started.append(event)
        self.emitted.append((event, data))
        try:
            await self._seam(event)
            result: Any = None
            emit = getattr(self.inner, "emit", None)
            if callable(emit):
                result = await emit(event, data)
        except Exception:
            self.failed.append(event)
            raise
        self.events.append((event, data))
        if self.on_emit is not None:
            self.on_emit(event, data)
        return result

    @property
    def completed(self) -> list[tuple[str, dict[str, Any]]]:
        """The completed deliveries (``events``)."""
        return self.events

    @property
    def interrupted(self) -> list[str]:
        """Events whose delivery started but did not complete (in start order)."""
        done = Counter(event for event, _ in self.events)
        left: list[str] = []
        for event in self.started:
            if done[event]:
                done[event] -= 1
            else:
                left.append(event)
        return left

    def named(self, event: str) -> list[dict[str, Any]]:
        """Payloads of the completed deliveries of ``event``."""
        return [data for name, data in self.events if name == event]
