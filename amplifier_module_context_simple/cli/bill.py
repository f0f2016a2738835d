"""The bill: prices, the simulated prompt cache, and the keys views are compared by.

A view is compared with the previous request's view as ``(message key, tokens)`` pairs
(``keyed_view``): the leading messages they share are read from the cache, the last
message is fresh and everything between is a cache write (``cache_use``), priced by
``Prices``. The same keys tell a trim: a request that no longer sends a message the
previous one sent (``dropped_messages``).

The cache has a lifetime (``CacheLifetime``: 5 minutes, 1 hour or none, carried by
``Prices.lifetime``, which also picks the write price). With request times given, a
request made more than the lifetime after the previous one finds the cache cold
(``expired_requests``) and writes its whole view; every request refreshes the entry.
Without times nothing expires: the bill is the lifetime-free model's, whatever the
lifetime (only the 1-hour cache's write price differs).
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..context.counting.estimate import estimate_message

__all__ = (
    "CACHE_LIFETIMES",
    "DEFAULT_PRICES",
    "FIVE_MINUTES",
    "NO_EXPIRY",
    "ONE_HOUR",
    "CacheLifetime",
    "CacheUse",
    "Measure",
    "Prices",
    "cache_use",
    "dropped_messages",
    "expired_requests",
    "keyed_view",
    "message_key",
    "simulate_cache",
)


@dataclass(frozen=True, slots=True)
class CacheLifetime:
    """How long the provider keeps a cache entry after its last use (a read or a write)."""

    name: str
    """``"5m"``, ``"1h"`` or ``"none"`` (the ``--cache-ttl`` value)."""
    seconds: float | None
    """``None``: the entry never expires (the model without time)."""

    def expired(self, gap: float) -> bool:
        """Whether a request ``gap`` seconds after the previous one finds the cache cold."""
        return self.seconds is not None and gap > self.seconds

    @property
    def module_seconds(self) -> float:
        """The module's ``cache_lifetime`` for this lifetime: its seconds, or 0 (the
        idle-aware rule off) for a cache that never expires."""
        return 0.0 if self.seconds is None else self.seconds


FIVE_MINUTES: Final = CacheLifetime("5m", 300.0)
"""Anthropic's default ephemeral cache (writes at 1.25 x the base input price)."""
ONE_HOUR: Final = CacheLifetime("1h", 3600.0)
"""Anthropic's 1-hour cache (writes at 2 x the base input price)."""
NO_EXPIRY: Final = CacheLifetime("none", None)
"""No expiry: the bill of the model without time, whatever the request times."""
CACHE_LIFETIMES: Final = {
    lifetime.name: lifetime for lifetime in (FIVE_MINUTES, ONE_HOUR, NO_EXPIRY)
}


@dataclass(frozen=True, slots=True)
class Prices:
    """Price of one input token relative to a fresh one: fresh, cache read, cache write -
    the write at ``cache_write`` to the 5-minute cache (and to one without expiry), at
    ``cache_write_1h`` to the 1-hour cache - and the cache's lifetime, which picks the
    write price (``write_price``) and, given request times, when the cache expires."""

    fresh: float = 1.0
    cache_read: float = 0.1
    cache_write: float = 1.25
    """A token written to the 5-minute cache, or to a cache without expiry."""
    cache_write_1h: float = 2.0
    """A token written to the 1-hour cache (Anthropic: 2 x the base input price)."""
    lifetime: CacheLifetime = FIVE_MINUTES

    @property
    def write_price(self) -> float:
        """The price of a cache write under ``lifetime``."""
        return self.cache_write_1h if self.lifetime == ONE_HOUR else self.cache_write

    def billed(self, fresh: int, cache_read: int, cache_write: int) -> float:
        """The billed-input equivalent (in fresh-token units) of these figures."""
        return fresh * self.fresh + cache_read * self.cache_read + cache_write * self.write_price

    def describe(self) -> str:
        other = f" (the 1h cache's; 5m: {self.cache_write:g})" if self.lifetime == ONE_HOUR else ""
        return (
            f"fresh {self.fresh:g}, cache read {self.cache_read:g}, "
            f"cache write {self.write_price:g}{other} (x a fresh input token); "
            f"cache lifetime {self.lifetime.name}"
        )

    def as_dict(self) -> dict[str, Any]:
        """The prices a bill applies, as the JSON report gives them: ``cache_write`` is
        ``write_price``, the lifetime's (the report gives the lifetime apart)."""
        return {
            "fresh": self.fresh,
            "cache_read": self.cache_read,
            "cache_write": self.write_price,
        }


DEFAULT_PRICES: Final = Prices()


@dataclass(frozen=True, slots=True)
class CacheUse:
    """One request through the simulated prompt cache (all in view tokens).

    ``total == cache_read + cache_write + fresh``.
    """

    total: int
    cache_read: int
    cache_write: int
    fresh: int
    shared_messages: int
    """Leading messages shared with the previous request's view: read from the cache
    unless it had expired (a property of the two views, whatever the time between them,
    so the prefix breaks counted from it are the policy's)."""
    expired: bool = False
    """The request came more than the cache's lifetime after the previous one: the cache
    was cold, and the shared messages were written again instead of read."""


def cache_use(
    previous: Sequence[tuple[str, int]] | None,
    current: Sequence[tuple[str, int]],
    *,
    expired: bool = False,
) -> CacheUse:
    """The cache figures of a view, given the previous request's view.

    Views are ``(message key, tokens)`` pairs. The common prefix (compared message by
    message) is read from the cache; of the rest, the last message - the new input - is
    fresh and everything before it is written to the cache (the model of the demo's
    ``provider-window``, without its request framing). ``expired``: the cache is cold,
    nothing is read - the view is billed as a first request's - though
    ``shared_messages`` still says what the two views share.
    """
    shared = 0
    for before, now in zip(previous or (), current, strict=False):
        if before[0] != now[0]:
            break
        shared += 1
    warm = 0 if expired else shared
    tokens = [count for _, count in current]
    read = sum(tokens[:warm])
    fresh = tokens[-1] if warm < len(tokens) else 0
    write = sum(tokens[warm:-1]) if warm < len(tokens) else 0
    return CacheUse(sum(tokens), read, write, fresh, shared, expired)


def expired_requests(
    times: Sequence[float] | None, lifetime: CacheLifetime = FIVE_MINUTES
) -> list[bool]:
    """Per request, whether it finds the cache cold: it follows the previous request by
    more than ``lifetime`` (``times``: each request's time, in seconds). Every request,
    a hit or a write, refreshes the entry, so only the gap to the previous one counts;
    the first request has no cache to find. Without ``times``, an empty list: nothing
    expires.

    Raises:
        ValueError: a time earlier than the one before it.
    """
    if times is None:
        return []
    expired = [False] * len(times)
    for number in range(1, len(times)):
        gap = times[number] - times[number - 1]
        if gap < 0:
            raise ValueError(f"request {number + 1} is earlier than request {number}")
        expired[number] = lifetime.expired(gap)
    return expired


def simulate_cache(
    views: Sequence[Sequence[tuple[str, int]]],
    *,
    times: Sequence[float] | None = None,
    lifetime: CacheLifetime = FIVE_MINUTES,
) -> list[CacheUse]:
    """``cache_use`` of each view against the one before it (the first has no cache);
    with ``times`` (one per view, in seconds), a view made more than ``lifetime`` after
    the one before it finds the cache cold (``expired_requests``).

    Raises:
        ValueError: ``times`` does not hold one time per view, or goes back in time.
    """
    if times is not None and len(times) != len(views):
        raise ValueError(f"{len(times)} request times for {len(views)} views")
    cold = expired_requests(times, lifetime)
    uses: list[CacheUse] = []
    previous: Sequence[tuple[str, int]] | None = None
    for number, view in enumerate(views):
        uses.append(cache_use(previous, view, expired=bool(cold) and cold[number]))
        previous = view
    return uses


def message_key(message: Mapping[str, Any]) -> str:
    """A digest of what a provider sees of ``message`` (``metadata`` is not sent)."""
    visible = {k: v for k, v in message.items() if k != "metadata"}
    text = json.dumps(visible, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


Measure = Callable[[Mapping[str, Any]], int]
"""Counts one message's tokens: the module's ``estimate_message`` by default; a benchmark
passes an independent tokenizer's count instead (it must not mutate the message)."""


def keyed_view(
    view: Sequence[Mapping[str, Any]], measure: Measure = estimate_message
) -> list[tuple[str, int]]:
    """``view`` as the ``(message_key, tokens)`` pairs ``cache_use`` compares, each
    message's tokens counted by ``measure``."""
    return [(message_key(m), measure(m)) for m in view]


def dropped_messages(
    previous: Sequence[tuple[str, int]] | None, current: Sequence[tuple[str, int]]
) -> int:
    """How many messages of the previous keyed view the current one no longer sends.

    Messages are compared by ``message_key`` (what the provider sees), counted with
    multiplicity: a message sent twice before and once now counts one. A request with a
    positive count is a *trim*: it left out something it had sent. (A dropped message
    whose exact copy arrives in the same request is not seen; a rewritten one is.)
    """
    if previous is None:
        return 0
    before = collections.Counter(key for key, _ in previous)
    before.subtract(key for key, _ in current)
    return sum(count for count in before.values() if count > 0)
