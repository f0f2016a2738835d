"""What one committed compaction did: a frozen record, and its ``context:compaction`` event.

The store and the storm guard read the record's fields; orchestrators see the event
payload (``to_event()``, the dict ``last_compaction_stats`` and the transaction's
``stats`` return, read-only by contract; the delivered event is a copy of it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ("CompactionStats",)


@dataclass(frozen=True, slots=True)
class CompactionStats:
    """The figures of one compaction decision (counts are cumulative over the decisions)."""

    before_tokens: int
    after_tokens: int
    before_messages: int
    after_messages: int
    messages_removed: int
    messages_truncated: int
    user_messages_stubbed: int
    system_messages_preserved: int
    strategy_level: int
    budget: int
    target_tokens: int
    protected_recent: float
    protected_tool_results: int
    floor_tokens: int | None
    """The view's estimate when it is over the target (the protected floor), else None."""
    changes: int
    results_synthesized: int
    protected_results_truncated: int
    prefix_kept_tokens: int = 0
    """Tokens of the leading messages of the view before this compaction that the view
    after it shows byte for byte (a provider's prompt cache can keep them)."""
    first_changed_message: int | None = None
    """Index of the first message the compaction changed (None when it changed none)."""
    thinking_blocks_omitted: int = 0
    """Thinking blocks the view leaves out of the messages it shows (cumulative)."""
    thinking_messages_omitted: int = 0
    """Assistant messages the view shows without their thinking (or, thinking alone, not
    at all)."""
    thinking_omitted_reason: str | None = None
    """``"prefix_changed"`` when thinking is left out: a compaction changed the view before
    it, and the model checks the prefix of thinking sent back (docs/thinking.md)."""
    preserved_thinking: bool = True
    """Whether the request's model was read as checking the prefix of thinking."""
    thinking_rule_source: str = "default"
    """Where that was read: ``config``, ``provider_capabilities``, ``model_id``, ``default``."""
    omitted_tool_calls: tuple[str, ...] = ()
    """``name(key=value)`` of each tool call the view no longer shows whole (removed, or
    its result shortened), oldest first (``facts.py``)."""
    measurement: Mapping[str, Any] = field(default_factory=dict)
    """Negotiated requests: ``measurement_kind``, ``measurement_source``,
    ``measured_before``, ``measured_after``, ``trigger``, ``policy_budget``, ``outcome``,
    ``count_calls``."""
    _event: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        event = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("measurement", "_event")
        }
        event["omitted_tool_calls"] = list(self.omitted_tool_calls)
        event.update(self.measurement)
        object.__setattr__(self, "_event", event)

    def to_event(self) -> dict[str, Any]:
        """The ``context:compaction`` payload (the same dict every time: read-only)."""
        return self._event

    def measured(self, before_tokens: int, **measurement: Any) -> CompactionStats:
        """These stats as a negotiated request reports them."""
        return dataclasses.replace(self, before_tokens=before_tokens, measurement=measurement)

    def with_prefix(self, kept_tokens: int, first_change: int | None) -> CompactionStats:
        """These stats with what the compaction kept of the previous view's prefix."""
        return dataclasses.replace(
            self, prefix_kept_tokens=kept_tokens, first_changed_message=first_change
        )
