"""What one request decided before it touched the view: an immutable snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .budget import LearnedLimit
from .decisions import Decisions
from .history import History

__all__ = ("RequestPlan",)


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """Everything one request decided before touching the view (an immutable snapshot)."""

    provenance: dict[str, Any]
    budget: int
    effective: int
    """The budget compaction works against: ``budget`` minus the notice reserve."""
    factory_text: str | None
    history: History
    """The history the request sees (its first ``length`` entries). Planning reads this
    object, never the store's current one: a plan paused between slices stays consistent
    even when ``set_messages`` or ``clear`` replaces the store's history meanwhile."""
    length: int
    """Number of history entries the request sees."""
    epoch: int
    version: tuple[int, int]
    """The store's (history epoch, commit version) when planned: a commit must match it."""
    decisions: Decisions
    protected: frozenset[int]
    retained: bool
    hard_fit: bool
    limit: LearnedLimit | None = None
    """The learned provider limit this request leaves for later ones (``budget.py``)."""
