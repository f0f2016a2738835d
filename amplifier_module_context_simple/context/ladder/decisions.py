"""Sticky compaction decisions: what every later view reapplies, keyed by sequence id.

A ``Decisions`` value is never changed once built: the dataclass is frozen and its sets
are frozensets; ``overrides`` (the reduced messages; their estimates are in
``override_tokens``, and a removed message is only in ``removed``: a long session's
thousands of removals cost one frozenset, not a dict entry each for the collector to walk,
and a reduced message no pair) is a plain dict (``merging`` builds a new one, and a
read-only copy would cost a pass per message), which nothing writes to afterwards, by
contract. The store holds the committed one; a compaction run or a negotiation builds a
new one and the store swaps it in at a commit boundary, so a reader never sees half of a
decision. Decisions only grow: a later escalation adds
removals, truncations and stubs (a removal supersedes an earlier reduced form of the same
message) and never reverses one. ``set_messages`` and ``clear`` reset them.

Two parts keep a view append-only between compactions (docs/thinking.md): the compaction
notice is made once, when its decision is staged, and shown at one place (``notice``,
``notice_at``) until the next decision; and the thinking a decision's first change
invalidated is left out of every later view built on it (``thoughtless``: the assistant
messages shown without their thinking blocks; their forms are in ``overrides``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..slices import CHUNK, HEAVY_STRIDE, Steps, walking
from ..stats import CompactionStats
from .ladder import Ladder
from .rows import Form

__all__ = ("Decisions",)


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
    overrides: Mapping[int, dict[str, Any]] = field(default_factory=dict)
    """seq -> reduced message (of a message in ``truncated`` or ``stubbed``): what the
    renderer substitutes. A removed message has none: it is in ``removed``."""
    override_tokens: Mapping[int, int] = field(default_factory=dict)
    """seq -> the estimate of its reduced message (a dict of ints: never tracked)."""
    thoughtless: Mapping[int, int] = field(default_factory=dict)
    """seq -> thinking blocks left out, of each message every view shows without its
    thinking (its form is in ``overrides``; a message of thinking alone is in ``removed``):
    a dict of ints, like ``override_tokens``."""
    notice: Form | None = None
    """The compaction notice of these decisions and its estimate, made when they were
    staged; None when they show none."""
    notice_at: int = 0
    """The history length when the notice was made: it is shown right after the view's
    last message with a smaller seq (and any results that message still waits for)."""

    @property
    def is_empty(self) -> bool:
        return not self.overrides and not self.removed

    def hides(self, seq: int) -> bool:
        """Whether these decisions remove or reduce the message ``seq``."""
        return seq in self.overrides or seq in self.removed

    def shown(self) -> dict[int, Form | None]:
        """Every decision by seq: the reduced form, or None for a removed message (the
        shape ``ContextStore.observable_state`` reports)."""
        tokens = self.override_tokens
        reduced = {seq: (message, tokens[seq]) for seq, message in self.overrides.items()}
        return {**dict.fromkeys(self.removed), **reduced}

    def merging(self, ladder: Ladder) -> Steps[Decisions]:
        """These decisions plus what ``ladder`` decided (stats and floor unchanged), as
        steps (``slices.py``). The merged decisions have no notice: the decision that
        commits them makes its own (``RequestPolicy.noticing``)."""
        # a message of thinking alone, its thinking left out, leaves the view
        emptied = {seq for seq, (form, _, _) in ladder.thoughtless.items() if form is None}
        removed = self.removed | ladder.removed | emptied
        truncated = (self.truncated | ladder.truncated) - removed
        stubbed = (self.stubbed | ladder.stubbed) - removed
        thoughtless = {
            seq: omitted for seq, omitted in self.thoughtless.items() if seq not in ladder.removed
        }
        thoughtless.update((seq, omitted) for seq, (_, _, omitted) in ladder.thoughtless.items())
        yield
        overrides: dict[int, dict[str, Any]] = {}
        override_tokens: dict[int, int] = {}

        def keep(entry: tuple[int, dict[str, Any]]) -> None:
            seq, message = entry
            if seq not in ladder.removed:
                overrides[seq] = message
                override_tokens[seq] = self.override_tokens[seq]

        def take(reduced: tuple[int, dict[str, Any], int]) -> None:
            seq, message, tokens = reduced
            overrides[seq] = message
            override_tokens[seq] = tokens

        yield from walking(self.overrides.items(), keep, stride=CHUNK)
        # (a form may be made here, tens of microseconds apiece: ``Ladder._form``)
        yield from walking(ladder.reduced_forms(), take, stride=HEAVY_STRIDE)
        for seq, (form, tokens, _) in ladder.thoughtless.items():
            if form is not None:
                overrides[seq] = form
                override_tokens[seq] = tokens
        return Decisions(
            removed=frozenset(removed),
            truncated=frozenset(truncated),
            stubbed=frozenset(stubbed),
            level=max(self.level, ladder.level),
            stats=self.stats,
            floor_reported=self.floor_reported,
            overrides=overrides,
            override_tokens=override_tokens,
            thoughtless=thoughtless,
        )
