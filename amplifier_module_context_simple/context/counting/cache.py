"""The provider's prompt cache, as far as the policy needs it: whether it has expired.

A provider keeps a request's prefix cached for a lifetime after its last use (Anthropic:
5 minutes by default, 1 hour as an option; OpenAI: 5 to 10 minutes); every hit refreshes
it. A request that follows the previous one by more than that writes its whole view
again, whatever the view is. So a compaction that will be due soon costs nothing extra
right after an idle gap, while the same compaction a few requests later, on a warm
cache, costs a whole rewrite (the idle-aware rule: ``Limits.reached_idle``, docs/design.md 7.6).

The clock is the store's (``ContextStore(clock=...)``, ``time.monotonic`` by default), in
seconds; a replay passes the transcript's own timestamps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ("CacheLife", "Clock")

Clock = Callable[[], float]
"""Seconds, never decreasing (``time.monotonic``)."""


@dataclass(slots=True)
class CacheLife:
    """When the last view was returned, and whether the cache outlived the gap since."""

    last: float | None = None
    """The clock's time when the latest view was returned (None: no view yet)."""

    def expired(self, now: float, lifetime: float) -> bool:
        """Whether a request made at ``now`` finds the previous view's cache gone, for a
        cache living ``lifetime`` seconds after its last use (the ``cache_lifetime`` key;
        0 disables the rule). Never for the first request (nothing was cached by this
        session)."""
        if lifetime <= 0 or self.last is None or not math.isfinite(now):
            return False
        return now - self.last > lifetime

    def returned(self, now: float) -> None:
        """A view was returned (and sent) at ``now``: the cache is fresh from here."""
        if math.isfinite(now):
            self.last = now

    def reset(self) -> None:
        self.last = None
