"""Sticky compaction decisions: what every later view reapplies, keyed by sequence id.

A ``Decisions`` value is immutable. The store holds the committed one; a compaction run
or a negotiation builds a new one and the store swaps it in at a commit boundary, so a
reader never sees half of a decision. Decisions only grow: a later escalation adds
removals, truncations and stubs (a removal supersedes an earlier reduced form of the same
message) and never reverses one. ``set_messages`` and ``clear`` reset them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .ladder import Form, Ladder
from .stats import CompactionStats

__all__ = (
    "REMOVED",
    "Decisions",
)


REMOVED = None
"""Override value for a removed message."""


@dataclass(frozen=True, slots=True)
class Decisions:
    """The committed (or staged) sticky compaction state."""

    removed: frozenset[int] = frozenset()
    truncated: frozenset[int] = frozenset()
    stubbed: frozenset[int] = frozenset()
    level: int = 0
    stats: CompactionStats | None = None
    floor_reported: bool = False
    """These decisions reported a protected floor above the target (the storm guard reads
    this, never the event payload)."""
    overrides: Mapping[int, Form | None] = field(default_factory=dict)
    """seq -> reduced form, or ``None`` when removed: what the renderer substitutes."""

    @property
    def is_empty(self) -> bool:
        return not self.overrides

    def merged(self, ladder: Ladder) -> Decisions:
        """These decisions plus what ``ladder`` decided (stats and floor unchanged)."""
        removed = self.removed | ladder.removed
        truncated = (self.truncated | ladder.truncated) - removed
        stubbed = (self.stubbed | ladder.stubbed) - removed
        overrides: dict[int, Form | None] = {
            seq: form for seq, form in self.overrides.items() if seq not in ladder.removed
        }
        for item in ladder.items:
            if item.seq in ladder.truncated or item.seq in ladder.stubbed:
                overrides[item.seq] = (item.message, item.tokens)
        for seq in ladder.removed:
            overrides[seq] = REMOVED
        return Decisions(
            removed=frozenset(removed),
            truncated=frozenset(truncated),
            stubbed=frozenset(stubbed),
            level=max(self.level, ladder.level),
            stats=self.stats,
            floor_reported=self.floor_reported,
            overrides=overrides,
        )
