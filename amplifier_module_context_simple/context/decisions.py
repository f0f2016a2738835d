"""Sticky compaction decisions: what every later view reapplies, keyed by sequence id.

A ``Decisions`` value is never changed once built: the dataclass is frozen and its sets
are frozensets; ``overrides`` is a plain dict (``merging`` builds a new one, and a
read-only copy would cost a pass per message), which nothing writes to afterwards, by
contract. The store holds the committed one; a compaction run or a negotiation builds a
new one and the store swaps it in at a commit boundary, so a reader never sees half of a
decision. Decisions only grow: a later escalation adds
removals, truncations and stubs (a removal supersedes an earlier reduced form of the same
message) and never reverses one. ``set_messages`` and ``clear`` reset them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .ladder import Form, Ladder
from .slices import STRIDE, Steps, run_through
from .stats import CompactionStats

__all__ = (
    "REMOVED",
    "Decisions",
)


REMOVED = None
"""Override value for a removed message."""

_CHUNK = 8 * STRIDE
"""Entries merged between two pause points."""


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
        return run_through(self.merging(ladder))

    def merging(self, ladder: Ladder) -> Steps[Decisions]:
        """``merged`` as steps (``slices.py``)."""
        removed = self.removed | ladder.removed
        truncated = (self.truncated | ladder.truncated) - removed
        stubbed = (self.stubbed | ladder.stubbed) - removed
        yield
        overrides: dict[int, Form | None] = {}
        for index, (seq, form) in enumerate(self.overrides.items()):
            if index % _CHUNK == _CHUNK - 1:
                yield
            if seq not in ladder.removed:
                overrides[seq] = form
        for index, (seq, form) in enumerate(ladder.reduced_forms()):
            if index % _CHUNK == _CHUNK - 1:
                yield
            overrides[seq] = form
        for index, seq in enumerate(ladder.removed):
            if index % _CHUNK == _CHUNK - 1:
                yield
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
