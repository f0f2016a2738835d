"""What the loop records for the demo: one row per provider request, and context events.

Rows are plain data, appended in request order; nothing here affects the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OBSERVED_EVENTS = ("context:compaction", "context:budget")


@dataclass
class RequestRow:
    """One provider request of one turn.

    ``history_tokens`` counts the whole canonical history; ``view_tokens`` is the provider's
    count of what was sent (None when nothing was sent). ``outcome`` is the measured
    outcome, or ``"level N"`` (the context's sticky strategy level) on the other paths.
    ``rejected_tokens`` is the provider's count of a request it refused (overflow).
    ``overflow`` is None, ``"recovered"`` (hard-fit retry succeeded), ``"unhandled"``
    (the turn failed on a ContextLengthError) or ``"context"`` (the context failed closed).
    """

    number: int
    turn: int
    iteration: int
    mode: str
    history_tokens: int = 0
    history_messages: int = 0
    view_tokens: int | None = None
    rejected_tokens: int | None = None
    view_messages: int = 0
    window: int = 0
    input_limit: int | None = None
    outcome: str = ""
    measured_after: int | None = None
    level: int | None = None
    count_calls: int = 0
    events: list[str] = field(default_factory=list)
    compactions: int = 0
    overflow: str | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly copy."""
        return dict(self.__dict__)


class EventLog:
    """Collects ``context:compaction`` / ``context:budget`` payload summaries.

    ``handler`` is registered on the hook registry; it returns None (an observer: any other
    return value could be parsed as a hook action). ``drain()`` hands over what arrived
    since the previous drain.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[str, str]] = []
        self.total: dict[str, int] = dict.fromkeys(OBSERVED_EVENTS, 0)

    async def handler(  # noqa: ASYNC910 - records in memory: nothing to wait for
        self,
        event: str,
        data: dict[str, Any] | None,
    ) -> None:
        """Hook handler: remember a one-line summary of the event."""
        self.total[event] = self.total.get(event, 0) + 1
        self._pending.append((event, summarize(event, data or {})))

    def drain(self) -> list[tuple[str, str]]:
        """Events seen since the last drain, oldest first."""
        pending, self._pending = self._pending, []
        return pending


def summarize(event: str, data: dict[str, Any]) -> str:
    """A short label for an event payload."""
    if event == "context:compaction":
        level = data.get("strategy_level")
        outcome = data.get("outcome")
        label = f"compaction L{level}" if level is not None else "compaction"
        return f"{label} {outcome}" if outcome else label
    if event == "context:budget":
        return f"budget {data.get('effective_budget', '?')}"
    return event
